"""Build memory and Redis storages that share one injected clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flask_quota.storage import MemoryStorage, Storage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

# Minute- and hour-aligned, so window scenarios start at a window boundary.
ALIGNED = 1_699_999_200.0


@pytest.fixture(params=["memory", "redis", pytest.param("valkey", marks=pytest.mark.valkey)])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[Storage, FrozenClock]]:
    """The same scenario on the memory backend, a real redis-server and a real valkey-server."""
    clock = FrozenClock(ALIGNED)
    if request.param == "memory":
        yield MemoryStorage(clock), clock
        return
    client = request.getfixturevalue("server_client")(request.param)
    yield RedisStorage(client, clock=clock), clock
