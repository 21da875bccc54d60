"""What a tier asks the storage, and what the storage answers: plain values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .algorithms import Algorithm, Gate, Outcome
from .calendar import Calendar
from .rates import Rate
from .reply import Reply

__all__ = ["Check", "Verdict", "flat_reply", "keyed", "shadow_flags", "shown_limit", "verdict_of"]


@dataclass(frozen=True, slots=True)
class Check:
    """One tier's question to the storage: may ``cost`` units pass on ``key``?

    A ``shadow`` check is decided like any other but never denies: when it would,
    it is not charged and the other checks are decided as if it were absent.
    """

    key: str
    algorithm: Algorithm | Gate
    rate: Rate
    cost: int
    shadow: bool = False
    calendar: Calendar | None = None
    """Set for a calendar rate (``N/month``): the zone and billing day its window follows;
    the algorithm is then ``FIXED_WINDOW``."""
    wait_us: int = 0
    """How long a caller may wait for room (``wait=``, ``delay=``): a cost that fits
    within it is reserved and allowed, its outcome's ``retry_after_us`` the wait."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for all checks of one request, decided atomically.

    ``shadow`` flags the shadow checks (parallel to ``outcomes``; empty when
    there are none): their denials do not deny.
    """

    now_us: int
    outcomes: tuple[Outcome, ...]
    shadow: tuple[bool, ...] = ()

    @property
    def allowed(self) -> bool:
        """True when every enforced check allowed (a shadow denial does not deny)."""
        if not self.shadow:
            return all(o.allowed for o in self.outcomes)
        return all(o.allowed or s for o, s in zip(self.outcomes, self.shadow, strict=True))


def shadow_flags(checks: Sequence[Check]) -> tuple[bool, ...]:
    """``Verdict.shadow`` for ``checks``: empty when none is a shadow check."""
    flags = tuple(c.shadow for c in checks)
    return flags if any(flags) else ()


def flat_reply(verdict: Verdict) -> Reply:
    """``verdict`` as a ``Reply``."""
    return Reply.of(verdict.now_us, verdict.allowed, verdict.outcomes)


def verdict_of(checks: Sequence[Check], reply: Sequence[int]) -> Verdict:
    """A ``Reply`` for ``checks`` as a ``Verdict``; each outcome's limit is its rate's
    (a token bucket's capacity, a lease's slots; 0 for a block, which has no limit)."""
    flat = reply if isinstance(reply, Reply) else Reply.read(reply, len(checks))
    outcomes = tuple(flat.outcome(i, shown_limit(check)) for i, check in enumerate(checks))
    return Verdict(flat.now_us, outcomes, shadow_flags(checks))


def shown_limit(check: Check) -> int:
    """The limit a check's outcome reports: a token bucket's capacity, a lease's slots,
    0 for a block gate."""
    if check.algorithm is Gate.BLOCK:
        return 0
    if check.algorithm is Algorithm.TOKEN_BUCKET:
        return check.rate.capacity
    return check.rate.limit


def keyed(checks: Sequence[Check], keys: Sequence[str]) -> list[Check]:
    """``checks`` with ``keys`` (in the same order) in place of their own keys."""
    return [
        Check(key, c.algorithm, c.rate, c.cost, c.shadow, c.calendar, c.wait_us)
        for c, key in zip(checks, keys, strict=True)
    ]
