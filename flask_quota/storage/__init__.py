"""Storage backends: where counters live. ``storage_from_url`` picks one."""

from __future__ import annotations

from .base import Check, Clock, Storage, StorageError, Verdict, wall_clock_us
from .memory import MemoryStorage

__all__ = [
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
    """Build the backend for a ``QUOTA_STORAGE_URL``."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        return MemoryStorage()
    if scheme in ("redis", "rediss", "unix"):
        from .redis import RedisStorage  # redis-py is only imported when used

        return RedisStorage.from_url(url, timeout=timeout)
    if scheme == "redis+sentinel":
        from .sentinel import SentinelStorage

        return SentinelStorage.from_url(url, timeout=timeout)
    if scheme == "redis+cluster":
        from .cluster import ClusterStorage

        return ClusterStorage.from_url(url, timeout=timeout)
    raise ValueError(
        f"QUOTA_STORAGE_URL {url!r} has an unknown scheme: use memory://, redis://host:6379/0, "
        "rediss://host:6380/0, unix:///path/to/redis.sock, "
        "redis+sentinel://host:26379/service_name or redis+cluster://host:6379"
    )
