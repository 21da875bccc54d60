"""The precomputed request shape (``Route``) against the object path it replaces.

The request path decides from a ``Route`` (keys by concatenation, a flat reply,
headers read off it). Each test here builds the same request both ways and
demands identical keys, decisions and header bytes.
"""

from __future__ import annotations

import copy
import pickle
from types import MappingProxyType
from typing import Any

import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st

from flask_quota import Quota
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.clock import ceil_seconds
from flask_quota.core.headers import policy_header, printable, sf_string
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.plans import LimitMode, Plan, PlanCatalog
from flask_quota.core.policy import Decision, LimitSpec, Policy, TierResult, gate_check
from flask_quota.core.rates import Rate, parse_rates
from flask_quota.core.reply import Reply
from flask_quota.core.route import build_route
from flask_quota.core.tiers import Tier
from flask_quota.settings import HeaderMode
from flask_quota.state import get_state
from flask_quota.storage import Check, MemoryStorage
from flask_quota.storage.base import flat_reply, verdict_of
from flask_quota.testing import FrozenClock

PLAN = Plan(
    "p",
    global_rate=parse_rates("50/second"),
    user_rate=parse_rates("100/minute, 1000/day"),
    resources={"search": parse_rates("5/minute; burst=8, 50/hour"), "ai": parse_rates("3/minute")},
    modes={
        ("endpoint", "search"): LimitMode(algorithm=Algorithm.SLIDING_WINDOW_COUNTER),
        ("user", ""): LimitMode(shadow=True),
    },
)
TAGS = st.sampled_from(["ip=1.2.3.4", "id=alice", "id=%7Bodd%7D%3A", "k=org%2F7", "ip=::1"])


@given(
    ip_tag=TAGS,
    tag=TAGS,
    key_tag=st.one_of(st.none(), TAGS),
    method=st.sampled_from(["GET", "HEAD", "POST"]),
    per_method=st.booleans(),
    resource=st.sampled_from(["search", "ai", "other"]),
    cost=st.integers(0, 3),
    shadow=st.booleans(),
)
def test_route_keys_and_checks_are_the_policys(
    ip_tag: str,
    tag: str,
    key_tag: str | None,
    method: str,
    per_method: bool,
    resource: str,
    cost: int,
    shadow: bool,
) -> None:
    policy = Policy(KeyBuilder("q"), Algorithm.TOKEN_BUCKET, shadow=shadow)
    key = (lambda: "x") if key_tag is not None else None
    spec = LimitSpec(parse_rates("7/minute"), None, cost, key, per_method)
    expected = policy.checks(
        PLAN,
        ip_tag=ip_tag,
        identity_tag=tag,
        method=method,
        spec=spec,
        resource=resource,
        cost=cost,
        endpoint_tag=key_tag,
    )
    route = build_route(policy, PLAN, method=method, spec=spec, resource=resource, cost=cost)
    keys = route.keys(ip_tag, tag, key_tag or tag)
    assert route.checks(keys) == [gate_check(policy.keys, tag), *[c.check for c in expected]]
    assert route.tier_checks(keys) == expected
    assert route.shadow == (shadow or any(c.check.shadow for c in expected))


REPLY_TIER = st.tuples(
    st.booleans(),
    st.integers(-3, 40),  # remaining (a token bucket in debt goes below 0)
    st.integers(0, 10**8),  # reset, around now
    st.integers(0, 10**8),  # retry
)


def expected_headers(decision: Decision, mode: HeaderMode) -> list[tuple[str, str]]:
    """SPEC 4's headers of a decision, from its ``Decision`` objects (the oracle): the
    denying tier, else the closest to its limit (fewest remaining; ties: the one that
    resets last), shadow tiers and concurrency limits left out."""
    results = decision.rated
    if not results or mode is HeaderMode.NONE:
        return []
    shown = decision.shown
    assert shown is not None
    outcome = shown.outcome
    remaining = str(max(0, outcome.remaining))
    legacy = [
        ("X-RateLimit-Limit", str(outcome.limit)),
        ("X-RateLimit-Remaining", remaining),
        ("X-RateLimit-Reset", str(ceil_seconds(outcome.reset_us))),
        ("X-RateLimit-Resource", printable(shown.name)),
    ]
    policies = policy_header(
        tuple((r.name, r.outcome.limit, r.rate.policy_window) for r in results)
    )
    reset_in = decision.seconds_until(outcome.reset_us)
    ietf = [
        ("RateLimit-Policy", policies),
        ("RateLimit", f"{sf_string(shown.name)};r={remaining};t={reset_in}"),
    ]
    if mode is HeaderMode.LEGACY:
        return legacy
    return ietf if mode is HeaderMode.IETF else legacy + ietf


@given(
    tiers=st.lists(REPLY_TIER, min_size=5, max_size=5),
    now=st.integers(0, 10**8),
    shadow=st.booleans(),
    mode=st.sampled_from(list(HeaderMode)),
)
def test_headers_from_the_reply_are_the_decisions_byte_for_byte(
    tiers: list[tuple[bool, int, int, int]], now: int, shadow: bool, mode: HeaderMode
) -> None:
    """Ties included: remaining and resets are drawn from small ranges around now."""
    policy = Policy(KeyBuilder(), Algorithm.TOKEN_BUCKET, shadow=shadow)
    spec = LimitSpec(None, "search", 1)
    route = build_route(policy, PLAN, method="GET", spec=spec, resource="search", cost=1)
    assert len(route.tiers) == 5  # global, user (2 rates), search (2 rates)
    reply = Reply([now, 1, 1, 0, now, 0])
    for (allowed, remaining, reset, retry), tier in zip(tiers, route.tiers, strict=True):
        reply += [int(allowed), remaining, reset, 0 if allowed else retry]
        if not allowed and not tier.check.shadow:
            reply[1] = 0  # as every storage answers: all_allowed covers the enforced tiers
    blocked, decision = route.decision(reply)
    assert blocked is None
    assert route.headers(reply, mode) == expected_headers(decision, mode)
    # A decision settled after the response is shown by the same code.
    assert route.settled_headers(decision, mode) == expected_headers(decision, mode)


def test_decision_from_the_reply_is_the_verdicts() -> None:
    """``route.decision`` equals the decision made of the same storage answer's verdict."""
    clock = FrozenClock()
    storage = MemoryStorage(clock=clock)
    policy = Policy(KeyBuilder(), Algorithm.TOKEN_BUCKET)
    spec = LimitSpec(None, "ai", 1)
    route = build_route(policy, PLAN, method="POST", spec=spec, resource="ai", cost=1)
    keys = route.keys("ip=9.9.9.9", "id=bob", "id=bob")
    for _ in range(5):  # the "ai" tier (3/minute) denies from the fourth call
        reply = storage.decide_flat(route.calls, keys)
        verdict = verdict_of(route.checks(keys), reply)
        assert flat_reply(verdict) == reply
        gate, decision = route.decision(reply)
        tiers = route.tier_checks(keys)
        tier_verdict = verdict_of([c.check for c in tiers], reply[4:])
        expected = Decision(
            "p",
            tuple(
                TierResult(c.tier, c.name, c.check.rate, o, c.resource, c.check.shadow)
                for c, o in zip(tiers, tier_verdict.outcomes, strict=True)
            ),
            tier_verdict.now_us,
        )
        assert gate is None
        assert decision == expected
        clock.advance(0.001)
    assert decision.denied is not None and decision.denied.name == "ai"


def test_memory_flat_and_object_paths_decide_alike() -> None:
    """``decide_flat`` on a reused shape charges exactly as ``decide`` on the same checks."""
    policy = Policy(KeyBuilder(), Algorithm.FIXED_WINDOW)
    route = build_route(
        policy, PLAN, method="GET", spec=LimitSpec(None, "ai", 1), resource="ai", cost=1
    )
    flat, objects = MemoryStorage(clock=FrozenClock()), MemoryStorage(clock=FrozenClock())
    keys = route.keys("ip=1.1.1.1", "id=a", "id=a")
    for _ in range(6):
        assert flat.decide_flat(route.calls, keys) == flat_reply(objects.decide(route.checks(keys)))


def test_routes_are_cached_per_catalog_and_rebuilt_when_it_changes() -> None:
    app = Flask(__name__)
    app.config.update(QUOTA_DATABASE_URL="sqlite://")
    Quota(app, storage=MemoryStorage(clock=FrozenClock()))
    enforcer = get_state(app).enforcer
    spec = LimitSpec(parse_rates("100/minute"), None, 1)
    old, new = PlanCatalog([PLAN]), PlanCatalog([PLAN])
    route = enforcer.route(old, PLAN, "view", "GET", spec, "view", 1)
    assert enforcer.route(old, PLAN, "view", "GET", spec, "view", 1) is route  # cached
    assert enforcer.route(old, PLAN, "view", "POST", spec, "view", 1) is not route
    assert enforcer.route(old, PLAN, "view", "GET", spec, "view", 2) is not route  # another cost
    assert len(enforcer.routes.current) == 3
    again = enforcer.route(new, PLAN, "view", "GET", spec, "view", 1)  # a plan change
    assert again is not route and again.calls == route.calls
    assert len(enforcer.routes.current) == 1 and enforcer.routes_of is new
    # A plan equal to the cached one but another object (an override re-resolved, or a
    # new id after the old plan was freed) gets a route of its own: entries hold their plan.
    other = Plan("p", global_rate=parse_rates("1/second"))
    assert enforcer.route(new, other, "view", "GET", spec, "view", 1).plan is other


def _route_state() -> Any:
    app = Flask(__name__)
    app.config.update(QUOTA_DATABASE_URL="sqlite://")
    Quota(app, storage=MemoryStorage(clock=FrozenClock()))
    return get_state(app)


def test_costs_from_a_callable_never_evict_the_routes_in_use() -> None:
    """A cost from a callable can take thousands of values. Each is a route derived from
    the cost-1 route (sharing all but its checks), and filling the bounded cache with
    them keeps the routes in use rather than rebuilding every route (~60 us a request)."""
    enforcer = _route_state().enforcer
    catalog = PlanCatalog([PLAN])
    spec = LimitSpec(parse_rates("100/minute"), None, 1)
    unit = enforcer.route(catalog, PLAN, "view", "GET", spec, "search", 1)
    two = enforcer.route(catalog, PLAN, "view", "GET", spec, "search", 2)
    for cost in range(3, 10_000):
        enforcer.route(catalog, PLAN, "view", "GET", spec, "search", cost)
        if cost % 100 == 0:
            assert enforcer.route(catalog, PLAN, "view", "GET", spec, "search", 1) is unit, cost
            assert enforcer.route(catalog, PLAN, "view", "GET", spec, "search", 2) is two, cost
    assert len(enforcer.routes.current) <= 4096 and len(enforcer.routes.retired) <= 4096
    policy = enforcer.policy
    for cost in (0, 2, 7, 9_999):
        variant = enforcer.route(catalog, PLAN, "view", "GET", spec, "search", cost)
        built = build_route(policy, PLAN, method="GET", spec=spec, resource="search", cost=cost)
        assert variant.calls == built.calls and variant.tiers == built.tiers
        assert (variant.parts, variant.limits, variant.policy) == (
            built.parts, built.limits, built.policy
        )  # fmt: skip
        assert variant.parts is unit.parts  # derived from the cost-1 route, not rebuilt
        again = enforcer.route(catalog, PLAN, "view", "GET", spec, "search", cost)
        assert again.calls is variant.calls  # the tuple is reused: backends cache by identity
        # Only the endpoint tier weighs the cost; global and user count the request.
        assert [c.cost for c in variant.calls[1:]] == [1, 1, 1, cost, cost]


def test_a_route_in_use_survives_the_cache_filling_up() -> None:
    """Many plans (a re-resolved override per client) fill the bounded route cache; a
    route that requests keep using is kept rather than dropped with all the others."""
    enforcer = _route_state().enforcer
    catalog = PlanCatalog([PLAN])
    spec = LimitSpec(parse_rates("100/minute"), None, 1)
    hot = enforcer.route(catalog, PLAN, "view", "GET", spec, "search", 1)
    plans = [Plan(f"c{i}", global_rate=parse_rates("1/second")) for i in range(10_000)]
    for i, plan in enumerate(plans):
        enforcer.route(catalog, plan, "view", "GET", spec, "search", 1)
        if i % 100 == 0:
            assert enforcer.route(catalog, PLAN, "view", "GET", spec, "search", 1) is hot, i
    assert len(enforcer.routes.current) <= 4096 and len(enforcer.routes.retired) <= 4096


def test_a_plan_is_a_value_its_callers_dicts_cannot_change() -> None:
    """Routes are cached by plan object, so a plan must not change under them: the
    dicts it was made from are copied, and its own are read-only."""
    resources: dict[str, Any] = {"search": "5/minute"}
    modes = {("user", ""): LimitMode(shadow=True)}
    plan = Plan("p", user_rate=parse_rates("10/minute"), resources=resources, modes=modes)
    resources["search"] = "500/minute"
    resources["other"] = "1/minute"
    modes[("user", "")] = LimitMode()
    assert dict(plan.resources) == {"search": parse_rates("5/minute")}
    assert plan.mode_for(Tier.USER).shadow
    with pytest.raises(TypeError):
        plan.resources["search"] = parse_rates("1/second")  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.modes[("user", "")] = LimitMode()  # type: ignore[index]
    assert Plan("p", user_rate=parse_rates("10/minute"),
                resources={"search": parse_rates("5/minute")},
                modes={("user", ""): LimitMode(shadow=True)}) == plan  # fmt: skip
    # Still copied and pickled like any dataclass (an app's config may hold plans).
    assert copy.deepcopy(plan) == plan and pickle.loads(pickle.dumps(plan)) == plan
    assert isinstance(copy.deepcopy(plan).resources, MappingProxyType)


def test_current_decision_on_the_fast_path() -> None:
    """An admitted request keeps no Decision; ``current_decision()`` makes it on demand."""
    app = Flask(__name__)
    app.config.update(QUOTA_DATABASE_URL="sqlite://")
    quota = Quota(app, storage=MemoryStorage(clock=FrozenClock()))
    seen: list[Decision | None] = []

    @app.get("/r")
    @quota.limit("3/minute")
    def r() -> str:
        seen.append(quota.current_decision())
        return "ok"

    client = app.test_client()
    assert client.get("/r").headers["X-RateLimit-Remaining"] == "2"
    decision = seen[0]
    assert decision is not None and decision.allowed
    assert [(r.name, r.outcome.remaining) for r in decision.results][-1] == ("r", 2)


def test_a_storage_that_overrides_decide_is_asked_through_it() -> None:
    """The request path uses ``decide_flat`` only where it decides as ``decide`` does: a
    subclass's own ``decide`` (here, failing on purpose) is still what answers."""
    from flask_quota.storage import StorageError

    class Failing(MemoryStorage):
        def decide(self, checks: Any) -> Any:
            raise StorageError("failing on purpose")

    app = Flask(__name__)
    app.config.update(QUOTA_DATABASE_URL="sqlite://", QUOTA_FAIL_MODE="closed")
    quota = Quota(app, storage=Failing(clock=FrozenClock()))

    @app.get("/r")
    @quota.limit("3/minute")
    def r() -> str:
        return "ok"

    assert app.test_client().get("/r").status_code == 503


def test_memory_files_a_key_shared_by_two_checks_in_one_slot() -> None:
    """Two checks of one call on the same key: the key ends in exactly one expiry slot,
    so no sweep can drop its live state."""
    clock = FrozenClock()
    storage = MemoryStorage(clock=clock)
    tb = Algorithm.TOKEN_BUCKET
    checks = [Check("k", tb, Rate(10, 60), 1), Check("k", tb, Rate(10, 120), 1)]
    for _ in range(3):
        assert storage.decide(checks).allowed
        clock.advance(3)
    assert sum("k" in keys for keys in storage._slots.values()) == 1
