"""The decision pipeline without Flask: request facts in, a decision or a denial out.

The extension gathers the facts of a request (its method, endpoint, the remote
address's tag, the identity, the view's limit, cost and key owner) and hands
them to ``Enforcer.decide``; after the response it hands back what the view
charged or refused to ``Enforcer.settle``. Everything between (plans, routes,
keys, the one storage call, blocks, signals, metrics) happens here, so a test
can drive a whole decision with plain objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .algorithms import Outcome
from .checks import Check
from .errors import CallerBlocked, QuotaExceeded, QuotaUnavailable
from .generations import Generations
from .identity import Identity
from .keys import KeyBuilder
from .plans import Plan, PlanCatalog
from .policy import Decision, LimitSpec, Policy, TierCheck, TierResult
from .reply import LocalReply, Reply
from .route import Route, build_route
from .tiers import Tier
from .validators import is_count

__all__ = [
    "Decided",
    "DecisionObserver",
    "Enforcer",
    "Events",
    "Facts",
    "Guard",
    "limit_hooks",
]

ROUTES = 4096  # routes per generation of the route cache
RouteKey = tuple[int, str | None, str, int, bool, bool]

# What ``DecisionObserver.unavailable`` is told: the storage could not answer, and
# the fail mode refused the request (closed) or let it through (open).
FAIL_CLOSED, FAIL_OPEN = "fail_closed", "fail_open"


@dataclass(frozen=True, slots=True)
class Facts:
    """What the decision needs to know about one request."""

    method: str
    endpoint: str | None
    ip_tag: str  # the remote address's tag (``keys.remote_ip_tag``)
    identity: Identity | None  # None: anonymous, keyed by ``ip_tag``
    spec: LimitSpec | None = None  # the view's ``@quota.limit``, if it applies
    cost: int = 1  # the endpoint tier's cost, already evaluated
    owner: str | None = None  # the ``key=`` callable's answer: the endpoint bucket's owner


@dataclass(slots=True)  # not frozen: one is made per request, and frozen costs twice
class Decided:
    """A decided request: what its response headers (and, when it passed, its
    settlement) need."""

    route: Route
    reply: Reply
    keys: list[str]
    tag: str  # the caller's tag (an identity's, or the address's when anonymous)
    spec: LimitSpec | None

    def decision(self) -> Decision:
        return self.route.decision(self.reply)[1]


class Guard(Protocol):
    """The storage as the enforcer calls it: behind the fail mode and the breaker
    (``storage.failover.GuardedStorage``)."""

    def decide_flat(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply | None: ...

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None: ...

    def charge(self, checks: Sequence[Check]) -> None: ...


class DecisionObserver(Protocol):
    """Told about every decided request (the Prometheus metrics are one)."""

    def watching(self) -> bool:
        """True when this request's decision is wanted (asked once per request): an
        observer that says no costs the request nothing more."""

    def stored(self, seconds: float) -> None:
        """The storage call took ``seconds``."""

    def unavailable(self, tiers: Sequence[TierCheck], plan: str, outcome: str) -> None:
        """The storage could not answer: ``FAIL_CLOSED`` (refused) or ``FAIL_OPEN``."""

    def decided(self, decision: Decision, *, local: bool, blocked: bool) -> None:
        """A decision was made (``local``: by the in-process fallback)."""

    def near_limit(self, decision: Decision, result: TierResult) -> None:
        """The request took ``result``'s bucket across ``QUOTA_NEAR_LIMIT``."""


class Events(Protocol):
    """Told when a request is denied, or a shadow tier would have denied it."""

    def exceeded(self, decision: Decision) -> None: ...

    def shadow_exceeded(self, decision: Decision) -> None: ...

    def near_limit(self, decision: Decision, result: TierResult) -> None: ...


def limit_hooks(
    spec: LimitSpec | None, endpoint: str | None
) -> tuple[LimitSpec | None, int, str | None]:
    """(the limit, its cost, its key owner) with the view's callables evaluated and
    checked: a ``key`` answering None means the limit does not apply to the request."""
    if spec is None:
        return None, 1, None
    owner = None
    if spec.key is not None:
        owner = spec.key()
        if owner is None:
            return None, 1, None  # "no org on this request"
        if not isinstance(owner, str) or not owner:
            raise TypeError(f"key callable of {endpoint!r} returned {owner!r}, not a str (or None)")
    weight = spec.cost
    if not callable(weight):
        return spec, weight, owner  # an int, checked by @quota.limit
    cost = weight()
    if not is_count(cost):
        raise TypeError(f"cost callable of {endpoint!r} returned {cost!r}, not an int >= 0")
    return spec, cost, owner


class Enforcer:
    """Decides requests for one app: all tiers in one storage call, all-or-nothing.

    ``catalog()`` gives the plans in force (the SQL snapshot); ``refusal`` builds a
    blocked caller's 429 from its gate; ``escalate`` counts a denial towards
    ``QUOTA_BLOCK_AFTER`` and returns the new block, if any; ``near`` is
    ``QUOTA_NEAR_LIMIT``, the share of a bucket whose crossing is reported.
    """

    def __init__(
        self,
        *,
        guard: Guard,
        policy: Policy,
        catalog: Callable[[], PlanCatalog],
        anonymous_plan: str,
        default_plan: str,
        refusal: Callable[[Decision, Outcome, str], CallerBlocked] | None = None,
        escalate: Callable[[str], Outcome | None] | None = None,
        events: Events | None = None,
        observer: DecisionObserver | None = None,
        near: float | None = None,
    ) -> None:
        self.guard = guard
        self.policy = policy
        self.catalog = catalog
        self.anonymous_plan = anonymous_plan
        self.default_plan = default_plan
        self.refusal = refusal or (lambda decision, gate, _key: CallerBlocked(decision, gate))
        self.escalate = escalate
        self.events = events
        self.observer = observer
        self.near = near
        # (id(plan), endpoint, method, cost, limited?) -> Route, for the catalog in
        # ``routes_of``; a new catalog (a plan or override change) empties it.
        self.routes: Generations[RouteKey, Route] = Generations(ROUTES)
        self.routes_of: PlanCatalog | None = None

    # -- deciding ---------------------------------------------------------------

    def decide(
        self, facts: Facts, keep: Callable[[Decided], object] | None = None
    ) -> Decided | None:
        """Charge every tier of the request, or none; ``None`` when no tier applies or
        the storage failed open. Raises ``QuotaExceeded`` (``CallerBlocked`` for a
        blocked caller) when a tier denies, ``QuotaUnavailable`` failing closed.

        ``keep`` is handed the decided request before a denial is raised (not a
        block's), so that the 429 still gets its rate-limit headers."""
        catalog = self.catalog()
        tag, plan, tenant = self.caller(catalog, facts)
        spec = facts.spec
        resource = (spec.resource or facts.endpoint) if spec is not None else None
        route = self.route(
            catalog, plan, facts.endpoint, facts.method, spec, resource, facts.cost,
            tenant=tenant is not None,
        )  # fmt: skip
        if not route.tiers:
            return None
        if route.billed is not None and facts.identity is not None:
            # A calendar month is on the route: the caller's own billing day, if any.
            day = catalog.billing_day(facts.identity.id)
            if day is not None and 1 <= day <= 31:
                route = route.on_billing_day(day)
        owner = KeyBuilder.key_tag(facts.owner) if facts.owner is not None else tag
        # The caller's block gate is read in the same storage call as its tiers (and its
        # tenant's bucket in the same call too: all-or-nothing across them).
        keys = route.keys(facts.ip_tag, tag, owner, tenant or "")
        observer = self.observer
        if observer is not None and not observer.watching():
            observer = None
        if observer is not None:
            reply = self._ask(route, keys, plan, observer)
        else:
            reply = self._call(route, keys)
        if reply is None:  # storage down, failing open
            return None
        decided = Decided(route, reply, keys, tag, spec)
        # Only an admitted request was charged, so only it can cross the near-limit line.
        crossed = route.crossings(reply) if reply.all_allowed else None
        if not crossed and reply.all_allowed and not route.shadow and observer is None:
            return decided  # nothing to signal or count: the usual case
        blocked, decision = route.decision(reply)
        if observer is not None:
            observer.decided(decision, local=type(reply) is LocalReply, blocked=blocked is not None)
        if crossed:
            self._near(decision, crossed, observer)
        if blocked is not None:
            raise self.refusal(decision, blocked, keys[0])
        if keep is not None:
            keep(decided)
        if self.events is not None and decision.shadow_denied:
            self.events.shadow_exceeded(decision)
        denied = decision.denied
        if denied is None:
            return decided
        if self.events is not None:
            self.events.exceeded(decision)
        if self.escalate is not None:
            block = self.escalate(tag)
            if block is not None:
                # Blocked now: by this denial, or meanwhile by anyone (an operator too),
                # so what the block says is read, as at the gate.
                raise self.refusal(decision, block, keys[0])
        resource_name = denied.resource if denied.resource == resource else None
        upgrade = catalog.upgrade_hint(plan.name, denied.tier, resource_name)
        unit = plan.unit_for(resource_name, spec.unit if spec is not None else None)
        raise QuotaExceeded(decision, upgrade=upgrade, cost=facts.cost, unit=unit)

    def _call(self, route: Route, keys: list[str]) -> Reply | None:
        reply = self.guard.decide_flat(route.calls, keys)
        if reply is None or type(reply) is Reply:
            return reply
        return LocalReply(reply) if isinstance(reply, LocalReply) else Reply(reply)

    def caller(self, catalog: PlanCatalog, facts: Facts) -> tuple[str, Plan, str | None]:
        """(the caller's tag, its plan with its overrides, its tenant's tag when the
        plan has a tenant tier) for a request's ``facts``."""
        identity = facts.identity
        if identity is None:
            plan = catalog.resolve(self.anonymous_plan, None, fallback=self.default_plan)
            return facts.ip_tag, plan, None
        plan_name = identity.plan or self.default_plan
        plan = catalog.resolve(
            plan_name, identity.id, fallback=self.default_plan, tenant=identity.tenant
        )
        tenant = None
        if identity.tenant is not None and plan.tenant_rate is not None:
            tenant = KeyBuilder.tenant_tag(identity.tenant)
        return KeyBuilder.identity_tag(identity.id), plan, tenant

    def _near(
        self, decision: Decision, crossed: list[int], observer: DecisionObserver | None
    ) -> None:
        """Tell of each bucket this request took across ``QUOTA_NEAR_LIMIT``."""
        for i in crossed:
            result = decision.results[i]
            if observer is not None:
                observer.near_limit(decision, result)
            if self.events is not None:
                self.events.near_limit(decision, result)

    def _ask(
        self, route: Route, keys: list[str], plan: Plan, observer: DecisionObserver
    ) -> Reply | None:
        """``_call``, timed and told to the observer, failures included."""
        start = time.perf_counter()
        try:
            reply = self._call(route, keys)
        except QuotaUnavailable:
            observer.stored(time.perf_counter() - start)
            observer.unavailable(route.tier_checks(keys), plan.name, FAIL_CLOSED)
            raise
        observer.stored(time.perf_counter() - start)
        if reply is None:
            observer.unavailable(route.tier_checks(keys), plan.name, FAIL_OPEN)
        return reply

    # -- after the response -----------------------------------------------------

    def settle(self, decided: Decided, *, counted: bool = True, extra: int = 0) -> Decision:
        """After an admitted response: refund it when it is not ``counted`` (its
        ``charge_when`` said no), else charge the ``extra`` units the view added
        (``quota.charge``). One storage call at most; the decision the headers show."""
        decision = decided.decision()
        checks = decided.route.tier_checks(decided.keys)
        if not counted:
            # Its cost comes back, and anything it charged on top is void. A shadow
            # check that would have denied was not charged: nothing to give back.
            refund = [
                c.check
                for c, r in zip(checks, decision.results, strict=True)
                if c.tier is Tier.ENDPOINT and r.outcome.allowed
            ]
            if refund and refund[0].cost > 0:
                self.guard.refund(refund, decision.now_us)
                return decision.adjusted(refund[0].cost, refund[0].algorithm)
            return decision
        if extra:
            charges = self.policy.endpoint_checks(checks, extra)
            self.guard.charge(charges)
            return decision.adjusted(-extra, charges[0].algorithm) if charges else decision
        return decision

    # -- routes -------------------------------------------------------------------

    def route(
        self,
        catalog: PlanCatalog,
        plan: Plan,
        endpoint: str | None,
        method: str,
        spec: LimitSpec | None,
        resource: str | None,
        cost: int,
        *,
        tenant: bool = False,
    ) -> Route:
        """The request's ``Route``, built on first use (``plan`` comes from ``catalog``);
        ``tenant``: the caller has a tenant and the plan a tenant tier."""
        if catalog is not self.routes_of:
            self.routes.clear()
            self.routes_of = catalog
        key = (id(plan), endpoint, method, cost, spec is None, tenant)
        found = self.routes.current.get(key)
        if found is None or found.plan is not plan:  # the entry holds its plan: ids stay unique
            found = self._new_route(catalog, key, plan, spec, resource)
        return found

    def _new_route(
        self,
        catalog: PlanCatalog,
        key: RouteKey,
        plan: Plan,
        spec: LimitSpec | None,
        resource: str | None,
    ) -> Route:
        """A route missing from the current generation: the retired one's, else made.

        Plans re-resolved per client (overrides) and costs from a callable can outnumber
        any bound: the cache keeps what is in use (see ``Generations``). A route of
        another cost is derived from the cost-1 route, which shares all but the checks.
        """
        found = self.routes.recall(key)
        if found is None or found.plan is not plan:
            _, endpoint, method, cost, _, tenant = key
            if cost == 1:
                found = build_route(
                    self.policy, plan, method=method, spec=spec, resource=resource, cost=1,
                    tenant=tenant, near=self.near,
                )  # fmt: skip
            else:
                unit = self.route(catalog, plan, endpoint, method, spec, resource, 1, tenant=tenant)
                found = unit.costing(cost)
            self.routes.put(key, found)
        return found
