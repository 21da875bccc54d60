"""What happens when the storage fails: ``QUOTA_FAIL_MODE`` behind a circuit breaker."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .breaker import CircuitBreaker
from .errors import QuotaUnavailable
from .settings import FailMode
from .storage import Check, MemoryStorage, Storage, StorageError, Verdict
from .usage import UsageSink, usage_sink

__all__ = ["GuardedStorage"]


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

    def usage_sink(self, prefix: str) -> UsageSink:
        """The guarded storage's usage sink."""
        return usage_sink(self.storage, prefix)
