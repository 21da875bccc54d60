"""``quota.limited``: one limit for code that is not a view, checked and charged on entry.

A view's limits ride on the request's one decision; a function that sends a text
message, or a CLI command that calls a paid API, has no request (or more than one
such call per request). ``Limited`` decides that one bucket on its own: no global,
tenant or user tier (those count requests) and no block gate, only the limit asked
for, through the same guarded storage (fail mode, breaker) as every decision.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import ContextDecorator
from dataclasses import dataclass
from typing import Any

from .checks import shown_limit
from .clock import US
from .enforcer import Enforcer
from .errors import QuotaExceeded
from .facts import Facts, rated
from .keys import KeyBuilder
from .policy import Decision, LimitSpec, TierResult, on_billing_day
from .rates import Rate, Rates, parse_rates
from .reply import LocalReply
from .validators import is_count, resource_name
from .waiting import sleep_reserved, wait_us

__all__ = ["Limited", "limited_spec"]

# Where ``Limited`` learns, on entry, what to decide with: the enforcer and the current
# request's caller (None outside a request); None for all of it when quota is switched off.
Context = Callable[[], tuple[Enforcer, Facts | None] | None]

# Told, after a reservation's sleep, of its resource and the seconds slept (the metrics).
Waited = Callable[[str, float], None]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


@dataclass(frozen=True, slots=True)
class LimitedSpec:
    """What ``quota.limited(...)`` was given, checked."""

    limit: LimitSpec  # its rates and resource, one bucket for every method
    key: str | None  # the bucket's owner; None: the request's caller


def limited_spec(
    rate: str | Rate | Rates | Callable[[], object],
    resource: str | None,
    key: str | None,
    cost: int,
    wait: float | None = None,
) -> LimitedSpec:
    """``quota.limited``'s arguments checked: a bad one is refused when the limit is made,
    not when it is first entered. A callable ``rate`` is asked on every entry, as
    ``@quota.limit``'s is; its bucket must then be named (``resource``). ``wait``: the
    seconds a caller may wait for room (``core.waiting``)."""
    waits = wait_us(wait) if wait is not None else 0
    if callable(rate):
        if resource is None:
            raise ValueError(
                "quota.limited(callable, ...) needs resource=..., the bucket's name: the "
                "callable's answer may change from call to call, its bucket must not"
            )
        rates, rate_of = None, rate
    else:
        rates, rate_of = parse_rates(rate), None
    if resource is None:
        # Named after its rates: "2/minute" is "limited.2_minute". Two places with the same
        # rate and no resource share a bucket, which the docs say.
        resource = ("limited." + _UNSAFE.sub("_", str(rates)))[:64]
    resource_name(resource)
    if key is not None and (not isinstance(key, str) or not key):
        raise TypeError(f"quota.limited(key=...) takes a non-empty str, got {key!r}")
    if not is_count(cost):
        raise ValueError(f"quota.limited(cost=...) takes an int >= 0, got {cost!r}")
    limit = LimitSpec(rates, resource, cost, per_method=False, rate_of=rate_of, wait_us=waits)
    return LimitedSpec(limit, key)


class Limited(ContextDecorator):
    """``with quota.limited(...):`` or ``@quota.limited(...)``: entering charges the
    limit's bucket, or raises ``QuotaExceeded`` (nothing charged). Leaving gives
    nothing back: the work was attempted."""

    def __init__(
        self,
        spec: LimitedSpec,
        context: Context,
        denied: Callable[[], None] | None = None,
        waited: Waited | None = None,
    ) -> None:
        self.spec = spec
        self.context = context
        self.denied = denied  # told of a denial before it is raised (the extension's note)
        self.waited = waited  # told of a wait slept (the metrics)

    def __enter__(self) -> Limited:
        found = self.context()
        if found is not None:
            try:
                enforce(self.spec, *found, waited=self.waited)
            except QuotaExceeded:
                if self.denied is not None:
                    self.denied()
                raise
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def enforce(
    spec: LimitedSpec, enforcer: Enforcer, facts: Facts | None, *, waited: Waited | None = None
) -> None:
    """Charge ``spec``'s bucket in one storage call; raises ``QuotaExceeded`` when it
    denies, and lets the call pass when the storage fails open. Decided through the
    enforcer's tail (``Enforcer.conclude``), as a view's limit is: metrics, spans,
    signals and, in a request, ``QUOTA_BLOCK_AFTER`` for its caller. Admitted by a
    reservation (``wait=``), it sleeps until its time first (``core.waiting``)."""
    limit = spec.limit
    resource = limit.resource or ""
    if limit.rate_of is not None:
        limit = rated(limit, resource)  # this entry's answer, parsed once per distinct one
    catalog = enforcer.catalog()
    tag: str | None = None  # the caller a denial counts against (none outside a request)
    if facts is None:
        if spec.key is None:
            raise RuntimeError(
                f"quota.limited({str(limit.rate)!r}) outside a request needs key=..., the "
                "bucket's owner (e.g. key=phone_number): there is no caller to charge"
            )
        plan = catalog.resolve(enforcer.default_plan, None, fallback=enforcer.default_plan)
        owner = KeyBuilder.key_tag(spec.key)
    else:
        tag, plan, _ = enforcer.caller(catalog, facts)
        owner = KeyBuilder.key_tag(spec.key) if spec.key is not None else tag
    tiers = tuple(enforcer.policy.endpoint_tier(plan, owner, resource, limit))
    day = enforcer.billing_day(catalog, facts)
    if day is not None:  # the caller's months start on its own day
        tiers = on_billing_day(tiers, day)
    checks = [t.check for t in tiers]
    observer = enforcer.watching()
    keys = [c.key for c in checks]
    reply = enforcer.ask(checks, keys, lambda: tiers, plan, observer)
    if reply is not None and reply.all_allowed and limit.wait_us:
        wait = reply.wait_us()
        if wait:  # reserved: sleep until its time; interrupted, give it back
            at = reply.now_us + wait
            sleep_reserved(wait, lambda: enforcer.guard.refund(checks, at))
            if waited is not None:
                waited(resource, wait / US)
    if reply is None or (reply.all_allowed and observer is None):
        return  # admitted (the usual case), or the storage failed open
    results = tuple(
        TierResult(
            t.tier, t.name, t.check.rate, reply.outcome(i, shown_limit(t.check)),
            t.resource, t.check.shadow,
        )
        for i, t in enumerate(tiers)
    )  # fmt: skip
    decision = Decision(plan.name, results, reply.now_us)
    cost = limit.cost if isinstance(limit.cost, int) else 1
    own = Facts(
        "*", None, facts.ip_tag if facts is not None else "", None, limit, cost
    )  # whose denial it may be: this limit's (its cost and unit)
    enforcer.conclude(
        catalog, plan, decision, own, tag=tag, observer=observer,
        local=isinstance(reply, LocalReply),
    )  # fmt: skip
