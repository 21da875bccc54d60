"""Per-limit algorithms and shadow mode, from the plan table to the response."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_quota import Quota, signals
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.clock import US
from flask_quota.core.plans import Limit, LimitMode, Plan, catalog_from_config, plans_config
from flask_quota.core.policy import Decision
from flask_quota.core.rates import parse_rate, parse_rates
from flask_quota.core.tiers import Tier
from flask_quota.dashboard.data import tier_totals
from flask_quota.storage import Check, Storage
from flask_quota.storage.denycache import DenyCache
from flask_quota.storage.usage import SHADOW_DENIED
from flask_quota.testing import FrozenClock, MemoryStorage, test_storage
from tests.dashboards import HASH, OPS
from tests.servers import RedisServer

PLANS = {"free": {"user": "100/minute", "resources": {"ai_inference": "50/minute"}}}


@pytest.fixture
def sql_app(tmp_path: Path) -> Iterator[tuple[Flask, FrozenClock]]:
    """A SQLite-backed app with an ``ai_inference`` view, on a frozen clock."""
    clock = FrozenClock(1_700_000_000.0 + 17.25)  # mid-minute: a window's reset is not "now + 60"
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True,
        QUOTA_PLANS=PLANS,
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'quota.sqlite3'}",
    )
    quota = app.config["TEST_QUOTA"] = Quota(app, storage=MemoryStorage(clock))

    @app.get("/ai")
    @quota.limit(resource="ai_inference")
    def ai() -> str:
        return "ok"

    yield app, clock
    app.extensions["quota"].sql.close()


def cli(app: Flask, *args: str) -> str:
    result = app.test_cli_runner().invoke(args=["quota", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_cli_algorithm_and_shadow_apply_to_requests(sql_app: tuple[Flask, FrozenClock]) -> None:
    """`plans set ... --algorithm fixed_window` and `... --shadow` reach the request path:
    5 x 200 then 429 with a reset on the minute boundary; the shadow user tier, which
    allows only 2, neither denies nor appears in the headers."""
    app, clock = sql_app
    cli(app, "plans", "set", "free", "endpoint", "5/minute", "--resource", "ai_inference",
        "--algorithm", "fixed_window")  # fmt: skip
    cli(app, "plans", "set", "free", "user", "2/minute", "--shadow")
    http = app.test_client()
    statuses = [http.get("/ai").status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]
    denied = http.get("/ai")
    reset = int(denied.headers["X-RateLimit-Reset"])
    assert reset % 60 == 0 and 0 < reset - clock.now_us / US <= 60
    assert denied.headers["X-RateLimit-Resource"] == "ai_inference"
    policy = denied.headers["RateLimit-Policy"]
    assert '"ai_inference";q=5;w=60' in policy and '"user"' not in policy
    with app.app_context():  # peek reads the fixed-window bucket the requests used
        buckets = {b.name: b for b in app.config["TEST_QUOTA"].peek(ip="127.0.0.1")}
    assert buckets["ai_inference (GET)"].remaining == 0
    listing = cli(app, "plans", "list")
    assert re.search(r"free\s+user\s+-\s+2/minute\s+\S+\s+shadow", listing)
    assert re.search(r"free\s+endpoint\s+ai_inference\s+5/minute\s+fixed_window\s+enforce", listing)


# -- plans: the QUOTA_PLANS shape -------------------------------------------------


def test_plans_accept_a_dict_per_limit() -> None:
    """A tier or resource may be a dict with rate, algorithm and shadow; a plain rate
    text stays enforced on QUOTA_ALGORITHM."""
    catalog = catalog_from_config(
        {
            "free": {
                "user": {"rate": "10/second, 1000/day", "shadow": True},
                "resources": {"search": {"rate": "5/minute", "algorithm": "fixed_window"}},
                "global": "50/second",
            }
        },
        upgrade_url="/pricing",
    )
    plan = catalog["free"]
    assert str(plan.user_rate) == "10/second, 1000/day"
    assert plan.mode_for(Tier.USER) == LimitMode(None, True)
    assert plan.mode_for(Tier.ENDPOINT, "search") == LimitMode(Algorithm.FIXED_WINDOW, False)
    assert plan.mode_for(Tier.GLOBAL) == LimitMode()
    assert plans_config([plan])["free"]["user"] == {"rate": "10/second, 1000/day", "shadow": True}


def test_a_plan_is_its_limits_keyed_by_tier_and_resource() -> None:
    """``Plan.limits()`` lists every limit (rates and mode) by tier and resource, and
    ``Plan.of`` builds the same plan back from them: one shape both ways, which
    ``QUOTA_PLANS`` parsing and ``plans export`` go through too."""
    config = {
        "free": {
            "global": "50/second",
            "user": {"rate": "10/second, 1000/day", "shadow": True},
            "resources": {
                "search": {"rate": "5/minute", "algorithm": "fixed_window"},
                "pdf": "2/minute",
            },
            "description": "Free tier",
            "upgrade": "Ask sales",
        }
    }
    plan = catalog_from_config(config, upgrade_url="/pricing")["free"]
    assert [(x.tier, x.resource, str(x.rates), x.mode) for x in plan.limits()] == [
        (Tier.GLOBAL, "", "50/second", LimitMode()),
        (Tier.USER, "", "10/second, 1000/day", LimitMode(None, True)),
        (Tier.ENDPOINT, "search", "5/minute", LimitMode(Algorithm.FIXED_WINDOW, False)),
        (Tier.ENDPOINT, "pdf", "2/minute", LimitMode()),
    ]
    again = Plan.of("free", plan.limits(), description="Free tier", upgrade="Ask sales")
    assert again == plan
    assert plans_config([again]) == config
    later = Limit(Tier.USER, "", parse_rates("1/second"))  # a later limit for a key wins
    changed = Plan.of("free", [*plan.limits(), later])
    assert str(changed.user_rate) == "1/second" and changed.mode_for(Tier.USER) == LimitMode()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"rate": "5/minute", "algorithm": "leaky"},
            "['resources']['search']['algorithm']='leaky'",
        ),
        ({"rate": "5/minute", "shadow": "yes"}, "['resources']['search']['shadow']='yes'"),
        ({"algorithm": "fixed_window"}, "['resources']['search'] needs a 'rate'"),
        ({"rate": "lots"}, "['resources']['search']['rate']: malformed rate 'lots'"),
        ({"rate": "5/minute", "burst": 3}, "['resources']['search'] has unknown fields"),
    ],
)
def test_bad_limit_entries_name_the_plan_and_field(entry: dict[str, Any], message: str) -> None:
    """A bad limit dict fails with a message naming QUOTA_PLANS, the plan and the field."""
    with pytest.raises(ValueError) as error:
        catalog_from_config({"free": {"resources": {"search": entry}}}, upgrade_url="/")
    assert f"QUOTA_PLANS['free']{message}" in str(error.value)


# -- shadow checks in each storage ---------------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[tuple[Storage, FrozenClock]]:
    """A memory storage, or a real Redis (flushed), on a frozen clock."""
    clock = FrozenClock()
    if request.param == "memory":
        yield MemoryStorage(clock), clock
        return
    server = request.getfixturevalue("redis_server")
    redis_client = request.getfixturevalue("redis_client")
    redis_client.flushall()
    backend = test_storage(server.url, clock)
    yield backend, clock
    backend.close()


def _fw(key: str, rate: str, shadow: bool = False) -> Check:
    return Check(key, Algorithm.FIXED_WINDOW, parse_rate(rate), 1, shadow)


def _used(backend: Storage, check: Check) -> int:
    """Units charged on ``check``'s key (read with a cost-0 peek)."""
    outcome = backend.peek([dataclasses.replace(check, cost=0)]).outcomes[0]
    return outcome.limit - outcome.remaining


def test_a_shadow_check_is_charged_when_it_allows_and_never_denies(
    storage: tuple[Storage, FrozenClock],
) -> None:
    """A shadow check's denial admits the request and is not charged; while it allows it
    is charged like any other; the enforced check alone decides, all-or-nothing."""
    backend, _ = storage
    enforced, shadow = _fw("t:e", "5/minute"), _fw("t:s", "2/minute", shadow=True)
    verdicts = [backend.decide([enforced, shadow]) for _ in range(6)]
    assert [v.allowed for v in verdicts] == [True] * 5 + [False]
    assert [v.outcomes[1].allowed for v in verdicts] == [True, True, False, False, False, False]
    assert _used(backend, enforced) == 5
    assert _used(backend, shadow) == 2  # charged while it allowed, never more


def test_an_enforced_denial_charges_no_shadow_check(storage: tuple[Storage, FrozenClock]) -> None:
    """When an enforced check denies, a shadow check that allowed is not charged either."""
    backend, _ = storage
    enforced, shadow = _fw("t:e1", "1/minute"), _fw("t:s1", "10/minute", shadow=True)
    assert backend.decide([enforced, shadow]).allowed
    assert not backend.decide([enforced, shadow]).allowed
    assert _used(backend, shadow) == 1


def test_the_deny_cache_never_caches_a_shadow_denial(redis_server: RedisServer) -> None:
    """A shadow denial from Redis is no denial: nothing is cached, every request asks Redis."""
    storage = test_storage(redis_server.url, FrozenClock())
    storage.clear(["t:dc"])
    cache = DenyCache(storage)
    check = _fw("t:dc", "1/minute", shadow=True)
    try:
        verdicts = [cache.decide([check]) for _ in range(4)]
        assert all(v.allowed for v in verdicts)
        assert not verdicts[-1].outcomes[0].allowed  # Redis said "would deny"
        assert len(cache) == 0 and cache.hits == 0
    finally:
        cache.close()


# -- shadow through the extension ----------------------------------------------------


def shadow_app(tmp_path: Path, storage: Storage, **config: Any) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.secret_key = "test"
    app.config.update(
        TESTING=True,
        QUOTA_PLANS={"free": {"resources": {"ai_inference": "5/minute"}}},
        QUOTA_DASHBOARD_URL="/quota",  # usage is recorded for the dashboard
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'quota.sqlite3'}",
    )
    app.config.update(config)
    quota = Quota(app, storage=storage)

    @app.get("/ai")
    @quota.limit(resource="ai_inference")
    def ai() -> str:
        return "ok"

    return app


def test_quota_shadow_admits_everything_and_counts_shadow_denied(
    tmp_path: Path, storage: tuple[Storage, FrozenClock]
) -> None:
    """QUOTA_SHADOW=true (issue 10): 40 requests to a 5/minute resource all answer 200,
    without rate-limit headers; 35 are counted as shadow_denied, and the signal fires
    once per such request."""
    backend, clock = storage
    app = shadow_app(tmp_path, backend, QUOTA_SHADOW="true")
    fired: list[Decision] = []

    def on_shadow(sender: Flask, decision: Decision, **extra: Any) -> None:
        fired.append(decision)

    signals.quota_shadow_exceeded.connect(on_shadow, app)
    try:
        http = app.test_client()
        responses = [http.get("/ai") for _ in range(40)]
    finally:
        signals.quota_shadow_exceeded.disconnect(on_shadow, app)
    assert [r.status_code for r in responses] == [200] * 40
    assert "RateLimit-Policy" not in responses[-1].headers
    assert len(fired) == 35 and all(d.shadow_denied[0].name == "ai_inference" for d in fired)
    state = app.extensions["quota"]
    state.usage.flush()
    minute = clock.now_us // (60 * US)
    tiers = state.usage.sink.minutes(1, minute)[0].tiers
    assert tiers[("ai_inference", SHADOW_DENIED)] == 35
    assert tiers[("ai_inference", True)] == 5 and tiers[("ai_inference", False)] == 0
    totals = tier_totals(state.usage.sink.minutes(1, minute))
    assert totals["ai_inference"] == {"allowed": 5, "denied": 0, "shadow_denied": 35}
    state.sql.close()


def test_a_shadow_tier_next_to_an_enforced_one(tmp_path: Path) -> None:
    """A shadow user tier that would deny neither denies nor shows in the headers, while
    the enforced endpoint tier denies as usual; usage_outcomes marks each."""
    clock = FrozenClock()
    plans = {
        "free": {
            "user": {"rate": "1/minute", "shadow": True},
            "resources": {"ai_inference": "3/minute"},
        }
    }
    app = shadow_app(tmp_path, MemoryStorage(clock), QUOTA_PLANS=plans)
    http = app.test_client()
    codes = []
    for _ in range(4):
        response = http.get("/ai")
        codes.append(response.status_code)
        assert '"user"' not in response.headers["RateLimit-Policy"]
    assert codes == [200, 200, 200, 429]
    state = app.extensions["quota"]
    state.usage.flush()
    tiers = state.usage.sink.minutes(1, clock.now_us // (60 * US))[0].tiers
    assert tiers[("user", True)] == 1 and tiers[("user", SHADOW_DENIED)] == 3
    assert tiers[("ai_inference", True)] == 3 and tiers[("ai_inference", False)] == 1
    state.sql.close()


def test_the_dashboard_shows_would_have_denied_per_tier_and_identity(tmp_path: Path) -> None:
    """The overview and the identity page show the shadow denials next to the denials."""
    # The wall clock: the dashboard shows the last hour of real time.
    app = shadow_app(
        tmp_path, MemoryStorage(), QUOTA_SHADOW=True, QUOTA_DASHBOARD_USERS={"ops": HASH}
    )
    http = app.test_client()
    for _ in range(8):
        assert http.get("/ai").status_code == 200
    state = app.extensions["quota"]
    state.usage.flush()
    overview = http.get("/quota/", headers=OPS).get_data(as_text=True)
    assert "<th>Would have denied</th>" in overview
    assert "<td>ai_inference</td><td>5</td><td>0</td><td>3</td>" in overview
    page = http.get("/quota/identity/ip=127.0.0.1", headers=OPS).get_data(as_text=True)
    table = page.split('id="identity-tiers"')[1].split("</table>")[0]
    assert "<td>ai_inference</td><td>5</td><td>0</td><td>3</td>" in table
    state.sql.close()
