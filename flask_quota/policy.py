"""Which tiers apply to a request, and what the storage said about them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .algorithms import Algorithm, Outcome
from .clock import seconds_until
from .keys import KeyBuilder
from .plans import Plan
from .rates import Rate, Rates
from .storage import Check, Verdict
from .tiers import Tier

__all__ = [
    "ANY_METHOD",
    "Decision",
    "LimitSpec",
    "Policy",
    "TierCheck",
    "TierResult",
    "policy_name",
]

# The method part of an endpoint key when one bucket serves every method.
ANY_METHOD = "*"


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """What ``@quota.limit`` recorded on a view (or a blueprint)."""

    rate: Rates | None
    resource: str | None
    cost: int | Callable[[], int]
    key: Callable[[], str] | None = None  # the endpoint bucket's owner, instead of the caller
    per_method: bool = True  # False: one bucket for every method
    charge_when: Callable[[Any], bool] | None = None  # False for a response: refund it
    exempt_when: Callable[[], bool] | None = None  # True: the endpoint tier does not apply

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


@dataclass(frozen=True, slots=True)
class TierResult:
    tier: Tier
    name: str
    rate: Rate
    outcome: Outcome
    resource: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """Every tier's outcome for one request."""

    plan: str
    results: tuple[TierResult, ...]
    now_us: int

    @classmethod
    def from_verdict(cls, plan: str, checks: list[TierCheck], verdict: Verdict) -> Decision:
        """Pair each check with the storage's outcome for it."""
        results = tuple(
            TierResult(c.tier, c.name, c.check.rate, o, c.resource)
            for c, o in zip(checks, verdict.outcomes, strict=True)
        )
        return cls(plan, results, verdict.now_us)

    @property
    def allowed(self) -> bool:
        """True when every tier allowed the request."""
        return all(r.outcome.allowed for r in self.results)

    @property
    def denied(self) -> TierResult | None:
        """The denying tier that makes the caller wait longest."""
        denied = [r for r in self.results if not r.outcome.allowed]
        return max(denied, key=lambda r: r.outcome.retry_after_us) if denied else None

    @property
    def closest(self) -> TierResult | None:
        """The tier nearest its limit: fewest remaining; ties go to the latest reset."""
        if not self.results:
            return None
        return min(self.results, key=lambda r: (r.outcome.remaining, -r.outcome.reset_us))

    def adjusted(self, delta: int, algorithm: Algorithm) -> Decision:
        """This decision with ``delta`` units more room on the endpoint tier (a refund
        is positive, a charge after the fact negative), for the response headers.

        A token bucket's reset moves by the units' worth of time; a window's stays.
        """
        results = []
        for r in self.results:
            if r.tier is Tier.ENDPOINT:
                o = r.outcome
                reset = o.reset_us
                if algorithm is Algorithm.TOKEN_BUCKET:
                    interval = r.rate.window_us // r.rate.limit
                    reset = max(self.now_us, reset - delta * interval)
                outcome = replace(o, remaining=min(o.limit, o.remaining + delta), reset_us=reset)
                r = replace(r, outcome=outcome)
            results.append(r)
        return Decision(self.plan, tuple(results), self.now_us)

    def usage_outcomes(self) -> list[tuple[str, bool]]:
        """(tier name, allowed) to count: every tier if admitted, else the denying ones."""
        if self.allowed:
            return [(r.name, True) for r in self.results]
        return [(r.name, False) for r in self.results if not r.outcome.allowed]

    def seconds_until(self, at_us: int) -> int:
        """Whole seconds from now until ``at_us``, rounded up."""
        return seconds_until(at_us, self.now_us)


def policy_name(name: str, rates: Rates, index: int) -> str:
    """The ``RateLimit-Policy`` name of a limit's ``index``-th rate.

    The first (or only) rate keeps the limit's name; each further one is
    ``NAME@W`` with ``W`` its window in seconds (``search@86400``).
    """
    return name if index == 0 else f"{name}@{rates[index].window}"


class Policy:
    """Turns (plan, caller, endpoint) into storage checks; no Flask here."""

    def __init__(self, keys: KeyBuilder, algorithm: Algorithm) -> None:
        self.keys = keys
        self.algorithm = algorithm

    def checks(
        self,
        plan: Plan,
        *,
        ip_tag: str,
        identity_tag: str,
        method: str,
        spec: LimitSpec | None,
        resource: str | None,
        cost: int,
        endpoint_tag: str | None = None,
    ) -> list[TierCheck]:
        """The global, user and endpoint checks that apply, in that order; one per rate.

        ``cost`` weighs the endpoint tier only: the global and user tiers count
        requests, the endpoint tier counts the work a request asks for.
        ``endpoint_tag`` (from ``key=``) owns the endpoint bucket instead of the caller.
        """
        checks = self._caller_checks(plan, ip_tag, identity_tag, 1)
        if spec is not None and resource is not None:
            tag = identity_tag if endpoint_tag is None else endpoint_tag
            self._endpoint_checks(checks, plan, tag, method, resource, spec, cost, resource)
        return checks

    def endpoint_checks(self, checks: list[TierCheck], cost: int) -> list[Check]:
        """The endpoint tier's checks among ``checks``, each weighing ``cost``."""
        return [
            Check(c.check.key, c.check.algorithm, c.check.rate, cost)
            for c in checks
            if c.tier is Tier.ENDPOINT
        ]

    def inspection_checks(
        self,
        plan: Plan,
        tag: str,
        endpoints: list[tuple[str, str, LimitSpec]],
    ) -> list[TierCheck]:
        """Cost-0 checks over every bucket of one identity (``tag``): for peeking
        at usage and for resets. The global tier is per IP, so it is included
        only when the tag is an IP's. ``endpoints`` are (method, resource, spec);
        a limit with ``key=`` is not the caller's bucket and is left out.
        """
        checks = self._caller_checks(plan, tag if tag.startswith("ip=") else None, tag, 0)
        for method, resource, spec in endpoints:
            if spec.key is None:
                name = f"{resource} ({method})"
                self._endpoint_checks(checks, plan, tag, method, resource, spec, 0, name)
        return checks

    def _caller_checks(
        self, plan: Plan, ip_tag: str | None, tag: str, cost: int
    ) -> list[TierCheck]:
        algorithm, checks = self.algorithm, []
        rates = plan.global_rate
        if rates is not None and ip_tag is not None:
            key = self.keys.global_key(ip_tag, algorithm)
            if len(rates) == 1:  # the common case, without the loop
                check = Check(key, algorithm, rates[0], cost)
                checks.append(TierCheck(Tier.GLOBAL, "global", check))
            else:
                self._each_rate(checks, Tier.GLOBAL, "global", key, rates, cost, None)
        rates = plan.user_rate
        if rates is not None:
            key = self.keys.user_key(tag, algorithm)
            if len(rates) == 1:
                checks.append(TierCheck(Tier.USER, "user", Check(key, algorithm, rates[0], cost)))
            else:
                self._each_rate(checks, Tier.USER, "user", key, rates, cost, None)
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
    ) -> None:
        """Append the endpoint tier's checks; the plan's rates for ``resource`` win
        over the decorator's literal rates."""
        rates = plan.resources.get(resource) or spec.rate
        if rates is None:
            return
        key = self.keys.endpoint_key(tag, spec.method_of(method), resource, self.algorithm)
        self._each_rate(checks, Tier.ENDPOINT, name, key, rates, cost, resource)

    def _each_rate(
        self,
        checks: list[TierCheck],
        tier: Tier,
        name: str,
        key: str,
        rates: Rates,
        cost: int,
        resource: str | None,
    ) -> None:
        """One check per rate; a further rate's key and name carry its window."""
        algorithm = self.algorithm
        for i, rate in enumerate(rates):
            rate_key = key if i == 0 else f"{key}@{rate.window}"
            check = Check(rate_key, algorithm, rate, cost)
            checks.append(TierCheck(tier, policy_name(name, rates, i), check, resource))
