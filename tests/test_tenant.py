"""The tenant tier: every caller of one tenant also draws from the tenant's bucket,
all-or-nothing with its own tiers, in the same storage call (SPEC 8.2)."""

from __future__ import annotations

import pytest
from flask import Flask

from flask_quota import Identity, signals
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.plans import catalog_from_config, plan_config
from flask_quota.core.policy import Decision
from flask_quota.core.tiers import Tier
from flask_quota.storage import MemoryStorage, Storage
from flask_quota.testing import FrozenClock
from tests.backends import backend  # noqa: F401  (a fixture)
from tests.tenants import alternate, get, tenant_app


def test_one_tenants_callers_share_its_bucket(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """The must-show: alice and bob of acme alternate, 200 x5 then 429 429 naming the
    tenant tier; carol of globex is untouched (memory, Redis, Valkey)."""
    storage, _ = backend
    _, http = tenant_app(app, storage)
    assert alternate(http) == [200] * 5 + [429, 429]
    denied = get(http, "alice", "acme")
    body = denied.get_json()
    assert body["tier"] == "tenant"
    assert body["violated-policies"] == ["tenant"]
    assert body["detail"].startswith("Tenant limit exceeded: 5 requests per 60 s")
    assert [get(http, "carol", "globex").status_code for _ in range(5)] == [200] * 5


def test_a_denial_by_the_users_own_tier_charges_the_tenant_nothing(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """alice's own bucket (2/minute) denies her third request: acme's bucket keeps the
    three units left after her two, so bob gets exactly three."""
    storage, _ = backend
    plans = {"pro": {"tenant": "5/minute", "user": "2/minute"}}
    _, http = tenant_app(app, storage, QUOTA_PLANS=plans)
    assert [get(http, "alice", "acme").status_code for _ in range(4)] == [200, 200, 429, 429]
    assert get(http, "alice", "acme").get_json()["tier"] == "user"
    assert [get(http, "bob", "acme").status_code for _ in range(2)] == [200, 200]
    assert get(http, "dave", "acme").status_code == 200
    last = get(http, "dave", "acme")
    assert last.status_code == 429 and last.get_json()["tier"] == "tenant"


def test_callers_without_a_tenant_skip_the_tier(app: Flask, clock: FrozenClock) -> None:
    """An identity with no tenant, and an anonymous caller, never meet the tenant tier."""
    storage = MemoryStorage(clock)
    _, http = tenant_app(app, storage)
    assert [get(http, "solo").status_code for _ in range(8)] == [200] * 8
    assert [http.get("/work").status_code for _ in range(8)] == [200] * 8
    assert "tenant" not in get(http, "solo").headers["RateLimit-Policy"]


def test_headers_name_the_tenant_tier(app: Flask, clock: FrozenClock) -> None:
    """The tenant's bucket is in RateLimit-Policy and, as the closest tier, in the
    other headers; the 429 keeps them."""
    _, http = tenant_app(app, MemoryStorage(clock))
    response = get(http, "alice", "acme")
    assert response.headers["RateLimit-Policy"] == (
        '"global";q=1000;w=60, "tenant";q=5;w=60, "user";q=100;w=60'
    )
    assert response.headers["X-RateLimit-Resource"] == "tenant"
    assert response.headers["X-RateLimit-Remaining"] == "4"
    assert response.headers["RateLimit"].startswith('"tenant";r=4;')
    for _ in range(4):
        get(http, "bob", "acme")
    denied = get(http, "alice", "acme")
    assert denied.status_code == 429
    assert denied.headers["X-RateLimit-Resource"] == "tenant"
    assert denied.headers["X-RateLimit-Remaining"] == "0"


def test_quota_exceeded_names_the_tenant_tier(app: Flask, clock: FrozenClock) -> None:
    """``quota_exceeded`` is sent for a tenant denial, its decision naming the tier."""
    _, http = tenant_app(app, MemoryStorage(clock))
    exceeded: list[Decision] = []

    def on_exceeded(sender: Flask, decision: Decision) -> None:
        exceeded.append(decision)

    with signals.quota_exceeded.connected_to(on_exceeded, app):
        alternate(http)
    assert [d.denied.tier for d in exceeded if d.denied] == [Tier.TENANT, Tier.TENANT]
    assert str(exceeded[0]).startswith("denied by tenant: 5 per 60 s on plan 'pro'")


def test_a_shadow_tenant_tier_never_denies(app: Flask, clock: FrozenClock) -> None:
    """A shadow tenant tier (``QUOTA_SHADOW`` or the limit's flag) admits everything and
    sends ``quota_shadow_exceeded`` for each request it would have denied."""
    plans = {"pro": {"tenant": {"rate": "2/minute", "shadow": True}, "user": "100/minute"}}
    _, http = tenant_app(app, MemoryStorage(clock), QUOTA_PLANS=plans)
    shadowed: list[Decision] = []

    def on_shadow(sender: Flask, decision: Decision) -> None:
        shadowed.append(decision)

    with signals.quota_shadow_exceeded.connected_to(on_shadow, app):
        assert alternate(http) == [200] * 7
    assert [r.tier for d in shadowed for r in d.shadow_denied] == [Tier.TENANT] * 5


def test_metrics_count_the_tenant_tier(app: Flask, clock: FrozenClock) -> None:
    """``flask_quota_decisions_total`` has ``tier="tenant"`` series, allowed and denied."""
    from tests.prom import Scrape

    _, http = tenant_app(app, MemoryStorage(clock), QUOTA_METRICS_URL="/metrics")
    alternate(http)
    scrape = Scrape.parse(http.get("/metrics").get_data(as_text=True))
    assert scrape.decisions(tier="tenant", resource="tenant", plan="pro", outcome="allowed") == 5
    assert scrape.decisions(tier="tenant", resource="tenant", plan="pro", outcome="denied") == 2
    # The denials charged nothing: the user tier counted only the admitted requests.
    assert scrape.decisions(tier="user", resource="user", plan="pro", outcome="allowed") == 5


def test_plans_define_a_tenant_tier() -> None:
    """A plan's ``tenant`` entry takes several rates and a mode, like every tier, and
    exports back to the same shape."""
    config = {
        "pro": {
            "tenant": "5/minute, 100/day",
            "user": "100/minute",
        },
        "team": {"tenant": {"rate": "10/minute", "algorithm": "fixed_window", "shadow": True}},
    }
    catalog = catalog_from_config(config, upgrade_url="/pricing")
    pro = catalog["pro"]
    assert pro.tenant_rate is not None and len(pro.tenant_rate) == 2
    assert pro.rate_for(Tier.TENANT) == pro.tenant_rate
    assert plan_config(pro) == {"tenant": "5/minute, 100/day", "user": "100/minute"}
    assert plan_config(catalog["team"]) == config["team"]
    with pytest.raises(ValueError, match=r"QUOTA_PLANS\['pro'\]\['tenant'\]"):
        catalog_from_config({"pro": {"tenant": "often"}}, upgrade_url="/pricing")


def test_upgrade_hint_names_a_larger_tenant_rate(app: Flask, clock: FrozenClock) -> None:
    """A tenant-tier 429 points at the next plan with a larger tenant rate."""
    plans = {
        "pro": {"tenant": "1/minute", "user": "100/minute"},
        "enterprise": {"tenant": "50/minute", "user": "100/minute"},
    }
    _, http = tenant_app(app, MemoryStorage(clock), QUOTA_PLANS=plans)
    get(http, "alice", "acme")
    body = get(http, "bob", "acme").get_json()
    assert body["tier"] == "tenant"
    assert body["upgrade"] == "Enterprise raises this to 50 per minute: see /pricing"


def test_identity_tenant_must_be_a_non_empty_string() -> None:
    """A tenant is named like an identity: a non-empty string, or None."""
    assert Identity("u1", "pro", "acme").tenant == "acme"
    assert Identity("u1").tenant is None
    for bad in ("", 42):
        with pytest.raises(ValueError, match=r"Identity\.tenant"):
            Identity("u1", "pro", bad)  # type: ignore[arg-type]


def test_a_tenant_key_has_its_own_hash_tag() -> None:
    """A hostile tenant name cannot choose another key's slot or pose as a caller."""
    keys = KeyBuilder("quota")
    key = keys.tenant_key(keys.tenant_tag("}{id=victim}"), Algorithm.TOKEN_BUCKET)
    assert key.count("{") == 1 and key.count("}") == 1
    assert key == "quota:{t=%7D%7Bid=victim%7D}:t:tb"
    assert key != keys.user_key(keys.identity_tag("victim"), Algorithm.TOKEN_BUCKET)


def test_peek_and_reset_reach_the_tenant_bucket(app: Flask, clock: FrozenClock) -> None:
    """``quota.peek``/``reset`` with ``tenant=``: alone, the tenant's bucket; with an
    identity, that caller's buckets and its tenant's."""
    quota, http = tenant_app(app, MemoryStorage(clock))
    alternate(http)
    with app.app_context():
        [bucket] = quota.peek(tenant="acme")
        assert (bucket.tier, bucket.name, bucket.remaining) == ("tenant", "tenant", 0)
        mine = {b.tier: b.remaining for b in quota.peek("alice", tenant="acme")}
        assert mine == {"tenant": 0, "user": 97}
        assert quota.reset(tenant="acme") == 1
        with pytest.raises(ValueError, match="name the identity"):
            quota.peek(ip="1.2.3.4", tenant="acme")
    assert get(http, "bob", "acme").status_code == 200
    assert get(http, "globex-user", "globex").status_code == 200


def test_the_enforcer_keeps_tenant_and_tenantless_routes_apart(clock: FrozenClock) -> None:
    """Without Flask: one endpoint's route differs with and without a tenant, whichever
    comes first, and the tenant's bucket is keyed by the tenant, not the caller."""
    from flask_quota import Plan, PlanCatalog, QuotaExceeded
    from flask_quota.core.enforcer import Enforcer
    from flask_quota.core.facts import Facts
    from flask_quota.core.keys import remote_ip_tag
    from flask_quota.core.policy import Policy
    from flask_quota.core.rates import parse_rates
    from flask_quota.settings import FailMode
    from flask_quota.storage.breaker import CircuitBreaker
    from flask_quota.storage.failover import GuardedStorage

    plan = Plan("free", user_rate=parse_rates("10/minute"), tenant_rate=parse_rates("2/minute"))
    enforcer = Enforcer(
        guard=GuardedStorage(MemoryStorage(clock), FailMode.OPEN, CircuitBreaker("memory")),
        policy=Policy(KeyBuilder("quota"), Algorithm.TOKEN_BUCKET),
        catalog=lambda: PlanCatalog([plan]),
        anonymous_plan="free",
        default_plan="free",
    )

    def decide(who: str, tenant: str | None) -> list[Tier]:
        facts = Facts("GET", "view", remote_ip_tag("203.0.113.9"), Identity(who, None, tenant))
        decided = enforcer.decide(facts)
        assert decided is not None
        return [r.tier for r in decided.decision().results]

    assert decide("solo", None) == [Tier.USER]
    assert decide("alice", "acme") == [Tier.TENANT, Tier.USER]
    assert decide("solo", None) == [Tier.USER]
    assert decide("bob", "acme") == [Tier.TENANT, Tier.USER]
    with pytest.raises(QuotaExceeded) as denied:
        decide("carol", "acme")
    assert denied.value.tier == Tier.TENANT and denied.value.policy == "tenant"
    assert decide("dave", "globex") == [Tier.TENANT, Tier.USER]
