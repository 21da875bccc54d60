"""A request's shape: everything about its checks that does not depend on the caller.

For one (plan, endpoint, method, cost) the tiers, rates, algorithms, the block
gate, the storage's encoded arguments and the constant parts of the headers are
always the same; only the caller's tags in the keys change. A ``Route`` holds
them, built once by ``Policy.checks`` itself (with placeholders for the tags, so
its keys are exactly the policy's), and a request does a cache lookup plus one
concatenation per key. The storage answers a flat ``Reply``; the ``Decision``
objects are made from it only when something needs them (a denial, a shadow
tier, metrics, ``quota.current_decision()``, the dashboard's usage).
"""

from __future__ import annotations

from collections.abc import Sequence

from .algorithms import Outcome
from .headers import policy_header, printable, sf_string
from .plans import Plan
from .policy import Decision, LimitSpec, Policy, TierCheck, TierResult, gate_check
from .storage import Check
from .storage.base import keyed, shown_limit
from .tiers import Tier

__all__ = ["Route", "build_route"]

# Stand-ins for the caller's tags while a route's keys are built: a NUL never occurs
# in a tag (``escape`` percent-encodes it), so each key splits at exactly one of them.
_MARKS = ("\x00ip\x00", "\x00who\x00", "\x00key\x00")
IP, WHO, KEY = range(3)  # which tag a key takes: the IP's, the caller's, a key= owner's


class Route:
    """The checks of one (plan, endpoint, method, cost) with the caller left out.

    ``calls`` (the block gate first, then one check per tier and rate) is what the
    storage decides; its keys are templates, the request's come from ``keys()``.
    The tuple is reused by every request of the route, so a backend may cache its
    encoding by identity. ``costing()`` derives the route of another cost.
    """

    __slots__ = ("calls", "enforced", "labels", "limit_texts", "limits", "names", "parts",
                 "plan", "policy", "shadow", "tiers")  # fmt: skip

    def __init__(self, plan: Plan, tiers: Sequence[TierCheck], gate: Check) -> None:
        self.plan = plan
        self.tiers = tuple(tiers)
        self.calls: tuple[Check, ...] = (gate, *(t.check for t in tiers))
        self.parts = tuple(_split(c.key) for c in self.calls)
        self.shadow = any(c.shadow for c in self.calls)  # then a shadow denial may need a signal
        # What the headers show, per tier; only enforced (non-shadow) tiers are shown.
        self.enforced = tuple(i for i, t in enumerate(tiers) if not t.check.shadow)
        self.limits = tuple(shown_limit(t.check) for t in tiers)
        self.limit_texts = tuple(str(limit) for limit in self.limits)
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
            TierCheck(t.tier, t.name, Check(c.key, c.algorithm, c.rate, cost, c.shadow), t.resource)
            if t.tier is Tier.ENDPOINT
            else t
            for t in self.tiers
            for c in (t.check,)
        )
        variant.calls = (self.calls[0], *(t.check for t in variant.tiers))
        return variant

    def keys(self, ip_tag: str, tag: str, key_tag: str) -> list[str]:
        """The request's keys, in ``calls`` order: the caller's tags put in."""
        tags = (ip_tag, tag, key_tag)
        return [head + tags[which] + tail for head, which, tail in self.parts]

    def checks(self, keys: Sequence[str]) -> list[Check]:
        """``calls`` with the request's keys."""
        return keyed(self.calls, keys)

    def tier_checks(self, keys: Sequence[str]) -> list[TierCheck]:
        """The tiers' checks (no gate) with the request's keys."""
        return [
            TierCheck(t.tier, t.name, c, t.resource)
            for t, c in zip(self.tiers, keyed(self.calls[1:], keys[1:]), strict=True)
        ]

    def decision(self, reply: Sequence[int]) -> tuple[Outcome | None, Decision]:
        """(the block gate's outcome if it denies, else None; the tiers' decision)."""
        gate = None if reply[2] else Outcome(False, 0, reply[3], reply[4], reply[5])
        results = []
        for i, t in enumerate(self.tiers):
            j = 6 + 4 * i
            outcome = Outcome(
                bool(reply[j]), self.limits[i], reply[j + 1], reply[j + 2], reply[j + 3]
            )
            results.append(
                TierResult(t.tier, t.name, t.check.rate, outcome, t.resource, t.check.shadow)
            )
        return gate, Decision(self.plan.name, tuple(results), reply[0])


def build_route(
    policy: Policy,
    plan: Plan,
    *,
    method: str,
    spec: LimitSpec | None,
    resource: str | None,
    cost: int,
) -> Route:
    """The route of a request, from the policy's own checks with placeholder tags."""
    keyed_by = _MARKS[KEY] if spec is not None and spec.key is not None else None
    tiers = policy.checks(
        plan,
        ip_tag=_MARKS[IP],
        identity_tag=_MARKS[WHO],
        method=method,
        spec=spec,
        resource=resource,
        cost=cost,
        endpoint_tag=keyed_by,
    )
    return Route(plan, tiers, gate_check(policy.keys, _MARKS[WHO]))


def _split(key: str) -> tuple[str, int, str]:
    for which, mark in enumerate(_MARKS):
        head, found, tail = key.partition(mark)
        if found:
            return head, which, tail
    raise AssertionError(f"route key {key!r} holds no tag")  # pragma: no cover
