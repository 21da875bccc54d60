"""Helpers for the test suites of apps that use flask-quota::

    from flask_quota.testing import FrozenClock, assert_limited, quota_disabled, reset_all

    clock = FrozenClock()
    quota = Quota(app, storage=MemoryStorage(clock))  # or test_storage(url, clock)
    ...
    assert_limited(client.get("/v1/search"), tier="endpoint", resource="bulk_search")
    clock.advance(60)

Installed as a pytest plugin: the ``quota_clock`` and ``quota_storage``
fixtures are available without any import (see ``flask_quota.pytest_plugin``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask

from .core.clock import US
from .state import get_state
from .storage import MemoryStorage, Storage
from .storage.url import parse_storage_url

__all__ = [
    "FrozenClock",
    "MemoryStorage",
    "assert_limited",
    "quota_disabled",
    "reset_all",
    "test_storage",
]


class FrozenClock:
    """A microsecond clock that only moves when told to.

    Pass it to ``MemoryStorage(clock)`` or to ``test_storage(url, clock)`` for
    any backend: Redis then decides with this time instead of its own.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now_us = round(start * US)

    def __call__(self) -> int:
        return self.now_us

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds`` (fractions allowed)."""
        if seconds < 0:
            raise ValueError("a FrozenClock only moves forward")
        self.now_us += round(seconds * US)

    @property
    def seconds(self) -> float:
        """The current time in Unix seconds."""
        return self.now_us / US


def test_storage(url: str = "memory://", clock: FrozenClock | None = None) -> Storage:
    """The backend for ``url`` (any ``QUOTA_STORAGE_URL``), deciding on ``clock`` if given.

    Use it as ``Quota(app, storage=test_storage(url, clock))``. In production the
    Redis backends always use the Redis server's clock.
    """
    parsed = parse_storage_url(url)
    scheme = parsed.scheme
    if scheme == "memory":
        return MemoryStorage(clock) if clock is not None else MemoryStorage()
    timeout = 5.0  # generous: a test machine is often busy
    if scheme == "redis+sentinel":
        from .storage.sentinel import SentinelStorage

        return SentinelStorage.from_url(url, timeout=timeout, clock=clock)
    if scheme == "redis+cluster":
        from .storage.cluster import ClusterStorage

        return ClusterStorage.from_url(url, timeout=timeout, clock=clock)
    from .storage.redis import RedisStorage

    return RedisStorage.from_url(parsed.redis_url, timeout=timeout, clock=clock)


test_storage.__test__ = False  # type: ignore[attr-defined]  # not a test for pytest to collect


@contextmanager
def quota_disabled(app: Flask) -> Iterator[None]:
    """No tier applies to ``app``'s requests inside the block (as ``QUOTA_ENABLED=False``)."""
    state = get_state(app)
    saved = state.settings
    state.settings = dataclasses.replace(saved, enabled=False)
    try:
        yield
    finally:
        state.settings = saved


def reset_all(app: Flask) -> None:
    """Forget every counter of ``app`` (all callers, all tiers), e.g. between tests.

    Memory: everything in the process. Redis: every key under ``QUOTA_KEY_PREFIX``.
    """
    state = get_state(app)
    storage: Any = state.storage
    while hasattr(storage, "storage"):  # unwrap the deny cache (it forgets its denials too)
        storage.clear([])
        storage = storage.storage
    if state.guard.fallback is not None:
        state.guard.fallback.close()
    if isinstance(storage, MemoryStorage):
        storage.close()
        return
    if not hasattr(storage, "keys"):
        raise TypeError(f"reset_all() does not know the {storage.name} backend")
    keys = storage.keys(state.settings.key_prefix + ":*")  # raises StorageError when down
    for start in range(0, len(keys), 500):
        storage.clear(keys[start : start + 500])


def assert_limited(
    response: Any,
    *,
    tier: str | None = None,
    resource: str | None = None,
    retry_after: str = "Retry-After",
) -> dict[str, Any]:
    """Assert that ``response`` is flask-quota's 429 (optionally for ``tier``/``resource``).

    Checks the status, ``Retry-After`` (whole seconds, at least 1; ``retry_after``
    is its name when ``QUOTA_HEADER_NAMES`` renames it) and the problem body;
    returns the body for further checks.
    """
    assert response.status_code == 429, f"expected 429, got {response.status_code}"
    wait = response.headers.get(retry_after, "")
    assert wait.isdigit() and int(wait) >= 1, f"bad {retry_after} {wait!r}"
    body = response.get_json(silent=True) or {}
    assert isinstance(body, dict) and body.get("status") == 429, f"not a quota problem: {body}"
    if tier is not None:
        assert body.get("tier") == tier, f"denied by tier {body.get('tier')!r}, not {tier!r}"
    if resource is not None:
        assert body.get("resource") == resource, (
            f"denied on resource {body.get('resource')!r}, not {resource!r}"
        )
    return body
