"""What one request asks of its limits: its facts, with the view's callables asked.

``facts_of`` is the one way a request's ``Facts`` are built (by the request edge, the
status view and ``quota.limited``): it asks each limit's ``exempt_when``, ``key``,
callable rate and callable cost, in that order, and checks their answers. A new
per-limit option is read here (and recorded on ``LimitSpec``), and nowhere else on
the way to the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .identity import Identity
from .policy import LimitSpec
from .priority import Priority
from .rates import Rate, Rates, parse_rates
from .validators import is_count

__all__ = ["Facts", "Limit", "facts_of", "limit_hooks", "rated", "stack_hooks"]

Limit = tuple[LimitSpec, int, str | None]  # a limit that applies: (spec, cost, key owner)


@dataclass(slots=True)  # not frozen: one is made per request, and frozen costs twice
class Facts:
    """What the decision needs to know about one request (never changed once made)."""

    method: str
    endpoint: str | None
    ip_tag: str  # the remote address's tag (``keys.remote_ip_tag``)
    identity: Identity | None  # None: anonymous, keyed by ``ip_tag``
    spec: LimitSpec | None = None  # the view's ``@quota.limit``, if it applies
    cost: int = 1  # the endpoint tier's cost, already evaluated
    owner: str | None = None  # the ``key=`` callable's answer: the endpoint bucket's owner
    # A stacked view's further limits that apply, each (spec, cost, owner) as above: their
    # resources are set (``state.view_limit``), and all are decided in the same call.
    more: tuple[Limit, ...] = ()
    # Its class, with overload protection on (``core.priority``); None: off.
    priority: Priority | None = None
    # Its address is in a network operators allowed (``flask quota networks allow``): its
    # route has no per-IP global tier. Set by the request edge (``flask_quota.networks``).
    allowed: bool = False


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
    if spec.rate_of is not None:
        spec = rated(spec, endpoint)
    weight = spec.cost
    if not callable(weight):
        return spec, weight, owner  # an int, checked by @quota.limit
    cost = weight()
    if not is_count(cost):
        raise TypeError(f"cost callable of {endpoint!r} returned {cost!r}, not an int >= 0")
    return spec, cost, owner


def rated(spec: LimitSpec, endpoint: str | None) -> LimitSpec:
    """``spec`` with its callable rate's answer for this request as its rates. Each
    distinct answer is parsed once: ``spec.rated`` keeps the copies (bounded), and a
    copy's rates are part of its route's key, while its bucket's key is the resource's."""
    assert spec.rate_of is not None
    answer = spec.rate_of()
    if not isinstance(answer, str | Rate | Rates):
        raise TypeError(
            f"rate callable of {endpoint!r} returned {answer!r}, not a rate string such as "
            "'10/minute' (or several, '10/second, 1000/day')"
        )
    cache = spec.rated
    found = cache.current.get(answer) or cache.recall(answer)
    if found is None:
        try:
            rates = parse_rates(answer)
        except ValueError as exc:
            raise ValueError(f"rate callable of {endpoint!r}: {exc}") from None
        found = replace(spec, rate=rates)
        cache.put(answer, found)
    return found


def stack_hooks(
    specs: Sequence[LimitSpec], endpoint: str | None
) -> tuple[LimitSpec | None, int, str | None, tuple[Limit, ...]]:
    """``limit_hooks`` of each limit of a stacked view that applies to the request (its
    ``exempt_when`` says no, its ``key`` an owner): the first as (limit, cost, owner),
    the others as ``Facts.more``."""
    found = [
        hooked
        for spec in specs
        if spec.exempt_when is None or not spec.exempt_when()
        for hooked in (limit_hooks(spec, endpoint),)
        if hooked[0] is not None
    ]
    if not found:
        return None, 1, None, ()
    (spec, cost, owner), *more = found
    return spec, cost, owner, tuple((s, c, o) for s, c, o in more if s is not None)


def facts_of(
    method: str,
    endpoint: str | None,
    ip_tag: str,
    identity: Identity | None,
    specs: Sequence[LimitSpec] = (),
    priority: Priority | None = None,
) -> Facts:
    """A request's facts, its limits' callables asked (see the module docstring);
    ``priority``: its class, when overload protection is on."""
    if not specs:
        return Facts(method, endpoint, ip_tag, identity, priority=priority)
    if len(specs) > 1:  # stacked limits: each is evaluated, all in one decision
        spec, cost, owner, more = stack_hooks(specs, endpoint)
        return Facts(method, endpoint, ip_tag, identity, spec, cost, owner, more, priority)
    spec = specs[0]  # the usual case: one limit
    if spec.exempt_when is not None and spec.exempt_when():
        return Facts(method, endpoint, ip_tag, identity, priority=priority)
    if spec.key is None and spec.rate_of is None and isinstance(weight := spec.cost, int):
        if priority is None:  # nothing to ask (the usual case)
            return Facts(method, endpoint, ip_tag, identity, spec, weight)
        return Facts(method, endpoint, ip_tag, identity, spec, weight, priority=priority)
    found, cost, owner = limit_hooks(spec, endpoint)
    return Facts(method, endpoint, ip_tag, identity, found, cost, owner, priority=priority)
