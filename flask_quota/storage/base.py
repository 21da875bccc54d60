"""What every backend implements, and the values that cross the boundary."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..algorithms import Algorithm, Outcome
from ..rates import Rate

__all__ = ["Check", "Clock", "Storage", "StorageError", "Verdict", "wall_clock_us"]

Clock = Callable[[], int]
"""Returns the current time in integer microseconds."""


def wall_clock_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class Check:
    """One tier's question to the storage: may ``cost`` units pass on ``key``?"""

    key: str
    algorithm: Algorithm
    rate: Rate
    cost: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for all checks of one request, decided atomically."""

    now_us: int
    outcomes: tuple[Outcome, ...]

    @property
    def allowed(self) -> bool:
        return all(o.allowed for o in self.outcomes)


class StorageError(Exception):
    """The backend could not answer (down, slow, out of memory)."""


class Storage(Protocol):
    name: str

    def decide(self, checks: Sequence[Check]) -> Verdict:
        """Charge every check if all of them allow; otherwise charge none."""

    def peek(self, checks: Sequence[Check]) -> Verdict:
        """Answer as ``decide`` would without changing anything."""

    def clear(self, keys: Sequence[str]) -> None:
        """Forget the state of ``keys`` (a reset)."""

    def ping(self) -> float:
        """Round-trip latency in seconds; raises ``StorageError`` when down."""

    def close(self) -> None: ...
