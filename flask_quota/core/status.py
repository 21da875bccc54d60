"""A caller's own quota (``QUOTA_STATUS_URL``): every bucket of it, in one storage call.

The call charges the status request on the ``global`` tier, as any request is, and
on its own budget (``QUOTA_STATUS_RATE``: an endpoint tier of the resource
``quota_status``, per caller, which a plan may rate), and reads every other bucket
of the caller (its user tier and each limited endpoint's) as cost-0 shadow checks:
decided like the rest, so what they say is exactly what a ``peek`` says, but a shadow
check never denies and a cost of 0 takes nothing. So the answer comes from the same
snapshot (plans and overrides through the enforcer) and the same storage (deny cache,
breaker and fail mode through its guard) as enforcement, and costs one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .algorithms import Outcome
from .checks import shown_limit
from .clock import seconds_until
from .enforcer import Enforcer
from .errors import QuotaUnavailable
from .facts import Facts
from .plans import Plan
from .policy import Decision, LimitSpec, TierCheck, TierResult, gate_check, on_billing_day
from .rates import Rates
from .reply import LocalReply
from .tiers import Tier
from .validators import DEFAULT_UNIT

__all__ = [
    "IN_FLIGHT",
    "STATUS_RESOURCE",
    "BucketStatus",
    "CallerStatus",
    "caller_status",
    "status_budget",
]

_PER_ENDPOINT = (Tier.ENDPOINT, Tier.CONCURRENT)
STATUS_RESOURCE = "quota_status"  # the status budget's resource: a plan may rate it
IN_FLIGHT = "requests in flight"  # what a concurrency bucket counts: not a rate
_REQUEST_TIERS = (Tier.GLOBAL, Tier.TENANT, Tier.USER)


def status_budget(rates: Rates) -> LimitSpec:
    """The status budget as a limit (``QUOTA_STATUS_RATE``): one bucket per caller."""
    return LimitSpec(rates, STATUS_RESOURCE, 1, per_method=False)


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """One bucket of the caller, as the status answer shows it."""

    tier: str  # "global", "user", "endpoint", ...
    resource: str | None  # the endpoint tier's resource
    policy: str  # its ``RateLimit-Policy`` name: "global", "user", "search", "search@86400"
    limit: int
    remaining: int
    reset: int  # whole seconds until the bucket is full again
    window: int  # the rate's window in seconds
    unit: str = DEFAULT_UNIT  # what ``limit`` and ``remaining`` count ("requests", "tokens")


@dataclass(frozen=True, slots=True)
class CallerStatus:
    plan: str
    tenant: str | None
    limits: tuple[BucketStatus, ...]

    def as_json(self) -> dict[str, Any]:
        """The JSON body of SPEC 8.2: ``{"plan", "tenant", "limits": [...]}``."""
        return {
            "plan": self.plan,
            "tenant": self.tenant,
            "limits": [
                {
                    "tier": b.tier,
                    "resource": b.resource,
                    "policy": b.policy,
                    "limit": b.limit,
                    "remaining": b.remaining,
                    "reset": b.reset,
                    "window": b.window,
                    "unit": b.unit,
                }
                for b in self.limits
            ],
        }


def caller_status(
    enforcer: Enforcer,
    facts: Facts,
    endpoints: Sequence[tuple[str, str, LimitSpec]],
    *,
    charge: bool = True,
    budget: LimitSpec | None = None,
) -> CallerStatus:
    """The status of ``facts``' caller over the app's limited ``endpoints`` ((method,
    resource, spec), as ``state.limited_endpoints`` lists them); ``charge=False``
    (enforcement switched off) reads the global tier too. ``budget`` (``status_budget``)
    is charged with the global tier.

    Raises as ``Enforcer.decide`` does: ``QuotaExceeded`` when the global tier denies
    the status request itself (``CallerBlocked`` for a blocked caller), and
    ``QuotaUnavailable`` when the storage cannot answer, whatever the fail mode (with
    nothing read there is nothing to show).
    """
    catalog = enforcer.catalog()
    tag, plan, tenant_tag = enforcer.caller(catalog, facts)
    policy = enforcer.policy
    own = policy.checks(
        plan, ip_tag=facts.ip_tag, identity_tag=tag, method=facts.method,
        spec=None, resource=None, cost=1, tenant_tag=tenant_tag,
    )  # fmt: skip
    charged = [t for t in own if t.tier is Tier.GLOBAL] if charge else []
    read = [t for t in own if t.tier is not Tier.GLOBAL or not charge]
    spent = [] if budget is None else policy.endpoint_tier(plan, tag, STATUS_RESOURCE, budget)
    seen = {t.check.key for t in own}
    for method, resource, spec in endpoints:
        if spec.key is not None:
            continue  # a key= owner's bucket (an organisation's), not the caller's own
        for t in policy.checks(
            plan, ip_tag=facts.ip_tag, identity_tag=tag, method=method,
            spec=spec, resource=resource, cost=0,
        ):  # fmt: skip
            # Its endpoint tier, and the lease of a limit's own ``concurrent=`` (the
            # plan's lease is the caller's own, read above).
            if t.tier in _PER_ENDPOINT and t.check.key not in seen:
                seen.add(t.check.key)
                read.append(t)
    day = enforcer.billing_day(catalog, facts)
    if day is not None:  # the caller's months start on its own day
        charged = list(on_billing_day(tuple(charged), day))
        read = list(on_billing_day(tuple(read), day))
    # The budget is charged with the global tier (read when nothing is charged), and
    # listed last: it is the status call's own, not one of the API's buckets.
    if charge:
        charged += spent
    else:
        read += spent
    calls = [gate_check(policy.keys, tag)]
    calls += [t.check for t in charged]
    # Read as cost-0 shadow checks: never deny, never charge (a calendar stays on).
    calls += [replace(t.check, cost=0, shadow=True) for t in read]
    keys = [c.key for c in calls]
    observer = enforcer.watching()
    reply = enforcer.ask(calls, keys, lambda: charged, plan, observer)
    if reply is None:  # failing open: the request may pass, but nothing was read
        raise QuotaUnavailable()
    results = tuple(
        TierResult(
            t.tier, t.name, t.check.rate, reply.outcome(i + 1, shown_limit(t.check)),
            t.resource, t.check.shadow,
        )
        for i, t in enumerate(charged)
    )  # fmt: skip
    decision = Decision(plan.name, results, reply.now_us)
    # Decided through the enforcer's tail, as a request is: metrics, spans, signals, a
    # blocked caller's 429, and a denial counted towards QUOTA_BLOCK_AFTER.
    gate = None if reply.allowed(0) else reply.outcome(0, 0)
    asked = replace(facts, spec=budget, cost=1) if budget is not None else facts
    enforcer.conclude(
        catalog, plan, decision, asked, tag=tag, gate=gate, gate_key=keys[0],
        observer=observer, local=isinstance(reply, LocalReply),
    )  # fmt: skip
    shown = {id(t): i + 1 for i, t in enumerate([*charged, *read])}  # its place in the reply
    own_budget = {id(t) for t in spent}
    listed = [t for t in [*charged, *read] if id(t) not in own_budget] + spent
    declared = {resource: spec.unit for _, resource, spec in endpoints}
    if budget is not None:
        declared[STATUS_RESOURCE] = budget.unit
    limits = tuple(
        _bucket(
            t, reply.outcome(shown[id(t)], shown_limit(t.check)), reply.now_us,
            _unit(t, plan, declared),
        )
        for t in listed
    )  # fmt: skip
    tenant = facts.identity.tenant if facts.identity is not None else None
    return CallerStatus(plan.name, tenant, limits)


def _unit(check: TierCheck, plan: Plan, declared: dict[str, str | None]) -> str:
    """What a bucket counts: requests on the rate tiers, requests in flight on a
    concurrency bucket, and on a resource's bucket its plan's unit, else its decorator's,
    else requests (as a 429 names it)."""
    if check.tier is Tier.CONCURRENT:
        return IN_FLIGHT
    if check.tier in _REQUEST_TIERS or not check.resource:
        return DEFAULT_UNIT
    return plan.unit_for(check.resource, declared.get(check.resource))


def _bucket(check: TierCheck, outcome: Outcome, now_us: int, unit: str) -> BucketStatus:
    return BucketStatus(
        check.tier.value,
        check.resource,
        check.name,
        outcome.limit,
        max(0, outcome.remaining),
        seconds_until(outcome.reset_us, now_us),
        check.check.rate.window,
        unit,
    )
