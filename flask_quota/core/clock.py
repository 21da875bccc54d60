"""Time as flask-quota counts it: integer microseconds, and whole seconds rounded up.

Every decision works in microseconds; everything a client or operator reads
(``Retry-After``, ``X-RateLimit-Reset``, "full in 12 s") is whole seconds,
rounded up so that a client that waits that long is never early.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["US", "Clock", "ceil_seconds", "seconds_until", "wall_clock_us"]

US = 1_000_000
"""Microseconds per second."""

Clock = Callable[[], int]
"""Returns the current time in integer microseconds."""


def wall_clock_us() -> int:
    """The system clock in microseconds (the memory backend's default clock)."""
    return time.time_ns() // 1000


def ceil_seconds(us: int) -> int:
    """``us`` microseconds as whole seconds, rounded up (negative values stay negative)."""
    return -(-us // US)


def seconds_until(at_us: int, now_us: int) -> int:
    """Whole seconds from ``now_us`` until ``at_us``, rounded up, never negative."""
    return max(0, ceil_seconds(at_us - now_us))
