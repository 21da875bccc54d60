"""A request's shape: everything about its checks that does not depend on the caller.

For one (plan, endpoint, method, cost, with or without a tenant, from a network operators
allowed or not: then without the global tier) the tiers, rates,
algorithms, the block gate, the storage's encoded arguments and the constant parts
of the headers are always the same; only the caller's tags in the keys change. A
``Route`` holds them, built once by ``Policy.checks`` itself (with placeholders for
the tags, so its keys are exactly the policy's), and a request does a cache lookup
plus one concatenation per key. The storage answers a flat ``Reply``; the ``Decision``
objects are made from it only when something needs them (a denial, a shadow
tier, metrics, ``quota.current_decision()``, the dashboard's usage).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .algorithms import Outcome
from .checks import Check, keyed, shown_limit
from .clock import US
from .headers import (
    CONCURRENCY_LIMIT,
    CONCURRENCY_REMAINING,
    CREDITS_BALANCE,
    CREDITS_RESOURCE,
    LIMIT,
    POLICY,
    RATELIMIT,
    REMAINING,
    RESET,
    RESOURCE,
    HeaderMode,
    policy_header,
    printable,
    sf_string,
)
from .near import room
from .plans import Plan
from .policy import (
    Decision,
    LimitSpec,
    Policy,
    TierCheck,
    TierResult,
    gate_check,
    on_billing_day,
)
from .priority import Priority
from .reply import Reply
from .tiers import Tier

__all__ = ["Route", "build_route", "metered"]

# Stand-ins for the caller's tags while a route's keys are built: a NUL never occurs
# in a tag (``escape`` percent-encodes it), so each key splits at exactly one of them.
_MARKS = ("\x00ip\x00", "\x00who\x00", "\x00key\x00", "\x00tenant\x00")
# Which tag a key takes: the IP's, the caller's, a key= owner's, the caller's tenant's.
IP, WHO, KEY, TENANT = range(4)


# ``QUOTA_HEADERS`` modes as module constants: read per request, and on Python 3.11 a
# member read through its class (``HeaderMode.NONE``) runs ``EnumType.__getattr__``'s
# slow path, about ten times a global's cost.
_NO_HEADERS, _IETF, _LEGACY = HeaderMode.NONE, HeaderMode.IETF, HeaderMode.LEGACY
_OPEN_GATE = Outcome(True, 0, 0, 0, 0)  # a block gate letting by (``settled_headers``)
_NOT_RATES = (Tier.CONCURRENT, Tier.CAPACITY)  # slots held, not rates: not in the headers
# Not rates either: slots held and a prepaid balance (which has headers of its own).
_NOT_SHOWN = (*_NOT_RATES, Tier.CREDITS)
_CHARGED = (Tier.ENDPOINT, Tier.CREDITS)  # the tiers a request's cost weighs on


def _owner_mark(n: int) -> str:
    """The stand-in for the key= owner of a stacked view's ``n``-th further limit; its
    tag is the ``TENANT + n``-th (see ``Route.keys_of``)."""
    return f"\x00key{n}\x00"


_OWNER_RE = re.compile("\x00key([0-9]+)\x00")


class Route:
    """The checks of one (plan, endpoint, method, cost) with the caller left out.

    ``calls`` (the block gate first, then one check per tier and rate) is what the
    storage decides; its keys are templates, the request's come from ``keys()``.
    The tuple is reused by every request of the route, so a backend may cache its
    encoding by identity. ``costing()`` derives the route of another cost.
    """

    __slots__ = ("alert_lines", "alerts", "billed", "calls", "credits", "enforced", "held",
                 "labels", "leases", "limit_texts", "limits", "lines", "metered", "names", "parts",
                 "plan", "policy", "rooms", "shadow", "shown_among", "tiers")  # fmt: skip

    def __init__(
        self,
        plan: Plan,
        tiers: Sequence[TierCheck],
        gate: Check,
        near: float | None = None,
        alerts: tuple[float, ...] = (),
    ) -> None:
        self.plan = plan
        self.tiers = tuple(tiers)
        self.calls: tuple[Check, ...] = (gate, *(t.check for t in tiers))
        self.parts = tuple(_split(c.key) for c in self.calls)
        # billing day -> this route on it; None when no check follows the calendar.
        self.billed: dict[int, Route] | None = (
            {} if any(c.calendar is not None for c in self.calls) else None
        )
        self.shadow = any(c.shadow for c in self.calls)  # then a shadow denial may need a signal
        # What the headers show, per tier; only enforced (non-shadow) rates are shown.
        self.enforced = tuple(
            i for i, t in enumerate(tiers) if not t.check.shadow and t.tier not in _NOT_SHOWN
        )
        # The prepaid balances, as checks (``credit_headers``; seeded by the enforcer).
        self.credits = tuple(i + 1 for i, t in enumerate(tiers) if t.tier is Tier.CREDITS)
        # The concurrency limits, as checks: decided once here, so a route without one
        # does nothing more per request (see ``Enforcer.decide`` and ``lease_headers``).
        self.leases = tuple(i + 1 for i, t in enumerate(tiers) if t.tier is Tier.CONCURRENT)
        # Every check holding a slot until the response ends: the concurrency limits and
        # the fleet's capacity (``QUOTA_CAPACITY``), each with the request's member.
        self.held = tuple(i + 1 for i, t in enumerate(tiers) if t.tier in _NOT_RATES)
        self.shown_among = tuple(i + 1 for i in self.enforced)  # as checks: the gate is 0
        self.limits = tuple(shown_limit(t.check) for t in tiers)
        self.limit_texts = tuple(str(limit) for limit in self.limits)
        # Per tier, what is left at the near-limit line (``near``: QUOTA_NEAR_LIMIT); empty: off.
        self.rooms = () if near is None else tuple(room(limit, near) for limit in self.limits)
        self.lines = self._lines()
        self.metered = metered(self.tiers)
        self.alerts = alerts  # QUOTA_ALERTS: the shares of a calendar quota told once
        self.alert_lines = self._alert_lines()
        self.names = tuple(printable(t.name) for t in tiers)
        self.labels = tuple(sf_string(t.name) for t in tiers)
        self.policy = policy_header(
            tuple((tiers[i].name, self.limits[i], tiers[i].check.rate.policy_window)
                  for i in self.enforced)
        )  # fmt: skip

    def costing(self, cost: int) -> Route:
        """This route with its endpoint tier weighing ``cost`` (the global and user tiers
        count the request, whatever it weighs). Only the checks differ, so the copy
        shares everything else: a fraction of building the route again."""
        variant = object.__new__(Route)
        for name in Route.__slots__:
            setattr(variant, name, getattr(self, name))
        variant.tiers = tuple(
            TierCheck(t.tier, t.name, Check(c.key, c.algorithm, c.rate, cost, c.shadow,
                                            c.calendar, c.wait_us), t.resource)
            if t.tier in _CHARGED
            else t
            for t in self.tiers
            for c in (t.check,)
        )  # fmt: skip
        variant.calls = (self.calls[0], *(t.check for t in variant.tiers))
        variant.lines = variant._lines()
        variant.metered = metered(variant.tiers)
        variant.alert_lines = variant._alert_lines()
        variant.billed = None if self.billed is None else {}
        return variant

    def on_billing_day(self, day: int) -> Route:
        """This route with its calendar months starting on ``day`` (a client's own
        billing day) instead of ``QUOTA_BILLING_DAY``; itself when no check follows the
        calendar. Made once per day and kept, so its checks are a reused shape too."""
        billed = self.billed
        if billed is None:
            return self
        found = billed.get(day)
        if found is None:
            found = object.__new__(Route)
            for name in Route.__slots__:
                setattr(found, name, getattr(self, name))
            found.tiers = on_billing_day(self.tiers, day)
            found.calls = (self.calls[0], *(t.check for t in found.tiers))
            found.billed = None  # already on its day
            if len(billed) < 31:
                billed[day] = found
        return found

    def _lines(self) -> tuple[tuple[int, int, int], ...]:
        """``Reply.crossings``' (check, room, cost) per tier; empty when the line is off.
        A tier of cost 0 takes nothing, so it crosses nothing."""
        if not self.rooms:
            return ()
        return tuple(
            (i + 1, self.rooms[i], t.check.cost)
            for i, t in enumerate(self.tiers)
            if t.check.cost and t.tier not in _NOT_SHOWN  # a slot is not a rate's unit
        )

    def _alert_lines(self) -> tuple[tuple[int, int, int, float], ...]:
        """(check, room, cost, share) per enforced calendar rate and ``QUOTA_ALERTS``
        share: ``Reply.crossings``' lines, each with the share it stands for."""
        return tuple(
            (i + 1, room(self.limits[i], share), t.check.cost, share)
            for i, t in enumerate(self.tiers)
            if t.check.calendar is not None and not t.check.shadow and t.check.cost
            for share in self.alerts
        )

    def keys(self, ip_tag: str, tag: str, key_tag: str, tenant_tag: str = "") -> list[str]:
        """The request's keys, in ``calls`` order: the caller's tags put in
        (``tenant_tag`` only on a route built with a tenant)."""
        return self._keys((ip_tag, tag, key_tag, tenant_tag))

    def keys_of(self, tags: tuple[str, ...]) -> list[str]:
        """``keys`` of a stacked view's route: ``tags`` are (ip, caller, key owner, tenant,
        then each further limit's key owner, "" for one without ``key=``)."""
        return self._keys(tags)

    def _keys(self, tags: tuple[str, ...]) -> list[str]:
        # A loop of f-strings: on Python 3.11 a comprehension is a call of its own, and
        # ``head + tag + tail`` makes a string more (callgrind: 2,000 instructions less
        # for a route of four keys).
        keys = []
        for head, which, tail in self.parts:
            # A key without a tag is the fleet's (its capacity): the same for every caller.
            keys.append(f"{head}{tags[which]}{tail}" if which >= 0 else head)
        return keys

    def checks(self, keys: Sequence[str]) -> list[Check]:
        """``calls`` with the request's keys."""
        return keyed(self.calls, keys)

    def tier_checks(self, keys: Sequence[str]) -> list[TierCheck]:
        """The tiers' checks (no gate) with the request's keys."""
        return [
            TierCheck(t.tier, t.name, c, t.resource)
            for t, c in zip(self.tiers, keyed(self.calls[1:], keys[1:]), strict=True)
        ]

    def crossings(self, reply: Reply) -> list[int]:
        """The tiers (indexes into ``tiers``) that this admitted request took across the
        near-limit line; empty when the line is off."""
        lines = self.lines
        if not lines:
            return []
        found = reply.crossings(lines)
        return [i - 1 for i in found] if found else found

    def decision(self, reply: Reply) -> tuple[Outcome | None, Decision]:
        """(the block gate's outcome if it denies, else None; the tiers' decision)."""
        gate = None if reply.allowed(0) else reply.outcome(0, 0)
        results = tuple(
            TierResult(
                t.tier, t.name, t.check.rate, reply.outcome(i + 1, self.limits[i]),
                t.resource, t.check.shadow,
            )
            for i, t in enumerate(self.tiers)
        )  # fmt: skip
        return gate, Decision(self.plan.name, results, reply.now_us)

    def lease_checks(self, keys: Sequence[str]) -> list[Check]:
        """The checks holding a slot (``held``) with the request's keys (its member in
        them): what is given back after the response."""
        return keyed([self.calls[i] for i in self.held], [keys[i] for i in self.held])

    def lease_headers(self, reply: Reply) -> list[tuple[str, str]]:
        """``X-Concurrency-Limit`` / ``-Remaining`` of the tightest concurrency limit
        (fewest slots left); none on a route without one."""
        if not self.leases:
            return []
        shown = reply.closest(self.leases)
        limit = self.limit_texts[shown - 1]
        return [
            (CONCURRENCY_LIMIT, limit),
            (CONCURRENCY_REMAINING, str(max(0, reply.remaining(shown)))),
        ]

    def credit_headers(self, reply: Reply) -> list[tuple[str, str]]:
        """``X-Credits-Balance`` / ``-Resource`` of the lowest prepaid balance (after this
        request); none on a route without one."""
        if not self.credits:
            return []
        shown = reply.closest(self.credits)
        return [
            (CREDITS_BALANCE, str(reply.remaining(shown))),
            (CREDITS_RESOURCE, self.names[shown - 1]),
        ]

    def settled_headers(self, decision: Decision, mode: HeaderMode) -> list[tuple[str, str]]:
        """``headers`` of a decision settled after the response (``Enforcer.settle``'s,
        its outcomes adjusted): the same code, on a reply made of it."""
        outcomes = (_OPEN_GATE, *(r.outcome for r in decision.results))
        return self.headers(Reply.of(decision.now_us, decision.allowed, outcomes), mode)

    def headers(self, reply: Reply, mode: HeaderMode) -> list[tuple[str, str]]:
        """The rate-limit headers of a reply (``QUOTA_HEADERS`` ``mode``), for the tier
        they describe (``Reply.shown``: the denying one, else the closest to its limit),
        from the reply and this route's precomputed texts (no ``Decision`` is made).
        Shadow tiers and concurrency limits are left out: they are not rates a client
        can act on (a concurrency limit has ``lease_headers``)."""
        if not self.enforced or mode is _NO_HEADERS:
            return []
        shown, left, reset_us, now_us = reply.shown_state(self.shown_among)
        remaining = str(left) if left > 0 else "0"  # max(0, left): no call
        tier = shown - 1
        if mode is not _IETF:
            legacy = [
                (LIMIT, self.limit_texts[tier]),
                (REMAINING, remaining),
                (RESET, str(-(-reset_us // US))),
                (RESOURCE, self.names[tier]),
            ]
            if mode is _LEGACY:
                return legacy
        reset_in = -(-(reset_us - now_us) // US)  # seconds_until, inlined
        ietf = [
            (POLICY, self.policy),
            (RATELIMIT, f"{self.labels[tier]};r={remaining};t={reset_in if reset_in > 0 else 0}"),
        ]
        return ietf if mode is _IETF else legacy + ietf


def build_route(
    policy: Policy,
    plan: Plan,
    *,
    method: str,
    spec: LimitSpec | None,
    resource: str | None,
    cost: int,
    tenant: bool = False,
    near: float | None = None,
    more: Sequence[tuple[LimitSpec, int]] = (),
    priority: Priority | None = None,
    alerts: tuple[float, ...] = (),
    allowed: bool = False,
) -> Route:
    """The route of a request, from the policy's own checks with placeholder tags;
    ``tenant``: the caller has a tenant, so its tenant tier applies; ``near``:
    QUOTA_NEAR_LIMIT, the share whose crossing the route reports; ``more``: a stacked
    view's further limits (each with its resource set) and their costs; ``allowed``: the
    caller's network is allowed, so the per-IP global tier does not apply."""
    keyed_by = _MARKS[KEY] if spec is not None and spec.key is not None else None
    stacked = [
        (limit, limit.resource or "", weight, _owner_mark(n) if limit.key is not None else None)
        for n, (limit, weight) in enumerate(more, 1)
    ]
    tiers = policy.checks(
        plan,
        ip_tag=None if allowed else _MARKS[IP],
        identity_tag=_MARKS[WHO],
        method=method,
        spec=spec,
        resource=resource,
        cost=cost,
        endpoint_tag=keyed_by,
        tenant_tag=_MARKS[TENANT] if tenant else None,
        more=stacked,
        priority=priority,
    )
    return Route(plan, tiers, gate_check(policy.keys, _MARKS[WHO]), near, alerts)


def metered(tiers: Sequence[TierCheck]) -> tuple[tuple[str, int], ...]:
    """(resource, cost) of each endpoint limit, once per resource: what the usage
    ledger records of an admitted request (a resource's several rates charge alike)."""
    seen: dict[str, int] = {}
    for t in tiers:
        if t.tier in _CHARGED and t.resource is not None and t.resource not in seen:
            seen[t.resource] = t.check.cost
    return tuple(seen.items())


def _split(key: str) -> tuple[str, int, str]:
    for which, mark in enumerate(_MARKS):
        head, found, tail = key.partition(mark)
        if found:
            return head, which, tail
    owner = _OWNER_RE.search(key)
    if owner is not None:
        return key[: owner.start()], TENANT + int(owner[1]), key[owner.end() :]
    return key, -1, ""  # no caller's tag: the fleet's own key (``Tier.CAPACITY``)
