"""What happens when the storage fails: ``QUOTA_FAIL_MODE`` behind a circuit breaker."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from .breaker import CircuitBreaker
from .errors import QuotaUnavailable
from .settings import FailMode
from .storage import Check, MemoryStorage, Storage, StorageError, Verdict

__all__ = ["GuardedStorage"]

log = logging.getLogger("flask_quota")
T = TypeVar("T")


class GuardedStorage:
    """Calls the storage while it works; otherwise applies the fail mode.

    ``open`` lets requests through unlimited, ``closed`` refuses them with 503,
    ``local`` limits them with an in-process memory store (per worker).
    """

    def __init__(self, storage: Storage, mode: FailMode, breaker: CircuitBreaker) -> None:
        self.storage = storage
        self.mode = mode
        self.breaker = breaker
        self.fallback = MemoryStorage() if mode is FailMode.LOCAL else None

    @property
    def degraded(self) -> bool:
        """True while the breaker is open and the fail mode applies."""
        return self.breaker.is_open

    def decide(self, checks: Sequence[Check]) -> Verdict | None:
        """The verdict, or ``None`` for "fail open: no limit applies"."""
        if self.breaker.allow():
            try:
                verdict = self.storage.decide(checks)
            except StorageError as exc:
                self.breaker.failed(exc, self.mode.value)
            else:
                self.breaker.succeeded()
                return verdict
        if self.fallback is not None:
            return self.fallback.decide(checks)
        if self.mode is FailMode.CLOSED:
            raise QuotaUnavailable(math.ceil(self.breaker.seconds_to_probe()))
        return None

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        """Give a charge back (``charge_when`` said no). See ``adjust``."""
        self._after(lambda store: store.refund(checks, charged_at_us), "refund")

    def charge(self, checks: Sequence[Check]) -> None:
        """Charge after the response (``quota.charge``), past the limit if need be."""
        self._after(lambda store: store.charge(checks), "charge")

    def _after(self, call: Callable[[Storage], None], what: str) -> None:
        """Run a correction after the response, through the breaker like ``decide``.

        While the breaker is open the decision came from the fallback, so the
        correction goes there too (or nowhere, failing open or closed). A failed
        correction cannot refuse a response already made: it is lost, and logged
        once by the breaker (a lost refund only under-admits).
        """
        if self.breaker.allow():
            try:
                call(self.storage)
            except StorageError as exc:
                self.breaker.failed(exc, self.mode.value)
                log.debug("flask-quota: %s lost: %s", what, exc)
            else:
                self.breaker.succeeded()
            return
        if self.fallback is not None:
            call(self.fallback)

    def attempt(self, call: Callable[[], T]) -> T | None:
        """Run a storage call made after the decision (a block escalation).

        ``None`` when the breaker is open or the call fails; failures count
        towards the breaker, but the fail mode does not apply: the request
        already has its answer.
        """
        if not self.breaker.allow():
            return None
        try:
            result = call()
        except StorageError as exc:
            self.breaker.failed(exc, self.mode.value)
            return None
        self.breaker.succeeded()
        return result
