"""The decision pipeline without Flask: request facts in, a decision or a denial out.

The extension gathers the facts of a request (its method, endpoint, the remote
address's tag, the identity, the view's limit, cost and key owner) and hands
them to ``Enforcer.decide``; after the response it hands back what the view
charged or refused to ``Enforcer.settle``. Everything between (plans, routes,
keys, the one storage call, blocks, signals, metrics) happens here, so a test
can drive a whole decision with plain objects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from . import leases
from .algorithms import Outcome
from .checks import Check
from .credits import SEED
from .errors import (
    CallerBlocked,
    CreditsExhausted,
    QuotaExceeded,
    QuotaUnavailable,
    RequestShed,
    upgrade_for,
)
from .facts import Facts, Limit
from .generations import Generations
from .keys import KeyBuilder
from .plans import Plan, PlanCatalog
from .policy import Decision, LimitSpec, Policy, TierCheck, TierResult
from .priority import Priority
from .reply import HeldReply, LocalReply, Reply
from .route import Route, build_route
from .tiers import Tier

__all__ = ["Decided", "DecisionObserver", "Enforcer", "Events", "Guard", "counted_by", "kept_units"]

log = logging.getLogger("flask_quota")

ROUTES = 4096  # routes per generation of the route cache
# (plan id, endpoint, method, cost, no limit?, tenant?, shape): ``shape`` is None for a
# view with one literal-rate limit (the endpoint says which), else its limits and costs.
# A request of a class (overload protection's fleet capacity) adds its priority. A request
# from an allowed network (``Facts.allowed``) adds its priority (or None) and True: its
# route has no global tier, and its key's length keeps it apart from every other's.
RouteKey = (
    tuple[int, str | None, str, int, bool, bool, object]
    | tuple[int, str | None, str, int, bool, bool, object, Priority]
    | tuple[int, str | None, str, int, bool, bool, object, Priority | None, bool]
)

# What ``DecisionObserver.unavailable`` is told: the storage could not answer, and
# the fail mode refused the request (closed) or let it through (open).
FAIL_CLOSED, FAIL_OPEN = "fail_closed", "fail_open"


@dataclass(slots=True)  # not frozen: one is made per request, and frozen costs twice
class Decided:
    """A decided request: what its response headers (and, when it passed, its
    settlement) need."""

    route: Route
    reply: Reply
    keys: list[str]
    tag: str  # the caller's tag (an identity's, or the address's when anonymous)
    spec: LimitSpec | None
    more: tuple[LimitSpec, ...] = ()  # a stacked view's further limits (``Facts.more``)
    # Endpoint tiers (indexes into the decision's results) its admission took across
    # the near-limit line: told once the response says what the request was charged
    # (``Enforcer.settle``, ``Enforcer.done``); None when none did.
    near: list[int] | None = None
    caller: str | None = None  # the identity's id: whose prepaid balances the route spends

    def decision(self) -> Decision:
        return self.route.decision(self.reply)[1]

    def limit_of(self, resource: str | None) -> LimitSpec | None:
        """The limit whose endpoint check has ``resource`` (a stacked view's are distinct)."""
        for spec in self.more:
            if spec.resource == resource:
                return spec
        return self.spec


class Guard(Protocol):
    """The storage as the enforcer calls it: behind the fail mode and the breaker
    (``storage.failover.GuardedStorage``)."""

    def decide_flat(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply | None: ...

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None: ...

    def charge(self, checks: Sequence[Check]) -> None: ...

    def release(self, checks: Sequence[Check], *, local: bool) -> None: ...


class CreditBook(Protocol):
    """The prepaid balances' SQL side, as the enforcer calls it (``flask_quota.credits``).
    Each item is (storage key, the caller's identity id, resource)."""

    def seed(self, items: Sequence[tuple[str, str, str]]) -> None:
        """Put each balance, rebuilt from SQL, where the storage holds none."""

    def spent(self, items: Sequence[tuple[str, str, str]]) -> None:
        """These balances changed: checkpoint them (within the sync interval)."""


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

    def shed(self, priority: Priority, reason: str, *, shadow: bool) -> None:
        """A request of class ``priority`` was shed (``reason``: ``capacity`` or ``queue``),
        or would have been (``shadow``: ``QUOTA_SHADOW``, it was served)."""


class Events(Protocol):
    """Told when a request is denied, or a shadow tier would have denied it, or shed."""

    def exceeded(self, decision: Decision) -> None: ...

    def shadow_exceeded(self, decision: Decision) -> None: ...

    def near_limit(self, decision: Decision, result: TierResult) -> None: ...

    def shed(self, priority: Priority, reason: str, *, shadow: bool) -> None: ...


def kept_units(cost: int, *, kept: bool, actual: int | None, extra: int) -> int:
    """What an endpoint limit finally charges a request admitted at ``cost``: nothing
    when its ``charge_when`` said no (``kept`` False), else ``actual`` (``quota.settle``)
    or the cost, plus ``extra`` (``quota.charge``). ``settle`` and the ledger agree by it."""
    if not kept:
        return 0
    return (actual if actual is not None else cost) + extra


def counted_by(
    counted: Callable[[LimitSpec], bool], decided: Decided, resource: str | None
) -> bool:
    """``counted``'s answer for the limit of ``resource``, an endpoint check of ``decided``
    (the settlement's and the ledger's one rule)."""
    spec = decided.limit_of(resource)
    return spec is None or counted(spec)


_OWN_LIMITS = (Tier.ENDPOINT, Tier.CONCURRENT, Tier.CREDITS)  # a denial a view's limit owns


def _unseeded(route: Route, reply: Reply) -> Reply:
    """``reply`` with each seed mark (``credits.SEED``) made a plain refusal (a wait of 0),
    so that the denial is found like any other (a negative wait would never be)."""
    for i in route.credits:
        if not reply.allowed(i) and reply.outcome(i, 0).retry_after_us == SEED:
            reply.set_retry(i, 0)
    return reply


def _priority_of(facts: Facts | None) -> Priority:
    """The class of the request ``facts`` describe (``default`` when it has none)."""
    found = facts.priority if facts is not None else None
    return found if found is not None else Priority.DEFAULT


def _denying(facts: Facts | None, denied: TierResult) -> tuple[LimitSpec | None, int]:
    """The limit that denied (None: a plan's tier) and its cost; a limit's own
    ``concurrent=`` denial is that limit's too."""
    if facts is None:
        return None, 1
    if denied.tier not in _OWN_LIMITS or denied.resource is None:
        return None, facts.cost
    for spec, cost, _ in facts.more:
        if spec.resource == denied.resource:
            return spec, cost
    return facts.spec, facts.cost


def error_detail(spec: LimitSpec | None, endpoint: str | None) -> str | None:
    """The ``error_message=`` of the limit that denied, evaluated; None: the default."""
    message = spec.error_message if spec is not None else None
    if message is None or isinstance(message, str):
        return message
    text = message()
    if not isinstance(text, str):
        raise TypeError(f"error_message callable of {endpoint!r} returned {text!r}, not a str")
    return text


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
        alerts: tuple[float, ...] = (),
        credits: CreditBook | None = None,
    ) -> None:
        self.guard = guard
        self.credits = credits  # prepaid balances: seeded from and checkpointed to SQL
        self.policy = policy
        self.catalog = catalog
        self.anonymous_plan = anonymous_plan
        self.default_plan = default_plan
        self.refusal = refusal or (lambda decision, gate, _key: CallerBlocked(decision, gate))
        self.escalate = escalate
        self.events = events
        self.observer = observer
        self.near = near
        self.alerts = alerts  # QUOTA_ALERTS: each route knows its crossing lines
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
        more = facts.more
        priority = facts.priority if self.policy.capacity is not None else None
        route = self.route(
            catalog, plan, facts.endpoint, facts.method, spec, resource, facts.cost,
            tenant=tenant is not None, more=more, priority=priority, allowed=facts.allowed,
        )  # fmt: skip
        if not route.tiers:
            return None
        if route.billed is not None:
            # A calendar month is on the route: the caller's own billing day, if any.
            day = self.billing_day(catalog, facts)
            if day is not None:
                route = route.on_billing_day(day)
        owner = KeyBuilder.key_tag(facts.owner) if facts.owner is not None else tag
        # The caller's block gate is read in the same storage call as its tiers (and its
        # tenant's bucket in the same call too: all-or-nothing across them).
        if more:  # a stacked view: each further limit's key owner has a tag of its own
            owners = tuple(KeyBuilder.key_tag(o) if o is not None else "" for _, _, o in more)
            keys = route.keys_of((facts.ip_tag, tag, owner, tenant or "", *owners))
        else:
            keys = route.keys(facts.ip_tag, tag, owner, tenant or "")
        if route.held:  # this request's own member in its lease sets (core/leases.py)
            member = leases.new_member()
            if facts.priority is not None:  # its class first: the dashboard counts them
                member = facts.priority.value[0] + member
            for i in route.held:
                keys[i] += member
        observer = self.observer  # ``watching()``, inlined: the request path's one ask
        if observer is not None and not observer.watching():
            observer = None
        if observer is not None:
            reply = self.ask(route.calls, keys, lambda: route.tier_checks(keys), plan, observer)
        else:
            reply = self._call(route.calls, keys)
        if reply is None:  # storage down, failing open
            return None
        caller = facts.identity.id if facts.identity is not None else None
        if route.credits:  # prepaid balances: seeded when the storage holds none
            reply = self._credited(route, reply, keys, caller)
            if reply is None:
                return None
        decided = Decided(
            route, reply, keys, tag, spec, tuple(s for s, _, _ in more) if more else (),
            caller=caller,
        )  # fmt: skip
        admitted = reply.all_allowed
        # Only an admitted request was charged, so only it can cross the near-limit line.
        crossed = route.crossings(reply) if admitted and route.lines else None
        if crossed:
            # An endpoint tier's charge may still change after the response (settle,
            # charge, charge_when): its crossing is told then, on the final charge.
            tiers = route.tiers
            later = [i for i in crossed if tiers[i].tier is Tier.ENDPOINT]
            if later:
                decided.near = later
                crossed = [i for i in crossed if tiers[i].tier is not Tier.ENDPOINT]
        if not crossed and admitted and not route.shadow and observer is None:
            return decided  # nothing to signal or count: the usual case
        blocked, decision = route.decision(reply)
        return self.conclude(
            catalog, plan, decision, facts, tag=tag, gate=blocked, gate_key=keys[0],
            observer=observer, local=type(reply) is LocalReply, decided=decided, keep=keep,
            crossed=crossed,
        )  # fmt: skip

    def _credited(
        self, route: Route, reply: Reply, keys: list[str], caller: str | None
    ) -> Reply | None:
        """``reply`` for a route that spends prepaid balances: asked again once after
        seeding those the storage did not hold (lost with the counters, or never used),
        and noted for the checkpoint when admitted. An anonymous caller has no balance:
        its request is refused (402, balance 0). The in-process fallback cannot decide a
        balance (each worker would spend a copy of it): 503 while the storage is down."""
        if type(reply) is LocalReply:
            raise QuotaUnavailable(1)
        book = self.credits
        if book is None or caller is None:
            return _unseeded(route, reply)
        if not reply.all_allowed:
            missing = [
                (keys[i], caller, route.tiers[i - 1].resource or "")
                for i in route.credits
                if reply.outcome(i, 0).retry_after_us == SEED
            ]
            if not missing:
                return reply
            try:
                book.seed(missing)
            except Exception as exc:  # SQL or the storage away: the balance is unknown
                log.warning("flask-quota: a prepaid balance could not be rebuilt (%s)", exc)
                raise QuotaUnavailable(1) from None
            again = self._call(route.calls, keys)
            if again is None:
                return None
            if type(again) is LocalReply:
                raise QuotaUnavailable(1)
            reply = _unseeded(route, again)  # lost again meanwhile: refused, balance 0
        if reply.all_allowed:
            book.spent(self._balances(route, keys, caller))
        return reply

    @staticmethod
    def _balances(route: Route, keys: Sequence[str], caller: str) -> list[tuple[str, str, str]]:
        """(key, caller, resource) of each prepaid balance ``route`` spends."""
        return [(keys[i], caller, route.tiers[i - 1].resource or "") for i in route.credits]

    def conclude(
        self,
        catalog: PlanCatalog,
        plan: Plan,
        decision: Decision,
        facts: Facts | None,
        *,
        tag: str | None,
        gate: Outcome | None = None,
        gate_key: str = "",
        observer: DecisionObserver | None,
        local: bool = False,
        decided: Decided | None = None,
        keep: Callable[[Decided], object] | None = None,
        crossed: list[int] | None = None,
    ) -> Decided | None:
        """The tail of every decision (a request's, ``quota.limited``'s, the status
        view's): the observer is told (metrics, spans), a blocked caller is refused
        (``gate``, its block gate's denial, read at ``gate_key``), a shadow denial and
        a denial are signalled, and a denial counts towards ``QUOTA_BLOCK_AFTER`` for
        ``tag`` (None: no caller to block) and raises ``QuotaExceeded``. ``facts`` name
        the limits whose denial it may be (their ``error_message``, cost and unit).
        ``decided`` is returned when nothing denied; ``keep`` is handed it before a
        denial is raised. ``crossed``: the results whose near-limit line the request
        crossed, told here."""
        if observer is not None:
            observer.decided(decision, local=local, blocked=gate is not None)
        if crossed:
            self._near(decision, crossed, observer)
        if gate is not None:
            raise self.refusal(decision, gate, gate_key)
        if keep is not None and decided is not None:
            keep(decided)
        if decision.shadow_denied:
            if self.events is not None:
                self.events.shadow_exceeded(decision)
            for result in decision.shadow_denied:
                if result.tier is Tier.CAPACITY:  # QUOTA_SHADOW: a shed, told and served
                    self.shed(_priority_of(facts), "capacity", shadow=True, observer=observer)
        denied = decision.denied
        if denied is None:
            return decided
        if denied.tier is Tier.CAPACITY:  # no tier of the caller's denied: the fleet is full
            self.shed(
                _priority_of(facts), "capacity", limit=denied.outcome.limit,
                decision=decision, observer=observer,
            )  # fmt: skip
        if self.events is not None:
            self.events.exceeded(decision)
        # Waiting for a slot is what a concurrency denial asks (Retry-After: 1), so it
        # never counts towards QUOTA_BLOCK_AFTER.
        # Nor does a spent balance: waiting does not refill it.
        if (
            self.escalate is not None
            and tag is not None
            and denied.tier is not Tier.CONCURRENT
            and denied.tier is not Tier.CREDITS
        ):
            block = self.escalate(tag)
            if block is not None:
                # Blocked now: by this denial, or meanwhile by anyone (an operator too),
                # so what the block says is read, as at the gate.
                raise self.refusal(decision, block, gate_key)
        limit, cost = _denying(facts, denied)
        metered = denied.tier is Tier.ENDPOINT or denied.tier is Tier.CREDITS
        resource_name = denied.resource if metered else None
        upgrade = upgrade_for(
            catalog, plan, denied.tier, denied.resource if denied.tier is Tier.CONCURRENT
            else resource_name,
        )  # fmt: skip
        unit = plan.unit_for(resource_name, limit.unit if limit is not None else None)
        detail = error_detail(limit, facts.endpoint if facts is not None else None)
        error = CreditsExhausted if denied.tier is Tier.CREDITS else QuotaExceeded
        raise error(decision, upgrade=upgrade, cost=cost, detail=detail, unit=unit)

    def shed(
        self,
        priority: Priority,
        reason: str,
        *,
        limit: int | None = None,
        decision: Decision | None = None,
        shadow: bool = False,
        observer: DecisionObserver | None = None,
    ) -> None:
        """Shed a request of class ``priority`` (``reason``: ``capacity`` or ``queue``):
        the signal and the metrics are told, and ``RequestShed`` (503) is raised; with
        ``shadow`` (``QUOTA_SHADOW``) it is only told and logged, and the request served.
        ``observer``: the decision's, when it is already asked (else asked here)."""
        if observer is None:
            observer = self.watching()
        if observer is not None:
            observer.shed(priority, reason, shadow=shadow)
        if self.events is not None:
            self.events.shed(priority, reason, shadow=shadow)
        if shadow:
            log.info("flask-quota: shadow mode: a %s request would have been shed (%s)",
                     priority.value, reason)  # fmt: skip
            return
        raise RequestShed(reason, priority.value, limit=limit, decision=decision)

    def billing_day(self, catalog: PlanCatalog, facts: Facts | None) -> int | None:
        """The caller's own billing day (an SQL client's), which its calendar months
        start on instead of ``QUOTA_BILLING_DAY``; None for none (or an invalid one)."""
        identity = facts.identity if facts is not None else None
        if identity is None:
            return None
        day = catalog.billing_day(identity.id)
        return day if day is not None and 1 <= day <= 31 else None

    def _call(self, calls: Sequence[Check], keys: Sequence[str]) -> Reply | None:
        reply = self.guard.decide_flat(calls, keys)
        if reply is None or type(reply) is Reply or type(reply) is HeldReply:
            return reply  # ours already: no copy
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

    def ask(
        self,
        calls: Sequence[Check],
        keys: Sequence[str],
        tiers: Callable[[], Sequence[TierCheck]],
        plan: Plan,
        observer: DecisionObserver | None,
    ) -> Reply | None:
        """The storage's reply for ``calls`` on ``keys`` (None: failing open), timed and
        told to ``observer`` when one watches, failures included (``tiers()``: what
        could not be decided)."""
        if observer is None:
            return self._call(calls, keys)
        start = time.perf_counter()
        try:
            reply = self._call(calls, keys)
        except QuotaUnavailable:
            observer.stored(time.perf_counter() - start)
            observer.unavailable(tiers(), plan.name, FAIL_CLOSED)
            raise
        observer.stored(time.perf_counter() - start)
        if reply is None:
            observer.unavailable(tiers(), plan.name, FAIL_OPEN)
        return reply

    def watching(self) -> DecisionObserver | None:
        """The observer, when it wants this decision (asked once per decision)."""
        observer = self.observer
        return observer if observer is not None and observer.watching() else None

    # -- after the response -----------------------------------------------------

    def settle(
        self,
        decided: Decided,
        *,
        counted: bool | Callable[[LimitSpec], bool] = True,
        extra: int = 0,
        actual: int | None = None,
    ) -> Decision:
        """After an admitted response: make each endpoint-tier charge what it should be,
        in one refund and one charge call at most. A limit not ``counted`` (its
        ``charge_when`` said no; a bool for every limit, or asked per limit) costs
        nothing. Else ``actual`` (``quota.settle``), when given, replaces the admitted
        cost, and the ``extra`` units (``quota.charge``) come on top. Less is refunded
        as ``charge_when``'s refund is (against the charge's own time, so others'
        charges meanwhile stay intact); more is charged, into debt if need be.
        Returns the decision the headers show.

        The endpoint tiers that this request's final charge took across the near-limit
        line are told now: judged from the bucket its admission saw, by what it was
        charged in the end (a settlement is its own request's; another request settling
        the same bucket meanwhile is not seen, so such a crossing may be told twice or
        not at all)."""
        decision = decided.decision()
        checks = decided.route.tier_checks(decided.keys)
        refunds: list[Check] = []
        charges: list[Check] = []
        room = [0] * len(checks)  # per result: the units of room the correction gives
        for i, (t, result) in enumerate(zip(checks, decision.results, strict=True)):
            if t.tier is not Tier.ENDPOINT and t.tier is not Tier.CREDITS:
                continue
            keep = (
                counted if isinstance(counted, bool) else counted_by(counted, decided, t.resource)
            )
            # A shadow check that would have denied was not charged: only extras reach it.
            allowed = result.outcome.allowed
            charged = t.check.cost if allowed else 0
            target = kept_units(charged, kept=keep, actual=actual if allowed else None, extra=extra)
            c = t.check
            if target < charged:
                refunds.append(Check(c.key, c.algorithm, c.rate, charged - target, c.shadow,
                                     c.calendar))  # fmt: skip
            elif target > charged:
                charges.append(Check(c.key, c.algorithm, c.rate, target - charged, c.shadow,
                                     c.calendar))  # fmt: skip
            room[i] = charged - target
        if refunds:
            # A delayed request's charge was made for the time it was admitted at.
            self.guard.refund(refunds, decision.now_us + decided.reply.wait_us())
        if charges:
            self.guard.charge(charges)
        route = decided.route
        if route.credits and (refunds or charges) and self.credits and decided.caller is not None:
            self.credits.spent(self._balances(route, decided.keys, decided.caller))
        settled = decision
        if refunds or charges:
            settled = decision.adjusted(room, [t.check.algorithm for t in checks])
        lines = decided.route.rooms
        if lines and (refunds or charges):
            crossed = [
                i
                for i, (t, result) in enumerate(zip(checks, decision.results, strict=True))
                if t.tier is Tier.ENDPOINT
                and result.outcome.allowed
                # what was left after it, finally, against before it: across the line?
                and settled.results[i].outcome.remaining
                <= lines[i]
                < result.outcome.remaining + t.check.cost
            ]
            decided.near = None
            if crossed:
                self._near(settled, crossed, self.watching())
        elif decided.near is not None:
            self.done(decided)
        return settled

    def done(self, decided: Decided) -> None:
        """After a response whose charge stayed as admitted: tell the near-limit crossings
        its admission made on endpoint tiers (see ``Decided.near``)."""
        crossed, decided.near = decided.near, None
        if crossed:
            self._near(decided.decision(), crossed, self.watching())

    def release(self, decided: Decided) -> None:
        """Give back the leases an admitted request holds: one storage call, after its
        response closed (or its teardown). To the in-process fallback when it took them
        (fail mode ``local``); a release that fails is lost and the lease expires."""
        checks = decided.route.lease_checks(decided.keys)
        self.guard.release(checks, local=type(decided.reply) is LocalReply)

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
        more: tuple[Limit, ...] = (),
        priority: Priority | None = None,
        allowed: bool = False,
    ) -> Route:
        """The request's ``Route``, built on first use (``plan`` comes from ``catalog``);
        ``tenant``: the caller has a tenant and the plan a tenant tier; ``more``: a
        stacked view's further limits (``Facts.more``); ``priority``: the request's class
        (the fleet's capacity check, ``QUOTA_CAPACITY``); ``allowed``: the caller's
        network is allowed, so the route has no global tier (``Facts.allowed``)."""
        if catalog is not self.routes_of:
            self.routes.clear()
            self.routes_of = catalog
        shape = None  # a view's one literal-rate limit: the endpoint and cost say all
        if more or (spec is not None and (spec.rate_of is not None or spec.stacked)):
            shape = (spec, tuple((s, c) for s, c, _ in more))  # rates and costs of each
        key: RouteKey
        if allowed:  # keyed apart: never served to a request that has the global tier
            key = (id(plan), endpoint, method, cost, spec is None, tenant, shape, priority, True)
        elif priority is None:
            key = (id(plan), endpoint, method, cost, spec is None, tenant, shape)
        else:
            key = (id(plan), endpoint, method, cost, spec is None, tenant, shape, priority)
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
            _, endpoint, method, cost, _, tenant, shape = key[:7]
            priority = key[7] if len(key) > 7 else None
            allowed = len(key) > 8  # an allowed network's route: no global tier
            if shape is not None:  # stacked limits or a callable rate: built as they are
                found = build_route(
                    self.policy, plan, method=method, spec=spec, resource=resource, cost=cost,
                    tenant=tenant, near=self.near, more=shape[1],  # type: ignore[index]
                    priority=priority, alerts=self.alerts, allowed=allowed,
                )  # fmt: skip
            elif cost == 1:
                found = build_route(
                    self.policy, plan, method=method, spec=spec, resource=resource, cost=1,
                    tenant=tenant, near=self.near, priority=priority, alerts=self.alerts,
                    allowed=allowed,
                )  # fmt: skip
            else:
                unit = self.route(
                    catalog, plan, endpoint, method, spec, resource, 1, tenant=tenant,
                    priority=priority, allowed=allowed,
                )  # fmt: skip
                found = unit.costing(cost)
            self.routes.put(key, found)
        return found
