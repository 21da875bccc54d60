"""A Redis restart is not an outage, and a lost reply is never sent twice.

Each test owns a real redis-server. After a restart every pooled connection is
dead: the request path must notice that before it sends, and go out on a fresh
connection, so the requests right after the restart are decided, not refused.
A call whose reply is lost after it was sent may have run: it is not retried.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota import Quota
from tests.redis_probes import wait_until_asleep
from tests.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.also_valkey]

LIMIT = 50


def closed_app(app: Flask, server: RedisServer, timeout: float = 0.5) -> FlaskClient:
    app.config.update(
        QUOTA_STORAGE_URL=server.url,
        QUOTA_STORAGE_TIMEOUT=timeout,
        QUOTA_FAIL_MODE="closed",
        QUOTA_PLANS={"test": {"user": f"{LIMIT}/hour"}},
        QUOTA_DEFAULT_PLAN="test",
        QUOTA_ANONYMOUS_PLAN="test",
        QUOTA_DENY_CACHE=False,
    )
    Quota(app)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    return app.test_client()


def pool_connections(client: FlaskClient, n: int) -> None:
    """Make the app hold ``n`` idle connections: ``n`` requests in flight at once."""
    barrier = threading.Barrier(n)
    statuses: list[int] = []

    def one() -> None:
        barrier.wait()
        statuses.append(client.get("/ping").status_code)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * n


def test_requests_after_a_restart_while_idle_are_all_decided(
    app: Flask, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Closed mode: Redis restarted while the app sat idle with pooled connections; the
    next requests, one after another and then eight at once, are all 200, and no
    storage failure is logged."""
    client = closed_app(app, own_redis)
    pool_connections(client, 8)
    own_redis.kill()
    own_redis.start()
    with caplog.at_level(logging.DEBUG, logger="flask_quota"):
        assert [client.get("/ping").status_code for _ in range(5)] == [200] * 5
        pool_connections(client, 8)
    failures = [r for r in caplog.records if "fail" in r.getMessage()]
    assert failures == []
    remaining = client.get("/ping").headers["X-RateLimit-Remaining"]
    assert int(remaining) == LIMIT - 5 - 8 - 1  # every request after the restart counted once


def test_a_connection_closed_by_the_server_is_replaced_before_sending(
    app: Flask, own_redis: RedisServer
) -> None:
    """The server dropping idle clients (CLIENT KILL, an idle timeout) costs nothing:
    the next request is decided on a fresh connection."""
    client = closed_app(app, own_redis)
    pool_connections(client, 4)
    admin = own_redis.client()
    try:
        killed = admin.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1  # the app's pooled connections (threads may have shared some)
    finally:
        admin.close()
        admin.connection_pool.disconnect()
    assert [client.get("/ping").status_code for _ in range(4)] == [200] * 4


def test_a_reply_lost_after_sending_is_not_retried(
    app: Flask, tmp_path: Path, server_kind: str
) -> None:
    """A call that was sent and then timed out waiting for its reply is a storage
    failure (503 in closed mode), not retried: the script ran once when the server
    woke, so the bucket shows exactly one charge for it, never two."""
    server = RedisServer(
        tmp_path / "redis", None, "--enable-debug-command", "local", kind=server_kind
    )
    try:
        client = closed_app(app, server, timeout=0.2)
        assert client.get("/ping").status_code == 200  # one charged, connection pooled

        def sleep() -> None:
            with server.client() as admin:
                admin.execute_command("DEBUG", "SLEEP", "0.6")

        hang = threading.Thread(target=sleep)
        hang.start()
        wait_until_asleep(server)
        lost = client.get("/ping")
        hang.join(timeout=10)
        assert lost.status_code == 503
        after = client.get("/ping")
        assert after.status_code == 200
        # 1 before, 1 whose reply was lost (it ran), 1 now: three charges, not four.
        assert int(after.headers["X-RateLimit-Remaining"]) == LIMIT - 3
    finally:
        server.stop()


def test_reconnects_never_use_up_a_bounded_pool(own_redis: RedisServer) -> None:
    """With ?max_connections=2 in the URL, connections the server keeps closing are
    reconnected, never replaced by new ones that count against the pool's bound: after
    ten rounds of CLIENT KILL every call still works."""
    from flask_quota.core.algorithms import Algorithm
    from flask_quota.core.rates import parse_rate
    from flask_quota.storage import Check
    from flask_quota.storage.redis import RedisStorage

    storage = RedisStorage.from_url(f"{own_redis.url}?max_connections=2", timeout=2.0)
    check = Check("k", Algorithm.TOKEN_BUCKET, parse_rate("1000/minute"), 1)
    admin = own_redis.client()
    try:
        for _ in range(10):
            storage.decide([check])
            admin.client_kill_filter(_type="normal", skipme=True)
        assert storage.decide([check]).outcomes[0].allowed
    finally:
        storage.close()
        admin.close()
        admin.connection_pool.disconnect()
