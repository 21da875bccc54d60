"""Storage backends: where counters live. ``storage_from_url`` picks one."""

from __future__ import annotations

from .base import BlockEntry, Check, Clock, Storage, StorageError, Verdict, wall_clock_us
from .memory import MemoryStorage
from .url import FORMS, parse_storage_url

__all__ = [
    "BlockEntry",
    "Check",
    "Clock",
    "MemoryStorage",
    "Storage",
    "StorageError",
    "Verdict",
    "storage_from_url",
    "wall_clock_us",
]


def storage_from_url(url: str, *, timeout: float) -> Storage:
    """Build the backend for a ``QUOTA_STORAGE_URL`` (no connection is made yet).

    Raises ``ValueError`` naming the accepted forms, with any password masked.
    """
    parsed = parse_storage_url(url)
    if parsed.scheme == "memory":
        return MemoryStorage()
    if parsed.scheme == "redis+sentinel":
        from .sentinel import SentinelStorage  # redis-py is only imported when used

        return SentinelStorage.from_url(url, timeout=timeout)
    if parsed.scheme == "redis+cluster":
        from .cluster import ClusterStorage

        return ClusterStorage.from_url(url, timeout=timeout)
    from .redis import RedisStorage

    try:
        return RedisStorage.from_url(parsed.redis_url, timeout=timeout)
    except ValueError as exc:  # redis-py's own checks (e.g. a db that is not a number)
        message = str(exc).replace(parsed.redis_url, parsed.shown)
        raise ValueError(f"QUOTA_STORAGE_URL {parsed.shown!r}: {message}; use {FORMS}") from None
