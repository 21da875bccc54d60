"""Valkey as a first-class server: a real valkey-server reached by ``valkey://`` URLs.

The core of the Redis suite runs on Valkey as well (modules marked ``also_valkey``:
test_redis, test_algorithms and test_limits through tests/backends.py, test_failover,
test_exactness, test_cluster, test_sentinel). This module pins what is Valkey's own:
the server really is Valkey, and an app configured with ``valkey://`` is exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from flask import Flask

from flask_quota import Quota
from flask_quota.core.algorithms import Algorithm
from tests.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.valkey]
# server_kind is session-scoped, as the shared server is (tests/conftest.py).
ON_VALKEY = pytest.mark.parametrize("server_kind", ["valkey"], scope="session")


def test_the_server_is_valkey(server_client: Callable[[str], redis.Redis]) -> None:
    """The Valkey runs talk to a valkey-server (9 or later), not to a redis-server. (The
    session's shared server of that kind, asked for by name: a session-scoped fixture
    given the kind by this module's parameter could be the one another module's test
    made on the same pytest-xdist worker with the other kind.)"""
    info = server_client("valkey").info("server")
    assert info["server_name"] == "valkey", info
    assert int(str(info["valkey_version"]).split(".")[0]) >= 9, info


def _away_from_a_minute_boundary(server: RedisServer) -> None:
    """Wait, on the server's clock, until the next minute is more than 2 s away, so a
    fixed window cannot turn between a test's four requests."""
    with server.client() as client:
        seconds, _ = client.time()
    if seconds % 60 > 57:
        time.sleep(61 - seconds % 60)


@pytest.mark.parametrize("algorithm", list(Algorithm))
@ON_VALKEY
def test_a_valkey_url_is_exact(app: Flask, own_redis: RedisServer, algorithm: Algorithm) -> None:
    """QUOTA_STORAGE_URL=valkey://...: a 3/minute route answers 200 200 200 429 with every
    algorithm, and the counters live on the valkey-server."""
    assert own_redis.url.startswith("valkey://")
    app.config.update(
        QUOTA_STORAGE_URL=own_redis.url,
        QUOTA_STORAGE_TIMEOUT=2,
        QUOTA_FAIL_MODE="closed",  # a storage failure would answer 503, never pass unseen
        QUOTA_ALGORITHM=algorithm.value,
        QUOTA_PLANS={"free": {"user": "3/minute"}},
    )
    Quota(app)
    app.add_url_rule("/ping", "ping", lambda: "pong")
    client = app.test_client()
    _away_from_a_minute_boundary(own_redis)
    assert [client.get("/ping").status_code for _ in range(4)] == [200, 200, 200, 429]
    with own_redis.client() as valkey:
        assert valkey.keys("quota:*"), "no counter on the valkey-server"


@pytest.mark.parametrize(("required", "outcome"), [(True, "Failed"), (False, "Skipped")])
def test_a_missing_valkey_server_fails_where_it_is_required(
    monkeypatch: pytest.MonkeyPatch, required: bool, outcome: str
) -> None:
    """Under CI=true (or QUOTA_REQUIRE_VALKEY) a missing valkey-server fails the Valkey
    tests; elsewhere they are skipped, with a message saying so."""
    from tests import conftest
    from tests.servers import KINDS, ServerKind

    monkeypatch.setitem(KINDS, "valkey", ServerKind("valkey", None, "valkey"))
    monkeypatch.setitem(conftest._REQUIRED, "valkey", required)
    with pytest.raises(BaseException) as info:  # pytest's outcomes are BaseExceptions
        conftest.need_server("valkey")
    assert type(info.value).__name__ == outcome
    assert "valkey-server" in str(info.value)
