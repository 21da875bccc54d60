"""Helpers for testing apps that use flask-quota: a clock you move by hand.

    clock = FrozenClock()
    quota = Quota(app, storage=MemoryStorage(clock))
    ...
    clock.advance(60)
"""

from __future__ import annotations

from .storage import MemoryStorage

__all__ = ["FrozenClock", "MemoryStorage"]


class FrozenClock:
    """A microsecond clock that only moves when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now_us = round(start * 1_000_000)

    def __call__(self) -> int:
        return self.now_us

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a FrozenClock only moves forward")
        self.now_us += round(seconds * 1_000_000)

    @property
    def seconds(self) -> float:
        return self.now_us / 1_000_000
