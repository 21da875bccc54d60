"""The enforcer decides whole requests from plain facts: no Flask app is made here."""

from __future__ import annotations

import pytest

from flask_quota import Identity, Plan, PlanCatalog, QuotaExceeded, Tier
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.enforcer import Decided, Enforcer
from flask_quota.core.facts import Facts, limit_hooks
from flask_quota.core.keys import KeyBuilder, remote_ip_tag
from flask_quota.core.policy import Decision, LimitSpec, Policy, TierResult
from flask_quota.core.priority import Priority
from flask_quota.core.rates import parse_rates
from flask_quota.settings import FailMode
from flask_quota.storage import MemoryStorage
from flask_quota.storage.breaker import CircuitBreaker
from flask_quota.storage.failover import GuardedStorage
from flask_quota.testing import FrozenClock

PLAN = Plan(
    "free",
    global_rate=parse_rates("5/second"),
    user_rate=parse_rates("3/minute"),
    resources={"search": parse_rates("2/minute")},
)
SEARCH = LimitSpec(parse_rates("1/minute"), "search", 1)
ALICE = Identity(id="alice", plan="free")


class Recorder:
    """Both the enforcer's events and its observer: what it was told, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[str, object]] = []

    def exceeded(self, decision: Decision) -> None:
        self.told.append(("exceeded", decision.denied and decision.denied.tier))

    def shadow_exceeded(self, decision: Decision) -> None:
        self.told.append(("shadow", decision))

    def stored(self, seconds: float) -> None:
        self.told.append(("stored", seconds >= 0))

    def unavailable(self, tiers: object, plan: str, outcome: str) -> None:
        self.told.append(("unavailable", outcome))

    def decided(self, decision: Decision, *, local: bool, blocked: bool) -> None:
        self.told.append(("decided", decision.allowed))

    def watching(self) -> bool:
        return True

    def near_limit(self, decision: Decision, result: TierResult) -> None:
        self.told.append(("near", result.name))

    def shed(self, priority: Priority, reason: str, *, shadow: bool) -> None:
        self.told.append(("shed", reason))


class Down(MemoryStorage):
    """A storage whose every decision fails."""

    def decide_flat(self, *_: object) -> list[int]:  # type: ignore[override]
        raise RuntimeError("down")

    def decide(self, *_: object) -> None:  # type: ignore[override]
        raise RuntimeError("down")


def _enforcer(
    clock: FrozenClock,
    *,
    observer: Recorder | None = None,
    down: bool = False,
    near: float | None = None,
) -> tuple[Enforcer, MemoryStorage]:
    storage = Down(clock) if down else MemoryStorage(clock)
    guard = GuardedStorage(storage, FailMode.OPEN, CircuitBreaker("memory"))
    enforcer = Enforcer(
        guard=guard,
        policy=Policy(KeyBuilder("quota"), Algorithm.TOKEN_BUCKET),
        catalog=lambda: PlanCatalog([PLAN]),
        anonymous_plan="free",
        default_plan="free",
        events=observer,
        observer=observer,
        near=near,
    )
    return enforcer, storage


def _facts(identity: Identity | None = ALICE, cost: int = 1) -> Facts:
    return Facts("GET", "search", remote_ip_tag("203.0.113.9"), identity, SEARCH, cost)


def _remaining(decided: Decided) -> dict[Tier, int]:
    return {r.tier: r.outcome.remaining for r in decided.decision().results}


def test_a_whole_request_is_decided_without_a_flask_app() -> None:
    """Allowed: every tier (global, user, the endpoint's plan rate) is charged once."""
    enforcer, _ = _enforcer(FrozenClock())
    decided = enforcer.decide(_facts())
    assert decided is not None
    assert decided.reply.all_allowed
    assert _remaining(decided) == {Tier.GLOBAL: 4, Tier.USER: 2, Tier.ENDPOINT: 1}
    assert decided.tag == KeyBuilder.identity_tag("alice")


def test_a_denial_raises_and_names_its_tier() -> None:
    """Denied: the endpoint tier (2/minute for the plan) refuses the third request."""
    events = Recorder()
    enforcer, _ = _enforcer(FrozenClock(), observer=events)
    kept: list[Decided] = []
    enforcer.decide(_facts(), kept.append)
    enforcer.decide(_facts(), kept.append)
    with pytest.raises(QuotaExceeded) as caught:
        enforcer.decide(_facts(), kept.append)
    assert caught.value.tier is Tier.ENDPOINT and caught.value.resource == "search"
    assert ("exceeded", Tier.ENDPOINT) in events.told
    assert ("decided", False) in events.told  # the observer sees denials too
    assert kept and not kept[-1].reply.all_allowed  # the 429 still gets its headers


def test_each_bucket_is_reported_once_when_it_crosses_the_near_line() -> None:
    """near=0.5: the first request takes search (2/minute) to 1 used, the line; the second
    takes user (3/minute) to 2 used; each is told once, to the events and the observer,
    and nothing is told for requests above the line or refused ones. An endpoint tier's
    crossing is told when the response is done (its charge may still be settled)."""
    events = Recorder()
    enforcer, _ = _enforcer(FrozenClock(), observer=events, near=0.5)
    first = enforcer.decide(_facts())
    assert first is not None and not [t for t in events.told if t[0] == "near"]
    enforcer.done(first)
    second = enforcer.decide(_facts())
    assert second is not None
    enforcer.done(second)
    with pytest.raises(QuotaExceeded):
        enforcer.decide(_facts())
    near = [told for told in events.told if told[0] == "near"]
    # Each crossing reaches the observer (metrics) and the events (the signal).
    assert near == [("near", "search")] * 2 + [("near", "user")] * 2


def test_one_tier_denying_charges_none() -> None:
    """All-or-nothing: a request whose cost the endpoint tier refuses charges no tier."""
    enforcer, _ = _enforcer(FrozenClock())
    with pytest.raises(QuotaExceeded):
        enforcer.decide(_facts(cost=5))  # above the endpoint's capacity of 2
    decided = enforcer.decide(_facts())
    assert decided is not None
    # Had the refused request charged global and user, these would be 3 and 1.
    assert _remaining(decided) == {Tier.GLOBAL: 4, Tier.USER: 2, Tier.ENDPOINT: 1}


def test_settle_refunds_an_uncounted_response() -> None:
    """A response ``charge_when`` refuses gives its endpoint cost back, and only that."""
    enforcer, _ = _enforcer(FrozenClock())
    decided = enforcer.decide(_facts())
    assert decided is not None
    settled = enforcer.settle(decided, counted=False)
    endpoint = next(r for r in settled.results if r.tier is Tier.ENDPOINT)
    assert endpoint.outcome.remaining == 2  # the headers show the refund
    again = enforcer.decide(_facts())
    assert again is not None
    assert _remaining(again) == {Tier.GLOBAL: 3, Tier.USER: 1, Tier.ENDPOINT: 1}


def test_settle_charges_what_the_view_added() -> None:
    """``extra`` units (``quota.charge``) go on the endpoint tier after the response."""
    enforcer, _ = _enforcer(FrozenClock())
    decided = enforcer.decide(_facts())
    assert decided is not None
    enforcer.settle(decided, extra=1)
    with pytest.raises(QuotaExceeded) as caught:
        enforcer.decide(_facts())
    assert caught.value.tier is Tier.ENDPOINT


def test_an_anonymous_caller_is_keyed_by_its_address() -> None:
    enforcer, _ = _enforcer(FrozenClock())
    decided = enforcer.decide(_facts(identity=None))
    assert decided is not None and decided.tag == remote_ip_tag("203.0.113.9")


def test_the_observer_is_told_of_a_storage_failing_open() -> None:
    """One decide path: with an observer the storage call is timed and failures told."""
    recorder = Recorder()
    enforcer, _ = _enforcer(FrozenClock(), observer=recorder, down=True)
    assert enforcer.decide(_facts()) is None
    assert recorder.told == [("stored", True), ("unavailable", "fail_open")]


def test_limit_hooks_evaluate_the_views_callables() -> None:
    """A ``key`` answering None drops the limit; a bad cost is a TypeError naming the view."""
    spec = LimitSpec(None, "search", lambda: 3, key=lambda: "org-1")
    assert limit_hooks(spec, "v") == (spec, 3, "org-1")
    nobody = LimitSpec(None, "search", 1, key=lambda: None)
    assert limit_hooks(nobody, "v") == (None, 1, None)
    with pytest.raises(TypeError, match="cost callable of 'v'"):
        limit_hooks(LimitSpec(None, "search", lambda: -1), "v")
