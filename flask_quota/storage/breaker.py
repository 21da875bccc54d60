"""A circuit breaker: stop calling a dead storage, probe it about once per cooldown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core.validators import is_count

__all__ = ["DEFAULT_THRESHOLD", "Attempt", "CircuitBreaker"]

log = logging.getLogger("flask_quota")

DEFAULT_THRESHOLD = 5
"""Failures in a row that open the breaker (``QUOTA_BREAKER_THRESHOLD``'s default).

A storage that hangs opens it after about five storage timeouts (0.5 s at the
default 0.1 s), one that refuses connections after five quick failures; a stall
shorter than about four timeouts never opens it.
"""


@dataclass(frozen=True, slots=True)
class Attempt:
    """A call the breaker let through; hand it back to ``succeeded`` or ``failed``."""

    round: int  # the failure count when the call began: one failure per round counts
    probe: bool  # made while the breaker was open


class CircuitBreaker:
    """Closed: every call goes through. It opens after ``threshold`` failures in a
    row, and then lets one probe through per ``cooldown`` seconds until one succeeds.

    Failures are counted in rounds: a failure counts only if its call began after
    the previous counted failure. Calls that were in flight together and fail
    together (one stall seen by every thread of a worker) are one failure, so the
    threshold means "this many storage timeouts in a row", whatever the number
    of threads. A success ends the run.

    State changes are logged once each, not once per request, and reported to
    ``on_change(error)`` when set: the error on opening, ``None`` on closing.
    """

    on_change: Callable[[BaseException | None], None] | None = None

    def __init__(
        self,
        name: str,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        cooldown: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not is_count(threshold, minimum=1):
            raise ValueError(f"the breaker threshold must be an int >= 1, not {threshold!r}")
        self.name = name
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._failures = 0  # counted failures in a row
        self._round = 0  # bumped by every counted failure and every run-ending success
        self._attempt = Attempt(0, False)  # what a call gets while closed, in this round
        self._next_probe = 0.0

    @property
    def is_open(self) -> bool:
        """True while the storage counts as down."""
        return self._open

    @property
    def failing(self) -> bool:
        """True from the first failure of a run until a call succeeds again."""
        return self._open or self._failures > 0

    def allow(self) -> Attempt | None:
        """May this caller use the storage? While open, only the one probe may."""
        if not self._open:
            return self._attempt  # the hot path: no lock, no allocation
        with self._lock:
            now = self._clock()
            if not self._open:
                return self._attempt
            if now >= self._next_probe:
                self._next_probe = now + self.cooldown
                return Attempt(self._round, True)
            return None

    def succeeded(self) -> None:
        """A call worked: the run of failures ends, and an open breaker closes."""
        if not (self._failures or self._open):
            return
        with self._lock:
            self._failures = 0
            self._next_round()
            if not self._open:
                return
            self._open = False
        log.warning("flask-quota: %s storage recovered; limits apply again", self.name)
        if self.on_change is not None:
            self.on_change(None)

    def unused(self, attempt: Attempt) -> None:
        """A probe that never reached the storage (answered in-process): the next call
        may probe at once instead of a cooldown later."""
        if attempt.probe:
            with self._lock:
                if self._open:
                    self._next_probe = self._clock()

    def failed(self, attempt: Attempt, error: BaseException, fail_mode: str) -> None:
        """Count a failure of ``attempt``; open the breaker at ``threshold`` in a row."""
        with self._lock:
            if self._open:
                self._next_probe = self._clock() + self.cooldown
                return
            if attempt.round != self._round:
                return  # a failure was counted, or a success seen, since this call began
            self._failures += 1
            self._next_round()
            if self._failures < self.threshold:
                log.debug(
                    "flask-quota: %s storage call failed (%s), %d of %d before the breaker opens",
                    self.name, error, self._failures, self.threshold,
                )  # fmt: skip
                return
            self._open = True
            self._next_probe = self._clock() + self.cooldown
        self._opened(error, fail_mode)

    def _opened(self, error: BaseException, fail_mode: str) -> None:
        log.error(
            "flask-quota: %s storage failed %d times in a row (last: %s); fail mode %r until "
            "it recovers, probing every %.1f s",
            self.name,
            self.threshold,
            error,
            fail_mode,
            self.cooldown,
        )
        if self.on_change is not None:
            self.on_change(error)

    def _next_round(self) -> None:
        self._round += 1
        self._attempt = Attempt(self._round, False)

    def seconds_to_probe(self) -> float:
        """Seconds until the next probe; 0 while closed."""
        if not self._open:
            return 0.0
        return max(0.0, self._next_probe - self._clock())
