"""Which tiers apply to a request, and what the storage said about them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .algorithms import Algorithm, Gate, Outcome, bucket_ceiling, unfit
from .calendar import Calendar
from .checks import Check
from .clock import seconds_until
from .generations import Generations
from .keys import KeyBuilder, Tag
from .leases import lease_key
from .plans import ENFORCED, LimitMode, Plan
from .priority import Priority, class_limits
from .rates import Credits, Rate, Rates
from .reply import Reply
from .tiers import Tier
from .validators import MAX_SLOTS

__all__ = [
    "ANY_METHOD",
    "SHADOW_DENIED",
    "Decision",
    "LimitSpec",
    "Policy",
    "TierCheck",
    "TierResult",
    "gate_check",
    "policy_name",
]

log = logging.getLogger("flask_quota")

# A tier's outcome as the dashboard's usage counts it: True allowed, False denied, or
# SHADOW_DENIED for a shadow tier that would have denied.
SHADOW_DENIED = "shadow_denied"
Mark = bool | str

# A gate has no rate, but a Check carries one; this constant one also keys the deny cache.
_GATE_RATE = Rate(1, 1)

# Results the rate-limit headers never describe: slots held and a prepaid balance.
_NOT_RATED = (Tier.CONCURRENT, Tier.CAPACITY, Tier.CREDITS)

# The method part of an endpoint key when one bucket serves every method.
ANY_METHOD = "*"
_GLOBAL, _TENANT, _USER = (Tier.GLOBAL.value, ""), (Tier.TENANT.value, ""), (Tier.USER.value, "")


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """What ``@quota.limit`` recorded on a view (or a blueprint)."""

    rate: Rates | None
    resource: str | None
    cost: int | Callable[[], int]
    key: Callable[[], str | None] | None = None  # the endpoint bucket's owner (not the caller)
    per_method: bool = True  # False: one bucket for every method
    charge_when: Callable[[Any], bool] | None = None  # False for a response: refund it
    exempt_when: Callable[[], bool] | None = None  # True: the endpoint tier does not apply
    concurrent: int | None = None  # requests in flight at once, per caller (or key owner)
    # A callable rate: its answer (a rate string, or several) is this request's ``rate``.
    rate_of: Callable[[], object] | None = None
    error_message: str | Callable[[], str] | None = None  # the 429's ``detail`` when it denies
    stacked: bool = False  # one of several on its view (``state.named``): its route says which
    # A callable rate's answers -> this limit with those rates (see ``enforcer.rated``).
    rated: Generations[object, LimitSpec] = field(
        default_factory=lambda: Generations(64), init=False, compare=False, repr=False
    )
    unit: str | None = None  # what the resource counts ("tokens"); a plan's unit wins
    priority: Priority | None = None  # the route's class (``priority=``); None: default
    # How long a caller may wait for room (``delay=`` on a view, ``wait=`` on
    # ``quota.limited``), microseconds: within it, a cost is reserved, not refused.
    wait_us: int = 0

    def method_of(self, method: str) -> str:
        """The method part of this limit's key: ``HEAD`` is ``GET`` without a body."""
        if not self.per_method:
            return ANY_METHOD
        return "GET" if method == "HEAD" else method


@dataclass(frozen=True, slots=True)
class TierCheck:
    tier: Tier
    name: str  # the policy name in headers: "global", "user", the resource, or NAME@W
    check: Check
    resource: str | None = None  # the endpoint tier's resource


def on_billing_day(tiers: tuple[TierCheck, ...], day: int) -> tuple[TierCheck, ...]:
    """``tiers`` with their calendar months starting on ``day`` (a caller's own billing
    day) instead of ``QUOTA_BILLING_DAY``."""
    return tuple(
        TierCheck(t.tier, t.name, replace(c, calendar=c.calendar.on_day(day)), t.resource)
        if c.calendar is not None
        else t
        for t in tiers
        for c in (t.check,)
    )


@dataclass(frozen=True, slots=True)
class TierResult:
    tier: Tier
    name: str
    rate: Rate
    outcome: Outcome
    resource: str | None = None
    shadow: bool = False  # a shadow tier: decided and recorded, never denies

    @property
    def shadow_denied(self) -> bool:
        """True for a shadow tier that would have denied."""
        return self.shadow and not self.outcome.allowed


@dataclass(frozen=True, slots=True)
class Decision:
    """Every tier's outcome for one request.

    Shadow tiers' results are in ``results`` (and ``shadow_denied``), but never
    in ``allowed``, ``denied``, ``closest`` or the headers built from them.
    """

    plan: str
    results: tuple[TierResult, ...]
    now_us: int

    @property
    def enforced(self) -> tuple[TierResult, ...]:
        """The results of the tiers that may deny (every tier but the shadow ones)."""
        return tuple(r for r in self.results if not r.shadow)

    @property
    def rated(self) -> tuple[TierResult, ...]:
        """The enforced results of rates: what the rate-limit headers describe (a
        concurrency limit is not a rate, it has headers of its own)."""
        return tuple(r for r in self.results if not r.shadow and r.tier not in _NOT_RATED)

    @property
    def allowed(self) -> bool:
        """True when every enforced tier allowed the request."""
        return all(r.outcome.allowed or r.shadow for r in self.results)

    def _pick(
        self,
        rule: Callable[[Reply, list[int]], int],
        *,
        leases: bool = False,
        capacity: bool = False,
    ) -> TierResult | None:
        """The enforced result that ``Reply``'s rule ``rule`` picks (one home for it),
        among the rates and, with ``leases``, the concurrency limits too; with
        ``capacity``, the fleet's capacity alone."""
        among = [
            i
            for i, r in enumerate(self.results)
            if not r.shadow
            and (
                r.tier is Tier.CAPACITY
                if capacity
                else r.tier is not Tier.CAPACITY
                # a balance is no rate: among the denials (with leases), never "closest"
                and (leases or (r.tier is not Tier.CONCURRENT and r.tier is not Tier.CREDITS))
            )
        ]
        if not among:
            return None
        reply = Reply.of(self.now_us, self.allowed, (r.outcome for r in self.results))
        found = rule(reply, among)
        return self.results[found] if found >= 0 else None

    @property
    def denied(self) -> TierResult | None:
        """The denying (enforced) tier that makes the caller wait longest; the fleet's
        capacity only when no tier of the caller's denied (then the request is shed)."""
        return self._pick(Reply.denied, leases=True) or self._pick(Reply.denied, capacity=True)

    @property
    def shadow_denied(self) -> tuple[TierResult, ...]:
        """The shadow tiers that would have denied this request (they did not)."""
        return tuple(r for r in self.results if r.shadow and not r.outcome.allowed)

    @property
    def closest(self) -> TierResult | None:
        """The enforced rate nearest its limit: fewest remaining; ties go to the latest reset."""
        return self._pick(Reply.closest)

    @property
    def shown(self) -> TierResult | None:
        """The tier the rate-limit headers describe: ``denied``, else ``closest``."""
        return self._pick(Reply.shown)

    def adjusted(self, deltas: Sequence[int], algorithms: Sequence[Algorithm | Gate]) -> Decision:
        """This decision with ``deltas[i]`` units more room on result ``i`` (a refund is
        positive, a charge after the fact negative; ``algorithms[i]`` is its check's),
        for the response headers.

        A token bucket's reset moves by the units' worth of time, at most to where a
        charge's debt is bounded (``bound_debt``); a window's stays, but for a window
        left empty, which is full now (as ``peek`` would say).
        """
        results = []
        for r, delta, algorithm in zip(self.results, deltas, algorithms, strict=True):
            if delta and algorithm is Gate.CREDITS:  # a balance has no limit to stop at
                r = replace(r, outcome=r.outcome._replace(remaining=r.outcome.remaining + delta))
            elif delta:
                o = r.outcome
                reset = o.reset_us
                remaining = min(o.limit, o.remaining + delta)
                if algorithm is Algorithm.TOKEN_BUCKET:
                    interval = r.rate.interval_us
                    reset = max(self.now_us, reset - delta * interval)
                    reset = min(reset, bucket_ceiling(r.rate, self.now_us))
                elif remaining == o.limit:
                    reset = self.now_us
                outcome = o._replace(remaining=remaining, reset_us=reset)
                r = replace(r, outcome=outcome)
            results.append(r)
        return Decision(self.plan, tuple(results), self.now_us)

    def usage_outcomes(self) -> list[tuple[str, Mark]]:
        """(tier name, outcome) to count: every tier if admitted, else the denying
        ones; the outcome is True (allowed), False (denied) or ``SHADOW_DENIED``
        for a shadow tier that would have denied (counted either way)."""
        if self.allowed:
            return [(r.name, SHADOW_DENIED if r.shadow_denied else True) for r in self.results]
        return [
            (r.name, SHADOW_DENIED if r.shadow else False)
            for r in self.results
            if not r.outcome.allowed
        ]

    def usage_units(self, metered: Sequence[tuple[str, int]]) -> dict[str, int] | None:
        """The units each resource's tier counts on the dashboard's charts (``metered``:
        (resource, units) of the request, its tokens), by tier name; None when every
        one is 1, the usual request."""
        if all(n == 1 for _, n in metered):
            return None
        units = dict(metered)
        return {
            r.name: units[r.resource]
            for r in self.results
            if r.resource in units and (r.tier is Tier.ENDPOINT or r.tier is Tier.CREDITS)
        }

    def seconds_until(self, at_us: int) -> int:
        """Whole seconds from now until ``at_us``, rounded up."""
        return seconds_until(at_us, self.now_us)

    def __str__(self) -> str:
        """One line for logs and signal receivers: which limit decided, e.g.
        ``denied by endpoint 'ai_inference': 5 per 60 s on plan 'free', retry in 12 s``
        (the wait is the response's ``Retry-After``), or ``allowed on plan 'free'; closest:
        user, 97 of 100 left``. ``repr()`` still shows every field."""
        denied = self.denied
        if denied is not None:
            o = denied.outcome
            retry = max(1, self.seconds_until(self.now_us + o.retry_after_us))
            if denied.tier is Tier.CREDITS:
                return f"denied by {_label(denied)}: balance {o.remaining} on plan {self.plan!r}"
            if denied.tier is Tier.CONCURRENT:
                return (
                    f"denied by {_label(denied)}: {o.limit} in flight on plan {self.plan!r}, "
                    f"retry in {retry} s"
                )
            return (
                f"denied by {_label(denied)}: {o.limit} per "
                f"{denied.rate.calendar or f'{denied.rate.policy_window} s'} "
                f"on plan {self.plan!r}, retry in {retry} s"
            )
        text = f"allowed on plan {self.plan!r}"
        closest = self.closest
        if closest is not None:
            o = closest.outcome
            text += f"; closest: {_label(closest)}, {max(0, o.remaining)} of {o.limit} left"
        if self.shadow_denied:
            names = ", ".join(_label(r) for r in self.shadow_denied)
            text += f"; shadow {names} would have denied"
        return text


def _label(result: TierResult) -> str:
    """``user``, ``global``, ``tenant``, ``endpoint 'ai_inference'``, ``user 'user@86400'``."""
    tier = result.tier.value
    return tier if result.name == tier else f"{tier} {result.name!r}"


def gate_check(keys: KeyBuilder, tag: str) -> Check:
    """The check that denies while the caller ``tag`` is blocked (see ``blocks``); it
    charges nothing and rides along with every decision of the caller's."""
    return Check(keys.block_key(tag), Gate.BLOCK, _GATE_RATE, 0)


def policy_name(name: str, rates: Rates, index: int) -> str:
    """The ``RateLimit-Policy`` name of a limit's ``index``-th rate.

    The first (or only) rate keeps the limit's name; each further one is
    ``NAME@W`` with ``W`` its window in seconds (``search@86400``).
    """
    return name if index == 0 else f"{name}@{rates[index].window}"


class Policy:
    """Turns (plan, caller, endpoint) into storage checks; no Flask here."""

    def __init__(
        self,
        keys: KeyBuilder,
        algorithm: Algorithm,
        *,
        shadow: bool = False,
        calendar: Calendar | None = None,
        lease_seconds: int = 60,
        capacity: int | None = None,
        reserve: Mapping[Priority, float] | None = None,
    ) -> None:
        self.keys = keys
        # QUOTA_CAPACITY shared out by QUOTA_RESERVE: the fleet's requests in flight below
        # which each class is admitted (``core.priority.class_limits``); None: no check.
        self.capacity: dict[Priority, int] | None = None
        if capacity is not None:
            self.capacity = class_limits(capacity, reserve or {})
        self.lease_seconds = lease_seconds  # QUOTA_LEASE_SECONDS: a lease's longest life
        self.algorithm = algorithm  # QUOTA_ALGORITHM: a limit without its own algorithm
        self.shadow = shadow  # QUOTA_SHADOW: every tier is a shadow tier
        # QUOTA_TIMEZONE and QUOTA_BILLING_DAY: where N/month and N/year windows start.
        self.calendar = calendar or Calendar()
        self._told: set[tuple[Rates, Algorithm]] = set()  # unfit limits already logged

    def _algorithm(self, mode: LimitMode, rates: Rates, name: str) -> Algorithm:
        """The limit's algorithm, or a sliding counter where a log would not fit.

        Configuration refuses an unfit limit (``plans.check_fit``), but some reach
        this point unchecked: a decorator's literal rate (the decorator cannot know
        ``QUOTA_ALGORITHM``), a row written into SQL. Redis must never decide on an
        oversized log, so such a limit is logged once and counted on a sliding counter.
        """
        algorithm = mode.algorithm or self.algorithm
        if algorithm is not Algorithm.SLIDING_WINDOW_LOG:
            return algorithm
        reasons = [reason for rate in rates if (reason := unfit(algorithm, rate))]
        if not reasons:
            return algorithm
        if (rates, algorithm) not in self._told and len(self._told) < 1000:
            self._told.add((rates, algorithm))
            log.error(
                "flask-quota: limit %r: %s; it is enforced on sliding_window_counter",
                name, reasons[0],
            )  # fmt: skip
        return Algorithm.SLIDING_WINDOW_COUNTER

    def checks(
        self,
        plan: Plan,
        *,
        ip_tag: str | None,
        identity_tag: str,
        method: str,
        spec: LimitSpec | None,
        resource: str | None,
        cost: int,
        endpoint_tag: str | None = None,
        tenant_tag: str | None = None,
        more: Sequence[tuple[LimitSpec, str, int, str | None]] = (),
        priority: Priority | None = None,
    ) -> list[TierCheck]:
        """The global, tenant, user and endpoint checks that apply, in that order; one
        per rate. ``more`` are the further limits stacked on the view, each (spec,
        resource, cost, endpoint_tag): their endpoint checks follow the first's. Then
        the concurrency leases, and last, with a ``priority`` and ``QUOTA_CAPACITY``,
        the fleet's capacity for that class.

        ``cost`` weighs the endpoint tier only: the global, tenant and user tiers count
        requests, the endpoint tier counts the work a request asks for.
        ``endpoint_tag`` (from ``key=``) owns the endpoint bucket instead of the caller;
        ``tenant_tag`` (``KeyBuilder.tenant_tag``) is the caller's tenant, if it has one.
        ``ip_tag`` None leaves the per-IP global tier out (a network operators allowed).
        """
        checks = self._caller_checks(plan, ip_tag, identity_tag, 1, tenant_tag)
        if spec is not None and resource is not None:
            tag = identity_tag if endpoint_tag is None else endpoint_tag
            self._endpoint_checks(
                checks, plan, tag, method, resource, spec, cost, resource, identity_tag
            )
        for limit, name, weight, owner in more:
            tag = identity_tag if owner is None else owner
            self._endpoint_checks(
                checks, plan, tag, method, name, limit, weight, name, identity_tag
            )
        self._lease_checks(checks, plan, identity_tag, spec, resource, endpoint_tag, 1)
        for limit, name, _, owner in more:  # a stacked limit's own concurrent=
            if limit.concurrent is not None:
                tag = identity_tag if owner is None else owner
                self._limit_lease(checks, tag, name, limit.concurrent, 1)
        if priority is not None and self.capacity is not None:
            check = Check(
                lease_key(self.keys.capacity_key()), Gate.CAPACITY,
                Rate(self.capacity[priority], self.lease_seconds), 1, self.shadow,
            )  # fmt: skip
            checks.append(TierCheck(Tier.CAPACITY, "capacity", check))
        return checks

    def endpoint_tier(
        self, plan: Plan, tag: str, resource: str, spec: LimitSpec
    ) -> list[TierCheck]:
        """One limit's checks alone, for ``tag``'s bucket of ``resource`` (every method):
        ``quota.limited``, which has no caller tiers. ``spec.cost`` is an int here."""
        checks: list[TierCheck] = []
        cost = spec.cost if isinstance(spec.cost, int) else 1
        self._endpoint_checks(checks, plan, tag, ANY_METHOD, resource, spec, cost, resource)
        return checks

    def inspection_checks(
        self,
        plan: Plan,
        tag: str,
        endpoints: list[tuple[str, str, LimitSpec]],
        tenant_tag: str | None = None,
    ) -> list[TierCheck]:
        """Cost-0 checks over every bucket of one identity (``tag``): for peeking
        at usage and for resets. The global tier is per IP, so it is included
        only when the tag is an IP's; the tenant tier only with ``tenant_tag``.
        ``endpoints`` are (method, resource, spec); a limit with ``key=`` is not
        the caller's bucket and is left out.
        """
        ip_tag = tag if Tag(tag).is_ip else None
        checks = self._caller_checks(plan, ip_tag, tag, 0, tenant_tag)
        for method, resource, spec in endpoints:
            if spec.key is None:
                name = f"{resource} ({method})"
                self._endpoint_checks(checks, plan, tag, method, resource, spec, 0, name)
        self._lease_checks(checks, plan, tag, None, None, None, 0)
        seen = set()
        for _, resource, spec in endpoints:
            if spec.key is None and spec.concurrent is not None and resource not in seen:
                seen.add(resource)  # one set per resource, whatever the methods
                self._limit_lease(checks, tag, resource, spec.concurrent, 0)
        return checks

    def tenant_checks(self, plan: Plan, tenant_tag: str) -> list[TierCheck]:
        """Cost-0 checks over a tenant's own bucket (its tenant tier): to peek or reset it."""
        checks: list[TierCheck] = []
        self._tenant_checks(checks, plan, tenant_tag, 0)
        return checks

    def _tenant_checks(
        self, checks: list[TierCheck], plan: Plan, tenant_tag: str, cost: int
    ) -> None:
        rates = plan.tenant_rate
        if rates is not None:
            mode = plan.modes.get(_TENANT, ENFORCED) if plan.modes else ENFORCED
            algorithm = self._algorithm(mode, rates, "tenant")
            key = self.keys.tenant_key(tenant_tag, algorithm)
            self._each_rate(checks, Tier.TENANT, "tenant", key, rates, cost, None, mode, algorithm)

    def _caller_checks(
        self, plan: Plan, ip_tag: str | None, tag: str, cost: int, tenant_tag: str | None = None
    ) -> list[TierCheck]:
        checks: list[TierCheck] = []
        rates = plan.global_rate
        if rates is not None and ip_tag is not None:
            mode = plan.modes.get(_GLOBAL, ENFORCED) if plan.modes else ENFORCED
            algorithm = self._algorithm(mode, rates, "global")
            key = self.keys.global_key(ip_tag, algorithm)
            if len(rates) == 1 and mode is ENFORCED:  # the common case, without the loop
                check = self._check(key, algorithm, rates[0], cost, self.shadow)
                checks.append(TierCheck(Tier.GLOBAL, "global", check))
            else:
                self._each_rate(
                    checks, Tier.GLOBAL, "global", key, rates, cost, None, mode, algorithm
                )
        if tenant_tag is not None:
            self._tenant_checks(checks, plan, tenant_tag, cost)
        rates = plan.user_rate
        if rates is not None:
            mode = plan.modes.get(_USER, ENFORCED) if plan.modes else ENFORCED
            algorithm = self._algorithm(mode, rates, "user")
            key = self.keys.user_key(tag, algorithm)
            if len(rates) == 1 and mode is ENFORCED:
                check = self._check(key, algorithm, rates[0], cost, self.shadow)
                checks.append(TierCheck(Tier.USER, "user", check))
            else:
                self._each_rate(checks, Tier.USER, "user", key, rates, cost, None, mode, algorithm)
        return checks

    def _endpoint_checks(
        self,
        checks: list[TierCheck],
        plan: Plan,
        tag: str,
        method: str,
        resource: str,
        spec: LimitSpec,
        cost: int,
        name: str,
        caller: str | None = None,
    ) -> None:
        """Append the endpoint tier's checks; the plan's rates for ``resource`` win
        over the decorator's literal rates (which are enforced on ``QUOTA_ALGORITHM``).
        A credits resource is one balance check, of ``caller`` (the identity's tag, not a
        ``key=`` owner's: credits are granted to callers), else of ``tag``."""
        rates = plan.resources.get(resource)
        mode = plan.mode_for(Tier.ENDPOINT, resource) if rates else ENFORCED
        rates = rates or spec.rate
        if rates is None:
            return
        if isinstance(rates, Credits):  # a prepaid balance, the caller's (core/credits.py)
            key = self.keys.credits_key(caller or tag, resource)
            check = Check(key, Gate.CREDITS, rates[0], cost, mode.shadow or self.shadow)
            checks.append(TierCheck(Tier.CREDITS, name, check, resource))
            return
        algorithm = self._algorithm(mode, rates, resource)
        key = self.keys.endpoint_key(tag, spec.method_of(method), resource, algorithm)
        self._each_rate(
            checks, Tier.ENDPOINT, name, key, rates, cost, resource, mode, algorithm, spec.wait_us
        )

    def _lease_checks(
        self,
        checks: list[TierCheck],
        plan: Plan,
        tag: str,
        spec: LimitSpec | None,
        resource: str | None,
        owner_tag: str | None,
        cost: int,
    ) -> None:
        """Append the concurrency limits: the plan's (per caller, every endpoint), then
        the limit's ``concurrent=`` (per caller, or ``key=`` owner, and resource).
        ``cost`` 1 takes a slot, 0 only looks (inspection)."""
        if plan.concurrent is not None:
            check = self._lease(self.keys.lease_key(tag), plan.concurrent, cost)
            checks.append(TierCheck(Tier.CONCURRENT, Tier.CONCURRENT.value, check))
        if spec is not None and spec.concurrent is not None and resource is not None:
            owner = tag if owner_tag is None else owner_tag
            self._limit_lease(checks, owner, resource, spec.concurrent, cost)

    def _limit_lease(
        self, checks: list[TierCheck], owner: str, resource: str, slots: int, cost: int
    ) -> None:
        """Append a limit's ``concurrent=``: one set per owner and resource, every method."""
        check = self._lease(self.keys.lease_key(owner, resource), slots, cost)
        checks.append(TierCheck(Tier.CONCURRENT, f"concurrent ({resource})", check, resource))

    def _lease(self, set_key: str, slots: int, cost: int) -> Check:
        """A lease check: ``slots`` held at most, each for ``QUOTA_LEASE_SECONDS`` at most.
        Every way in refuses more than ``MAX_SLOTS``; a row written into SQL by hand is
        held to it too, as its count must stay an ordinary rate."""
        rate = Rate(min(slots, MAX_SLOTS), self.lease_seconds)
        return Check(lease_key(set_key), Gate.LEASE, rate, cost, self.shadow)

    def _each_rate(
        self,
        checks: list[TierCheck],
        tier: Tier,
        name: str,
        key: str,
        rates: Rates,
        cost: int,
        resource: str | None,
        mode: LimitMode,
        algorithm: Algorithm,
        wait_us: int = 0,
    ) -> None:
        """One check per rate; a further rate's key and name carry its window. A shadow
        check never makes its caller wait (it never denies either)."""
        shadow = mode.shadow or self.shadow
        wait_us = 0 if shadow else wait_us
        for i, rate in enumerate(rates):
            rate_key = key if i == 0 else f"{key}@{rate.window}"
            check = self._check(rate_key, algorithm, rate, cost, shadow, wait_us)
            checks.append(TierCheck(tier, policy_name(name, rates, i), check, resource))

    def _check(
        self, key: str, algorithm: Algorithm, rate: Rate, cost: int, shadow: bool, wait_us: int = 0
    ) -> Check:
        """A rate's check: a calendar rate is a fixed window on the policy's calendar,
        whatever the limit's algorithm (a month has no meaning to a token bucket), and
        never reserves (its next window is too far away for any wait)."""
        if rate.calendar is None:
            return Check(key, algorithm, rate, cost, shadow, None, wait_us)
        return Check(key, Algorithm.FIXED_WINDOW, rate, cost, shadow, self.calendar)
