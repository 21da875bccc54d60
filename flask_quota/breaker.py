"""A circuit breaker: stop calling a dead storage, probe it about once per cooldown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]

log = logging.getLogger("flask_quota")


class CircuitBreaker:
    """Closed: every call goes through. Open: one probe per ``cooldown`` seconds.

    State changes are logged once each, not once per request, and reported to
    ``on_change(error)`` when set: the error on opening, ``None`` on closing.
    """

    on_change: Callable[[BaseException | None], None] | None = None

    def __init__(
        self, name: str, *, cooldown: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._next_probe = 0.0

    @property
    def is_open(self) -> bool:
        """True while the storage counts as down."""
        return self._open

    def allow(self) -> bool:
        """May this caller use the storage? While open, only the one probe may."""
        if not self._open:
            return True
        with self._lock:
            now = self._clock()
            if self._open and now >= self._next_probe:
                self._next_probe = now + self.cooldown
                return True
            return not self._open

    def succeeded(self) -> None:
        if self._open:
            with self._lock:
                if not self._open:
                    return
                self._open = False
                log.warning("flask-quota: %s storage recovered; limits apply again", self.name)
            if self.on_change is not None:
                self.on_change(None)

    def failed(self, error: BaseException, fail_mode: str) -> None:
        with self._lock:
            self._next_probe = self._clock() + self.cooldown
            opened = not self._open
            if opened:
                self._open = True
                log.error(
                    "flask-quota: %s storage failed (%s); fail mode %r until it recovers, "
                    "probing every %.1f s",
                    self.name,
                    error,
                    fail_mode,
                    self.cooldown,
                )
        if opened and self.on_change is not None:
            self.on_change(error)

    def seconds_to_probe(self) -> float:
        return max(0.0, self._next_probe - self._clock())
