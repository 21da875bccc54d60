"""Adaptive capacity (``QUOTA_ADAPTIVE``): how many requests a worker lets run at once,
following the latency it measures.

The algorithm is a gradient, after Netflix's Gradient2 (concurrency-limits) and Envoy's
adaptive concurrency filter, with a windowed minimum as the no-load latency:

- **What it measures**: each admitted request's time in the app, from the before hook
  to the end of its response, and how many of the worker's requests were in flight.
- **Every window** (``WINDOW`` seconds, or sooner once ``SAMPLES`` requests ended), the
  window's median time is compared with the *no-load* time: the smallest window median
  of the last ``HISTORY`` seconds. ``gradient = TOLERANCE * no_load / median``, kept
  within [0.5, 1.5]; the new limit is ``limit * gradient + HEADROOM``, smoothed
  (``SMOOTHING`` of the way there), within [``minimum``, ``maximum``].
- **So**: while requests take no longer than ``TOLERANCE`` times the no-load time the
  limit grows (by up to half of itself plus one per window, a quarter of that after
  smoothing), but only while the worker is using at least half of it (an idle worker
  says nothing about more); once they take longer, it shrinks, by at most an eighth
  per window. A saturated bottleneck (a database pool) makes requests wait: the
  limit settles where they start to, plus the headroom.

Critical requests have the whole limit and lower classes less (``core.priority``), so
when the limit shrinks the lower classes are shed first; the limit's floor and the
headroom keep it from collapsing under the critical traffic itself. Pure: time is
handed in (seconds, any monotonic clock), nothing here reads a clock.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

__all__ = ["HEADROOM", "HISTORY", "SAMPLES", "SMOOTHING", "TOLERANCE", "WINDOW", "Gradient"]

WINDOW = 0.25  # seconds a window lasts at most
SAMPLES = 50  # requests that end a window early
HISTORY = 60.0  # seconds over which the smallest window median is the no-load time
TOLERANCE = 1.2  # how much slower than no-load requests may get before the limit shrinks
HEADROOM = 1.0  # added to the limit each window: room to find out whether more fits
SMOOTHING = 0.25  # the share of the way to the new limit taken each window


class Gradient:
    """One worker's adaptive limit of requests in flight. Thread-safe: the threads of a
    worker report their requests as they end (``sample``)."""

    def __init__(self, *, initial: int = 10, minimum: int = 1, maximum: int = 1000) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(
                f"adaptive bounds must be 1 <= minimum <= maximum, got {minimum}, {maximum}"
            )
        self.minimum, self.maximum = minimum, maximum
        self._limit = float(min(max(initial, minimum), maximum))
        self._lock = threading.Lock()
        self._times: list[float] = []  # this window's request times
        self._busiest = 0  # the most in flight seen this window
        self._started: float | None = None  # when this window began
        self._medians: deque[tuple[float, float]] = deque()  # (when, median) of windows

    @property
    def limit(self) -> int:
        """The limit in force: requests in flight the worker admits at most."""
        return int(self._limit)

    def sample(self, seconds: float, in_flight: int, now: float) -> None:
        """A request ended after ``seconds`` in the app, ``in_flight`` of the worker's
        requests running (itself included) when it began; ``now``: the clock."""
        with self._lock:
            if self._started is None:
                self._started = now
            self._times.append(seconds)
            if in_flight > self._busiest:
                self._busiest = in_flight
            if len(self._times) >= SAMPLES or now - self._started >= WINDOW:
                self._close(now)

    def _close(self, now: float) -> None:
        median = statistics.median(self._times)
        medians = self._medians
        medians.append((now, median))
        while medians and medians[0][0] < now - HISTORY:
            medians.popleft()
        no_load = min(m for _, m in medians)
        limit = self._limit
        gradient = min(1.5, max(0.5, TOLERANCE * no_load / median)) if median > 0 else 1.5
        if gradient >= 1 and self._busiest < limit / 2:
            target = limit  # app-limited: an idle worker says nothing about more
        else:
            target = limit * gradient + HEADROOM
        limit += (target - limit) * SMOOTHING
        self._limit = min(float(self.maximum), max(float(self.minimum), limit))
        self._times, self._busiest, self._started = [], 0, now
