"""Calendar quotas (N/month, N/year): windows on the calendar of QUOTA_TIMEZONE, from
QUOTA_BILLING_DAY, the same on memory and on a real Redis (server clock included)."""

from __future__ import annotations

import calendar as pycal
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

import pytest
import redis
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_quota import Identity, Plan, Quota, QuotaExceeded
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.calendar import MONTH, YEAR, Calendar
from flask_quota.core.checks import Check
from flask_quota.core.enforcer import Enforcer
from flask_quota.core.facts import Facts
from flask_quota.core.keys import KeyBuilder, remote_ip_tag
from flask_quota.core.policy import Policy
from flask_quota.core.rates import parse_rate, parse_rates
from flask_quota.core.reply import Reply
from flask_quota.core.validators import rate_text
from flask_quota.settings import FailMode, Settings
from flask_quota.sql.snapshot import SqlCatalog
from flask_quota.storage import MemoryStorage, Storage, wall_clock_us
from flask_quota.storage.breaker import CircuitBreaker
from flask_quota.storage.cluster import ClusterStorage
from flask_quota.storage.failover import GuardedStorage
from flask_quota.storage.redis import SCRIPT, RedisStorage, check_args
from flask_quota.testing import FrozenClock, test_storage
from tests.redis_probes import CountingConnection, counting_client

US = 1_000_000


def _us(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


ZONES = sorted(available_timezones() - {"Factory", "localtime"})
# 1971..2090, across many DST rule changes; as datetimes, so hypothesis spreads them over
# the years rather than near one end of a range of integers.
INSTANTS = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2090, 1, 1)).map(
    lambda moment: _us(moment.replace(tzinfo=UTC))
)
# Zones whose clocks change at midnight, at the billing day: the window must start at the
# first instant of that local day (Havana's 00:00 happens twice on 2026-11-01, Santiago
# skips it on 2026-09-06, Samoa skipped all of 2011-12-30).
MIDNIGHT_CHANGES = [
    (datetime(2026, 11, 20, tzinfo=UTC), "America/Havana", 1),
    (datetime(2026, 11, 1, 4, 30, tzinfo=UTC), "America/Havana", 1),
    (datetime(2026, 9, 20, tzinfo=UTC), "America/Santiago", 6),
    (datetime(2026, 4, 20, tzinfo=UTC), "America/Santiago", 5),
    (datetime(2012, 1, 5, tzinfo=UTC), "Pacific/Apia", 30),
    (datetime(2011, 12, 30, 10, tzinfo=UTC), "Pacific/Apia", 30),
]


def _local_date(zone: ZoneInfo, at_us: int) -> date:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=at_us)
    return moment.astimezone(zone).date()


def _billing_date(year: int, month: int, day: int) -> date:
    return date(year, month, min(day, pycal.monthrange(year, month)[1]))


def _expected_dates(local: date, unit: str, day: int) -> tuple[date, date]:
    """The oracle: the local dates the window around ``local`` starts and ends on."""
    if unit == YEAR:
        return date(local.year, 1, 1), date(local.year + 1, 1, 1)
    index = local.year * 12 + local.month - 1
    if local < _billing_date(local.year, local.month, day):
        index -= 1
    year, month = divmod(index, 12)
    next_year, next_month = divmod(index + 1, 12)
    return _billing_date(year, month + 1, day), _billing_date(next_year, next_month + 1, day)


def _first_instant_of(zone: ZoneInfo, at_us: int, day: date) -> bool:
    """``at_us`` is the first instant whose local date is ``day`` or later."""
    return _local_date(zone, at_us) >= day > _local_date(zone, at_us - 1)


@settings(max_examples=400, deadline=None)
@given(
    now=INSTANTS,
    zone=st.sampled_from(ZONES),
    day=st.integers(min_value=1, max_value=31),
    unit=st.sampled_from([MONTH, YEAR]),
)
def test_windows_match_a_zoneinfo_oracle(now: int, zone: str, day: int, unit: str) -> None:
    """Over random instants, zones and billing days, the window holds the instant, starts
    at the first instant of its (clamped) billing date and ends at the next one's, as
    ``datetime.astimezone`` reads those instants: DST changes and leap years included."""
    _check_window(now, zone, day, unit)


@pytest.mark.parametrize(("moment", "zone", "day"), MIDNIGHT_CHANGES)
def test_windows_where_midnight_is_skipped_or_doubled(
    moment: datetime, zone: str, day: int
) -> None:
    """The oracle's rule where a DST change falls on the billing day's midnight."""
    _check_window(_us(moment), zone, day, MONTH)


def _check_window(now: int, zone: str, day: int, unit: str) -> None:
    """The oracle: only ``astimezone`` reads, forwards, of the instants the calendar gave."""
    calendar = Calendar(zone, day)
    tz = ZoneInfo(zone)
    prev, start, end, after = calendar.bounds(unit, now)
    assert prev < start <= now < end < after
    first, last = _expected_dates(_local_date(tz, now), unit, day)
    assert _first_instant_of(tz, start, first)
    assert _first_instant_of(tz, end, last)
    # The neighbours the script may pick from are the windows just before and after.
    assert calendar.bounds(unit, start - 1)[1:3] == (prev, start)
    assert calendar.bounds(unit, end)[1:3] == (end, after)


def test_known_boundaries_across_dst_and_leap_years() -> None:
    """Hand-checked edges: Berlin's months on the 15th around the March DST change, a
    31st clamped to February 29 in a leap year, and New York's year."""
    berlin = Calendar("Europe/Berlin", 15)
    start, end = berlin.span(MONTH, _us(datetime(2026, 3, 20, 12, tzinfo=UTC)))
    assert start == _us(datetime(2026, 3, 14, 23, tzinfo=UTC))  # CET, UTC+1
    assert end == _us(datetime(2026, 4, 14, 22, tzinfo=UTC))  # CEST, UTC+2
    last = Calendar("UTC", 31)
    start, end = last.span(MONTH, _us(datetime(2028, 3, 1, tzinfo=UTC)))
    assert start == _us(datetime(2028, 2, 29, tzinfo=UTC))
    assert end == _us(datetime(2028, 3, 31, tzinfo=UTC))
    york = Calendar("America/New_York", 10)  # billing day: months only
    start, end = york.span(YEAR, _us(datetime(2028, 6, 1, tzinfo=UTC)))
    assert start == _us(datetime(2028, 1, 1, 5, tzinfo=UTC))
    assert end == _us(datetime(2029, 1, 1, 5, tzinfo=UTC))


def test_calendar_rates_parse_and_print() -> None:
    """``N/month`` and ``N/year`` parse (also ``per``), print back, and are refused with a
    burst or a multiple; ``31 days`` stays a plain rolling-free epoch window."""
    assert str(parse_rate("3 per month")) == "3/month"
    assert parse_rate("5/year").calendar == YEAR
    assert parse_rate("100/31 days").calendar is None
    assert str(parse_rates("10/day, 1000/month")) == "10/day, 1000/month"
    with pytest.raises(ValueError, match="takes no burst"):
        parse_rate("3/month; burst=5")
    with pytest.raises(ValueError, match="one month, not several"):
        parse_rate("3/2 months")
    # Plan parses a rate given as text (its __post_init__); its fields are typed as Rates.
    plan = Plan("p", user_rate="2000000/month")  # type: ignore[arg-type]
    assert str(plan.user_rate) == "2000000/month"
    assert rate_text("3 per month") == "3/month"  # what the CLI and the dashboard store


def test_a_calendar_rate_is_a_fixed_window_under_any_algorithm() -> None:
    """Plans with large calendar quotas load under every QUOTA_ALGORITHM (a sliding log's
    cap does not apply), and their checks are calendar windows on QUOTA_TIMEZONE."""
    for algorithm in Algorithm:
        settings = Settings.from_config({
            "QUOTA_ALGORITHM": algorithm.value,
            "QUOTA_TIMEZONE": "Asia/Kolkata",
            "QUOTA_PLANS": {"free": {"user": "10/second, 2000000/month"}},
        })  # fmt: skip
        policy = Policy(KeyBuilder("q"), algorithm, calendar=settings.calendar)
        tiers = policy.checks(
            settings.plans["free"], ip_tag="i", identity_tag="u", method="GET",
            spec=None, resource=None, cost=1,
        )  # fmt: skip
        second, month = (t.check for t in tiers)
        assert (second.algorithm, second.calendar) == (algorithm, None)
        assert month.algorithm is Algorithm.FIXED_WINDOW
        assert month.calendar == Calendar("Asia/Kolkata", 1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"QUOTA_TIMEZONE": "Mars/Olympus"}, "QUOTA_TIMEZONE: unknown time zone 'Mars/Olympus'"),
        ({"QUOTA_TIMEZONE": ""}, "QUOTA_TIMEZONE must be an IANA time zone"),
        ({"QUOTA_BILLING_DAY": 32}, "QUOTA_BILLING_DAY=32 must be a day of the month"),
        ({"QUOTA_BILLING_DAY": "0"}, "QUOTA_BILLING_DAY=0 must be a day of the month"),
        ({"QUOTA_BLOCK_AFTER": "20/month"}, "QUOTA_BLOCK_AFTER='20/month': denials are counted"),
    ],
)
def test_bad_calendar_settings_name_the_key(config: dict[str, Any], message: str) -> None:
    """A bad zone or billing day fails at start with the key and the fix."""
    with pytest.raises(ValueError, match=message):
        Settings.from_config(config)


def test_calendar_settings_from_the_environment() -> None:
    """Strings (as from environment variables) are read: a day as digits."""
    settings = Settings.from_config({"QUOTA_TIMEZONE": "Asia/Tokyo", "QUOTA_BILLING_DAY": "15"})
    assert settings.calendar == Calendar("Asia/Tokyo", 15)


# -- the must-show, on every storage ------------------------------------------------

MARCH_20 = _us(datetime(2026, 3, 20, 12, tzinfo=UTC))
APRIL_BOUNDARY = _us(datetime(2026, 4, 14, 22, tzinfo=UTC))


def _storage_url(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        redis.Redis(port=server.port).flushall()
        return f"redis://127.0.0.1:{server.port}/0"
    cluster = request.getfixturevalue("cluster")
    cluster.wait_healthy()
    client = cluster.client()
    try:
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    finally:
        client.close()
    return str(cluster.url)


def _monthly_app(tmp_path: Path, url: str, clock: FrozenClock) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config.update(
        QUOTA_TIMEZONE="Europe/Berlin",
        QUOTA_BILLING_DAY=15,
        QUOTA_PLANS={"free": {"user": "3/month"}},
    )
    quota = Quota(app, storage=test_storage(url, clock))

    @app.get("/report")
    def report() -> str:
        return "ok"

    assert quota is not None
    return app


@pytest.mark.parametrize(
    "kind",
    ["memory", pytest.param("redis", marks=pytest.mark.redis),
     pytest.param("cluster", marks=[pytest.mark.redis, pytest.mark.slow])],
)  # fmt: skip
def test_three_a_month_in_berlin_from_the_15th(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """3/month, Europe/Berlin, billing day 15, on 2026-03-20 12:00 UTC: 200 200 200 429;
    Retry-After, X-RateLimit-Reset and RateLimit point at 2026-04-15 00:00 Berlin
    (22:00 UTC: summer time began in between); just before it still 429, just after 200."""
    clock = FrozenClock(MARCH_20 / US)
    http = _monthly_app(tmp_path, _storage_url(kind, request), clock).test_client()
    statuses = [http.get("/report").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    denied = http.get("/report")
    wait = (APRIL_BOUNDARY - MARCH_20) // US
    assert denied.headers["Retry-After"] == str(wait)
    assert denied.headers["X-RateLimit-Reset"] == str(APRIL_BOUNDARY // US)
    assert denied.headers["RateLimit"] == f'"user";r=0;t={wait}'
    assert denied.headers["RateLimit-Policy"] == f'"user";q=3;w={31 * 86400}'
    body = denied.get_json()
    assert body["window"] == 31 * 86400
    assert body["retry_after"] == wait
    assert "3 requests per month" in body["detail"]
    clock.now_us = APRIL_BOUNDARY - 1
    assert http.get("/report").status_code == 429
    clock.now_us = APRIL_BOUNDARY
    allowed = http.get("/report")
    assert allowed.status_code == 200
    assert allowed.headers["X-RateLimit-Remaining"] == "2"
    # The next window is April 15 to May 15 (both CEST).
    assert allowed.headers["X-RateLimit-Reset"] == str(
        _us(datetime(2026, 5, 14, 22, tzinfo=UTC)) // US
    )


# -- memory and Redis agree; Redis picks the window by its own clock -----------------


@pytest.mark.redis
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    now=INSTANTS,
    zone=st.sampled_from(ZONES),
    day=st.integers(min_value=1, max_value=31),
    unit=st.sampled_from([MONTH, YEAR]),
    skew=st.integers(min_value=-20 * 86400, max_value=20 * 86400).map(lambda s: s * US + 7),
    cost=st.integers(min_value=0, max_value=4),
)
def test_redis_script_agrees_with_memory(
    redis_client: redis.Redis, now: int, zone: str, day: int, unit: str, skew: int, cost: int
) -> None:
    """The script, handed the edges around a client clock up to 20 days off, decides on
    its own ``now`` exactly as memory does: same outcome, remaining, reset and retry."""
    calendar = Calendar(zone, day)
    check = Check("cal", Algorithm.FIXED_WINDOW, parse_rate(f"3/{unit}"), cost, False, calendar)
    memory = MemoryStorage(lambda: now)
    script = redis_client.register_script(SCRIPT)
    redis_client.delete("cal")
    for _ in range(3):
        expected = list(memory.decide_flat((check,), ["cal"]))
        args: list[str | int] = [*check_args(check, now + skew), "decide", now]
        got = list(Reply.read([int(v) for v in script(keys=["cal"], args=args)], 1))
        assert got == expected


@pytest.mark.redis
def test_production_redis_uses_server_time_for_the_window(redis_client: redis.Redis) -> None:
    """With no test clock, the window is the one Redis TIME falls in, even when the edges
    were computed around a client clock 10 days off: the reply's reset is that window's end."""
    calendar = Calendar("Pacific/Auckland", 28)
    check = Check("cal", Algorithm.FIXED_WINDOW, parse_rate("5/month"), 1, False, calendar)
    seconds, micros = redis_client.time()
    server_now = seconds * US + micros
    script = redis_client.register_script(SCRIPT)
    for skew in (-10 * 86400 * US, 0, 10 * 86400 * US):
        redis_client.delete("cal")
        reply = script(keys=["cal"], args=check_args(check, server_now + skew))
        assert Reply.read(reply, 1).reset_us(0) == calendar.span(MONTH, server_now)[1]
    storage = RedisStorage(redis_client)  # the request path: its own edges, Redis TIME
    verdict = storage.decide([check])
    assert verdict.outcomes[0].reset_us == calendar.span(MONTH, verdict.now_us)[1]


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_refund_and_charge_follow_the_calendar(kind: str, request: pytest.FixtureRequest) -> None:
    """A refund of a calendar charge (``charge_when``) gives it back in its own window;
    ``quota.charge`` counts in the current one, with a TTL to its end."""
    clock = FrozenClock(MARCH_20 / US)
    storage = test_storage(_storage_url(kind, request), clock)
    check = Check(
        "cal", Algorithm.FIXED_WINDOW, parse_rate("3/month"), 1, False,
        Calendar("Europe/Berlin", 15),
    )  # fmt: skip
    look = Check(**{**_fields(check), "cost": 0})
    verdict = storage.decide([check])
    assert verdict.outcomes[0].remaining == 2
    storage.refund([check], verdict.now_us)
    assert storage.peek([look]).outcomes[0].remaining == 3
    storage.charge([Check(**{**_fields(check), "cost": 5})])  # past the limit: debt
    assert storage.peek([look]).outcomes[0].remaining == -2
    clock.now_us = APRIL_BOUNDARY - 1
    assert storage.peek([look]).outcomes[0].remaining == -2
    clock.now_us = APRIL_BOUNDARY
    assert storage.peek([look]).outcomes[0].remaining == 3  # a new month
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        assert redis.Redis(port=server.port).pttl("cal") > 0


def _fields(check: Check) -> dict[str, Any]:
    return {name: getattr(check, name) for name in Check.__dataclass_fields__}


# -- the per-caller billing day hook ------------------------------------------------


def _enforcer(clock: FrozenClock) -> Enforcer:
    plan = Plan("free", user_rate=parse_rates("1/month"))
    return Enforcer(
        guard=GuardedStorage(MemoryStorage(clock), FailMode.OPEN, CircuitBreaker("memory")),
        policy=Policy(KeyBuilder("quota"), Algorithm.TOKEN_BUCKET, calendar=Calendar("UTC", 1)),
        catalog=lambda: SqlCatalog([plan], billing_days={"a": 25}),
        anonymous_plan="free",
        default_plan="free",
    )


def test_a_callers_own_billing_day_wins() -> None:
    """A client's own billing day (``PlanCatalog.billing_day``, from its SQL record) moves
    that caller's month; without one QUOTA_BILLING_DAY applies."""
    clock = FrozenClock(_us(datetime(2026, 3, 20, tzinfo=UTC)) / US)
    enforcer = _enforcer(clock)
    ip = remote_ip_tag("203.0.113.9")

    def ask(who: str, day: int | None) -> Callable[[], Any]:
        # ``day``: what the catalog holds for ``who`` (read there, not passed).
        return lambda: enforcer.decide(Facts("GET", "x", ip, Identity(who)))

    own = ask("a", 25)()
    assert own is not None
    assert own.decision().results[0].outcome.reset_us == _us(datetime(2026, 3, 25, tzinfo=UTC))
    default = ask("b", None)()
    assert default is not None
    assert default.decision().results[0].outcome.reset_us == _us(datetime(2026, 4, 1, tzinfo=UTC))
    with pytest.raises(QuotaExceeded) as denied:
        ask("a", 25)()
    assert str(denied.value.decision).startswith("denied by user: 1 per month on plan 'free'")
    clock.now_us = _us(datetime(2026, 3, 25, tzinfo=UTC))
    assert ask("a", 25)() is not None  # its month turned; b's has not
    with pytest.raises(QuotaExceeded):
        ask("b", None)()


# -- one round trip per request -----------------------------------------------------


@pytest.mark.redis
def test_a_calendar_quota_costs_one_round_trip(redis_server: Any, tmp_path: Path) -> None:
    """With a N/month resource beside the user tier, on the Redis server clock, each
    request is still one round trip, allowed or denied."""
    client = counting_client(redis_server)
    client.flushall()
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config.update(
        QUOTA_TIMEZONE="America/Sao_Paulo",
        QUOTA_BILLING_DAY=31,
        QUOTA_PLANS={"free": {"user": "100/minute", "resources": {"ai": "3/month"}}},
    )
    quota = Quota(app, storage=RedisStorage(client))

    @app.post("/infer")
    @quota.limit(resource="ai")
    def infer() -> str:
        return "ok"

    http = app.test_client()
    http.post("/infer")  # warm the connection and the script cache
    statuses = []
    for _ in range(4):
        before = CountingConnection.sent
        statuses.append(http.post("/infer").status_code)
        assert CountingConnection.sent - before == 1
    assert statuses == [200, 200, 429, 429]


def _skewed_app(tmp_path: Path, url: str, name: str, days: int) -> Flask:
    """A server on one shared Redis (or Cluster) whose own clock is ``days`` off (Redis
    TIME decides); ``/report`` charges 1 and then ``quota.charge(1)`` (a charge script)."""
    app = Flask(name, instance_path=str(tmp_path / name))
    app.config.update(
        QUOTA_PLANS={"free": {"user": "10/month", "resources": {"report": "10/month"}}},
        QUOTA_DATABASE_URL="sqlite://",
    )
    off = days * 86400 * US
    skewed = {"host_clock": lambda: wall_clock_us() + off}
    if url.startswith("redis+cluster"):
        storage: Storage = ClusterStorage.from_url(url, timeout=5, **skewed)
    else:
        storage = RedisStorage(redis.Redis.from_url(url), **skewed)
    quota = Quota(app, storage=storage)

    @app.get("/report")
    @quota.limit(resource="report")
    def report() -> str:
        quota.charge(1)
        return "ok"

    return app


@pytest.mark.redis
@pytest.mark.parametrize(
    ("kind", "days"),
    [("redis", 62), ("redis", -40), ("redis", 400),
     pytest.param("cluster", 62, marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_server_whose_clock_is_far_off_counts_in_the_storages_month(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, days: int
) -> None:
    """Found in review: two servers sharing Redis, one clock off by +62, -40 or +400 days:
    a 5/month quota admitted 20 of 20. The edges a server sends were around its own
    clock and the script picked among them even when Redis TIME was outside them all.
    Now a script whose clock is outside the edges refuses them and says its time; the
    server moves its calendar to the storage's clock and asks again (one more round
    trip, once)."""
    url = _storage_url(kind, request)
    right = _skewed_app(tmp_path, url, "right", 0).test_client()
    wrong = _skewed_app(tmp_path, url, "wrong", days).test_client()
    statuses = [(right, wrong)[i % 2].get("/report").status_code for i in range(20)]
    # Each admitted request takes 1 + 1 (its charge) of the report's 10: five fit.
    assert statuses.count(200) == 5, statuses
    again = wrong.get("/report")
    assert again.status_code == 429
    now = int(wall_clock_us())
    end = Calendar().span(MONTH, now)[1]
    assert int(again.headers["X-RateLimit-Reset"]) == -(-end // US)  # the storage's month
