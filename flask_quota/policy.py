"""Which tiers apply to a request, and what the storage said about them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .algorithms import Algorithm, Outcome
from .clock import seconds_until
from .keys import KeyBuilder
from .plans import Plan
from .rates import Rate
from .storage import Check, Verdict
from .tiers import Tier

__all__ = ["Decision", "LimitSpec", "Policy", "TierCheck", "TierResult"]

@dataclass(frozen=True, slots=True)
class LimitSpec:
    """What ``@quota.limit`` recorded on a view."""

    rate: Rate | None
    resource: str | None
    cost: int | Callable[[], int]


@dataclass(frozen=True, slots=True)
class TierCheck:
    tier: Tier
    name: str  # the policy name in headers: "global", "user" or the resource
    check: Check


@dataclass(frozen=True, slots=True)
class TierResult:
    tier: Tier
    name: str
    rate: Rate
    outcome: Outcome


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
            TierResult(c.tier, c.name, c.check.rate, o)
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

    def usage_outcomes(self) -> list[tuple[str, bool]]:
        """(tier name, allowed) to count: every tier if admitted, else the denying ones."""
        if self.allowed:
            return [(r.name, True) for r in self.results]
        return [(r.name, False) for r in self.results if not r.outcome.allowed]

    def seconds_until(self, at_us: int) -> int:
        """Whole seconds from now until ``at_us``, rounded up."""
        return seconds_until(at_us, self.now_us)


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
    ) -> list[TierCheck]:
        """The global, user and endpoint checks that apply, in that order.

        ``cost`` weighs the endpoint tier only: the global and user tiers count
        requests, the endpoint tier counts the work a request asks for.
        """
        checks = self._caller_checks(plan, ip_tag, identity_tag, 1)
        if spec is not None and resource is not None:
            check = self._endpoint_check(plan, identity_tag, method, resource, spec, cost, resource)
            if check is not None:
                checks.append(check)
        return checks

    def inspection_checks(
        self,
        plan: Plan,
        tag: str,
        endpoints: list[tuple[str, str, LimitSpec]],
    ) -> list[TierCheck]:
        """Cost-0 checks over every bucket of one identity (``tag``): for peeking
        at usage and for resets. The global tier is per IP, so it is included
        only when the tag is an IP's. ``endpoints`` are (method, resource, spec).
        """
        checks = self._caller_checks(plan, tag if tag.startswith("ip=") else None, tag, 0)
        for method, resource, spec in endpoints:
            name = f"{resource} ({method})"
            check = self._endpoint_check(plan, tag, method, resource, spec, 0, name)
            if check is not None:
                checks.append(check)
        return checks

    def _caller_checks(
        self, plan: Plan, ip_tag: str | None, tag: str, cost: int
    ) -> list[TierCheck]:
        algorithm, checks = self.algorithm, []
        if plan.global_rate is not None and ip_tag is not None:
            key = self.keys.global_key(ip_tag, algorithm)
            check = Check(key, algorithm, plan.global_rate, cost)
            checks.append(TierCheck(Tier.GLOBAL, "global", check))
        if plan.user_rate is not None:
            key = self.keys.user_key(tag, algorithm)
            checks.append(TierCheck(Tier.USER, "user", Check(key, algorithm, plan.user_rate, cost)))
        return checks

    def _endpoint_check(
        self,
        plan: Plan,
        tag: str,
        method: str,
        resource: str,
        spec: LimitSpec,
        cost: int,
        name: str,
    ) -> TierCheck | None:
        """The plan's rate for ``resource`` wins over the decorator's literal rate."""
        rate = plan.resources.get(resource) or spec.rate
        if rate is None:
            return None
        key = self.keys.endpoint_key(tag, method, resource, self.algorithm)
        return TierCheck(Tier.ENDPOINT, name, Check(key, self.algorithm, rate, cost))
