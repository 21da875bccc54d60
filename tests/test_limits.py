"""The edges of what a rate and a cost may be, decided alike on memory and on Redis.

Redis runs the algorithms in Lua, whose numbers are doubles: integers are exact
only below 2^53. Rates are capped at parse time so that every time the scripts
compute stays far below it; the largest accepted rates must still decide to the
microsecond, identically on both backends. A request costing more than a limit
can ever hold is denied with the same finite answer everywhere.
"""

from __future__ import annotations

from fractions import Fraction
from importlib import resources
from math import ceil

import pytest
from flask import Flask
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flask_quota import Quota
from flask_quota.core.algorithms import Algorithm, Outcome
from flask_quota.core.errors import QuotaExceeded
from flask_quota.core.policy import Decision, TierResult
from flask_quota.core.rates import MAX_LIMIT, MAX_WINDOW, Rate, parse_rate
from flask_quota.core.tiers import Tier
from flask_quota.storage import Check, MemoryStorage, Storage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock
from tests.backends import ALIGNED, backend
from tests.servers import RedisServer

__all__ = ["backend"]

S = 1_000_000
Backend = tuple[Storage, FrozenClock]
YEAR = f"{MAX_WINDOW // 86400} days"  # the longest window
HUGE_COST = 10**30


def hit(storage: Storage, algorithm: Algorithm, rate: str | Rate, cost: int = 1) -> Outcome:
    return storage.decide([Check("k", algorithm, parse_rate(rate), cost)]).outcomes[0]


# -- caps at parse time -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cap"),
    [
        ("5/999999999 days", "366 days"),
        ("1/367 days", "366 days"),
        ("1/31622401 seconds", "366 days"),
        ("1000000000001/366 days", "1000000000000"),
        ("9999999999999999/day", "1000000000000"),
        ("1/day; burst=367", "366 days"),  # a full bucket would take 367 days to refill
        ("10/second; burst=9999999999999", "1000000000000"),
    ],
)
def test_rates_beyond_the_caps_are_refused_naming_the_cap(text: str, cap: str) -> None:
    """Windows over 366 days, limits or bursts over 10^12, and buckets that take longer
    than 366 days to refill are refused at parse time, naming the text and the cap."""
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    message = str(info.value)
    assert repr(text) in message and cap in message, message


@pytest.mark.parametrize(
    "text", [f"1/{YEAR}", f"{MAX_LIMIT}/{YEAR}", "1/second; burst=31622400", "86400000000/day"]
)
def test_rates_at_the_caps_are_accepted(text: str) -> None:
    """The caps themselves are allowed, and print as a rate that parses again."""
    rate = parse_rate(text)
    assert parse_rate(str(rate)) == rate


# -- the largest rates decide exactly, on both backends ------------------------------


def test_token_bucket_over_the_longest_window(backend: Backend) -> None:
    """3 per 366 days: three pass, the fourth waits exactly a third of the window."""
    storage, clock = backend
    window = MAX_WINDOW * S
    t0 = clock.now_us
    assert [hit(storage, Algorithm.TOKEN_BUCKET, f"3/{YEAR}").remaining for _ in range(3)] == [
        2,
        1,
        0,
    ]
    assert hit(storage, Algorithm.TOKEN_BUCKET, f"3/{YEAR}") == Outcome(
        False, 3, 0, t0 + window, window // 3
    )
    clock.advance(window // 3 / S)
    assert hit(storage, Algorithm.TOKEN_BUCKET, f"3/{YEAR}").allowed


def test_token_bucket_with_the_largest_burst(backend: Backend) -> None:
    """'1/second; burst=31622400' (a year to refill): the whole bucket passes at once,
    and then one more unit waits exactly one second."""
    storage, clock = backend
    rate = "1/second; burst=31622400"
    t0 = clock.now_us
    full = hit(storage, Algorithm.TOKEN_BUCKET, rate, cost=31_622_400)
    assert full == Outcome(True, 31_622_400, 0, t0 + MAX_WINDOW * S, 0)
    assert hit(storage, Algorithm.TOKEN_BUCKET, rate).retry_after_us == S
    clock.advance(1)
    assert hit(storage, Algorithm.TOKEN_BUCKET, rate).allowed


@pytest.mark.parametrize("algorithm", [Algorithm.FIXED_WINDOW, Algorithm.SLIDING_WINDOW_COUNTER])
def test_largest_limit_over_the_longest_window_counts_exactly(
    backend: Backend, algorithm: Algorithm
) -> None:
    """10^12 per 366 days: the whole limit passes in one request, then nothing."""
    storage, clock = backend
    clock.now_us -= clock.now_us % (MAX_WINDOW * S)  # the start of a window
    rate = f"{MAX_LIMIT}/{YEAR}"
    assert hit(storage, algorithm, rate, cost=MAX_LIMIT - 1).remaining == 1
    assert hit(storage, algorithm, rate).remaining == 0
    denied = hit(storage, algorithm, rate)
    assert not denied.allowed and denied.remaining == 0


def weighted(prev: int, window: int, elapsed: int) -> int:
    """The previous window's count, weighted by what is left of it, rounded up: exact."""
    return ceil(Fraction(prev * (window - elapsed), window))


# Where a double-rounded prev x (window - elapsed) / window lands on the wrong side of
# an integer (found by search): the old float arithmetic of Lua and Python disagreed there.
ODD_ELAPSED = 7_772_844_354_527


@pytest.mark.parametrize("elapsed", [1, ODD_ELAPSED, MAX_WINDOW * S // 2 + 1, MAX_WINDOW * S - 1])
def test_sliding_window_counter_is_exact_beyond_2_to_the_53(backend: Backend, elapsed: int) -> None:
    """10^12 per 366 days, a full previous window: prev x elapsed passes 2^53, yet the
    remaining count is the exact one, and exactly that many units still pass."""
    storage, clock = backend
    window = MAX_WINDOW * S
    rate = Rate(MAX_LIMIT, MAX_WINDOW)
    clock.now_us -= clock.now_us % window
    assert hit(storage, Algorithm.SLIDING_WINDOW_COUNTER, rate, cost=MAX_LIMIT).allowed
    clock.now_us += window + elapsed  # into the next window
    assert MAX_LIMIT * (window - elapsed) > 2**53 or elapsed > window // 2
    room = MAX_LIMIT - weighted(MAX_LIMIT, window, elapsed)
    peek = storage.peek([Check("k", Algorithm.SLIDING_WINDOW_COUNTER, rate, 0)])
    assert peek.outcomes[0].remaining == room
    assert not hit(storage, Algorithm.SLIDING_WINDOW_COUNTER, rate, cost=room + 1).allowed
    assert hit(storage, Algorithm.SLIDING_WINDOW_COUNTER, rate, cost=room).remaining == 0


def test_sliding_window_log_takes_a_large_cost(backend: Backend) -> None:
    """A cost of 20,000 units on a sliding log: stored, counted and denied alike (Redis
    cannot push that many list entries in one command from Lua)."""
    storage, _ = backend
    rate = "50000/hour"
    assert hit(storage, Algorithm.SLIDING_WINDOW_LOG, rate, cost=20_000).remaining == 30_000
    assert hit(storage, Algorithm.SLIDING_WINDOW_LOG, rate, cost=30_000).remaining == 0
    assert not hit(storage, Algorithm.SLIDING_WINDOW_LOG, rate).allowed


# -- a cost the limit can never hold -------------------------------------------------


@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("cost", [11, HUGE_COST])
def test_a_cost_above_the_capacity_waits_one_window(
    backend: Backend, algorithm: Algorithm, cost: int
) -> None:
    """10 per minute: a request costing 11 (or 10^30) never fits; it is denied with a
    Retry-After of one window, charging nothing, on both backends."""
    storage, _ = backend
    hit(storage, algorithm, "10/minute", cost=3)
    denied = hit(storage, algorithm, "10/minute", cost=cost)
    assert (denied.allowed, denied.limit, denied.remaining) == (False, 10, 7)
    assert denied.retry_after_us == 60 * S
    assert hit(storage, algorithm, "10/minute", cost=7).remaining == 0  # nothing was charged


def test_memory_and_redis_agree_on_costs_that_never_fit(redis_server: RedisServer) -> None:
    """Token bucket '2/second; burst=5', costs 6 and 10^30, at several fill levels: the
    verdicts of both backends are identical."""
    with redis_server.client() as client:
        client.flushall()
        clock = FrozenClock(ALIGNED)
        memory, remote = MemoryStorage(clock), RedisStorage(client, clock=clock)
        rate = parse_rate("2/second; burst=5")
        for cost in (2, 6, HUGE_COST, 3, 6, HUGE_COST, 1):
            checks = [Check("tb", Algorithm.TOKEN_BUCKET, rate, cost)]
            assert memory.decide(checks) == remote.decide(checks)
            clock.advance(0.3)


@pytest.mark.parametrize("storage_kind", ["memory", "redis"])
def test_a_request_that_can_never_pass_gets_a_sane_429(
    app: Flask, storage_kind: str, request: pytest.FixtureRequest
) -> None:
    """@quota.limit('10/minute') on a view whose cost is 25: 429 with Retry-After 60
    (one window) and the same problem body on memory and on Redis."""
    if storage_kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        with server.client() as client:
            client.flushall()
        app.config["QUOTA_STORAGE_URL"] = server.url
    app.config["QUOTA_PLANS"] = {"p": {"user": "1000/minute"}}
    app.config["QUOTA_DEFAULT_PLAN"] = app.config["QUOTA_ANONYMOUS_PLAN"] = "p"
    quota = Quota(app)

    @app.post("/export")
    @quota.limit("10/minute", cost=lambda: 25)
    def export() -> str:
        return "never"

    response = app.test_client().post("/export")
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "60"
    body = response.get_json(force=True)
    assert (body["retry_after"], body["limit"], body["remaining"]) == (60, 10, 10)


# -- the Lua twin's exact multiplication ---------------------------------------------

MULDIV = (
    resources.files("flask_quota.storage")
    .joinpath("lua", "sliding_window_counter.lua")
    .read_text("utf-8")
    + "\nreturn {muldiv(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))}"
)


@pytest.mark.redis
@settings(max_examples=300, deadline=None)
@given(
    a=st.one_of(st.integers(0, 2**45), st.integers(0, 2**20)),
    b=st.integers(0, MAX_WINDOW * S),
    c=st.integers(1, MAX_WINDOW * S),
)
def test_lua_muldiv_is_exact_past_2_to_the_53(
    redis_server: RedisServer, a: int, b: int, c: int
) -> None:
    """The sliding window counter's Lua ``muldiv(a, b, c)`` returns floor(a * b / c) and
    the remainder exactly, as Python's integers do, for every count and window the caps
    allow (and counts above the window, as a debt may leave)."""
    assume(a * b // c < 2**53)  # a result Lua can hold at all
    with redis_server.client() as client:
        assert client.eval(MULDIV, 0, a, b, c) == list(divmod(a * b, c))


def never_fitting_decision(storage: Storage, cost: int) -> Decision:
    """The endpoint tier '10/minute' (token bucket) asked for ``cost`` units."""
    check = Check("e", Algorithm.TOKEN_BUCKET, parse_rate("10/minute"), cost)
    verdict = storage.decide([check])
    (outcome,) = verdict.outcomes
    return Decision(
        "p", (TierResult(Tier.ENDPOINT, "export", check.rate, outcome),), verdict.now_us
    )


@pytest.mark.parametrize("cost", [11, HUGE_COST])
def test_the_429_explains_a_cost_that_can_never_pass(backend: Backend, cost: int) -> None:
    """QuotaExceeded for a cost above the capacity: the detail names the cost and the
    capacity and says it can never pass; Retry-After is one window, on both backends."""
    storage, _ = backend
    error = QuotaExceeded(never_fitting_decision(storage, cost), cost=cost)
    body = error.problem()
    assert body["detail"] == (
        f"Endpoint limit 'export': this request's cost {cost} exceeds the limit's "
        "capacity 10; it can never pass."
    )
    assert (error.retry_after, body["retry_after"]) == (60, 60)
    assert ("Retry-After", "60") in error.get_headers()
    assert never_fitting_decision(storage, 10).allowed  # the whole bucket still fits...
    ordinary = QuotaExceeded(never_fitting_decision(storage, 1), cost=1)  # ...and is spent
    assert ordinary.problem()["detail"] == (
        "Endpoint limit 'export' exceeded: 10 requests per 60 s on plan 'p'."
    )


def test_an_app_explains_a_cost_that_can_never_pass(app: Flask) -> None:
    """Through the app: a view costing 25 under '10/minute' answers the explaining 429."""
    quota = Quota(app)

    @app.post("/export")
    @quota.limit("10/minute", cost=lambda: 25)
    def export() -> str:
        return "never"

    body = app.test_client().post("/export").get_json(force=True)
    assert "this request's cost 25 exceeds the limit's capacity 10" in body["detail"]
