"""Several ``DecisionObserver``s as one (the Prometheus metrics and the OpenTelemetry spans)."""

from __future__ import annotations

from collections.abc import Sequence

from .enforcer import DecisionObserver
from .policy import Decision, TierCheck, TierResult
from .priority import Priority

__all__ = ["Observers", "combined"]


class Observers:
    """Tells each of ``observers`` everything, while any of them is watching."""

    def __init__(self, observers: Sequence[DecisionObserver]) -> None:
        self.observers = tuple(observers)

    def watching(self) -> bool:
        return any(o.watching() for o in self.observers)

    def stored(self, seconds: float) -> None:
        for o in self.observers:
            o.stored(seconds)

    def unavailable(self, tiers: Sequence[TierCheck], plan: str, outcome: str) -> None:
        for o in self.observers:
            o.unavailable(tiers, plan, outcome)

    def decided(self, decision: Decision, *, local: bool, blocked: bool) -> None:
        for o in self.observers:
            o.decided(decision, local=local, blocked=blocked)

    def near_limit(self, decision: Decision, result: TierResult) -> None:
        for o in self.observers:
            o.near_limit(decision, result)

    def shed(self, priority: Priority, reason: str, *, shadow: bool) -> None:
        for o in self.observers:
            o.shed(priority, reason, shadow=shadow)


def combined(*observers: DecisionObserver | None) -> DecisionObserver | None:
    """The enforcer's observer for ``observers`` (``None`` ones left out): ``None`` for
    none, the one itself for one (no fan-out on the request path), else ``Observers``."""
    found = [o for o in observers if o is not None]
    if not found:
        return None
    return found[0] if len(found) == 1 else Observers(found)
