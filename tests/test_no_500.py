"""Nothing inside the limiter answers 500.

An exception of any kind from the storage call is a storage failure for
``QUOTA_FAIL_MODE``; a signal receiver that raises is logged and the decision
stands; a ``key=`` callable returning ``None`` means the limit does not apply;
an app's own 429 handler keeps the ``Retry-After`` of what denied the request.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from flask import Flask, request
from flask.testing import FlaskClient

from flask_quota import Quota, QuotaExceeded, signals
from flask_quota.storage.redis import RedisStorage
from tests.servers import RedisServer


class BrokenConnection(redis.Connection):
    """A real connection whose replies raise what no storage code expects."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        super().read_response(*args, **kwargs)  # the call really ran on the server
        raise RuntimeError("a bug deep inside the Redis client")


def broken_app(app: Flask, server: RedisServer, mode: str) -> tuple[FlaskClient, Quota]:
    app.config.update(
        QUOTA_FAIL_MODE=mode,
        QUOTA_PLANS={"test": {"user": "3/minute"}},
        QUOTA_DEFAULT_PLAN="test",
        QUOTA_ANONYMOUS_PLAN="test",
        QUOTA_METRICS_URL="/metrics",
    )
    pool = redis.ConnectionPool(
        port=server.port, connection_class=BrokenConnection, socket_timeout=1
    )
    quota = Quota(app, storage=RedisStorage(redis.Redis(connection_pool=pool)))

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    return app.test_client(), quota


def metric(client: FlaskClient, outcome: str) -> float:
    total = 0.0
    for line in client.get("/metrics").get_data(as_text=True).splitlines():
        if line.startswith("flask_quota_decisions_total{") and f'outcome="{outcome}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.redis
def test_an_unexpected_error_in_the_client_fails_open(
    app: Flask, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Open mode: a RuntimeError raised inside redis-py during the decision admits every
    request (200, never 500), counts fail_open, and logs its traceback once, not once
    per request."""
    client, _ = broken_app(app, redis_server, "open")
    with caplog.at_level(logging.ERROR, logger="flask_quota"):
        statuses = [client.get("/ping").status_code for _ in range(8)]
    assert statuses == [200] * 8
    unexpected = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert len(unexpected) == 1
    assert unexpected[0].exc_info is not None
    assert "a bug deep inside the Redis client" in caplog.text
    assert metric(client, "fail_open") >= 8


@pytest.mark.redis
def test_an_unexpected_error_in_the_client_fails_closed(
    app: Flask, redis_server: RedisServer
) -> None:
    """Closed mode: the same error answers 503 with Retry-After, never 500, and counts
    fail_closed."""
    client, _ = broken_app(app, redis_server, "closed")
    responses = [client.get("/ping") for _ in range(4)]
    assert [r.status_code for r in responses] == [503] * 4
    assert all(int(r.headers["Retry-After"]) >= 1 for r in responses)
    assert metric(client, "fail_closed") >= 4


@pytest.mark.redis
def test_an_unexpected_error_in_the_client_decides_locally(
    app: Flask, redis_server: RedisServer
) -> None:
    """Local mode: the in-process fallback decides, so the 3/minute limit still holds
    (once the breaker is open; before, a failed call may have counted on the server
    and is only checked locally, see GuardedStorage)."""
    client, _ = broken_app(app, redis_server, "local")
    statuses = [client.get("/ping").status_code for _ in range(12)]
    assert 500 not in statuses
    assert statuses[-1] == 429


def limited_app(app: Flask) -> tuple[FlaskClient, Quota]:
    app.config.update(QUOTA_PLANS={"test": {}}, QUOTA_DEFAULT_PLAN="test")
    app.config["QUOTA_ANONYMOUS_PLAN"] = "test"
    quota = Quota(app)

    @app.get("/one")
    @quota.limit("1/minute")
    def one() -> str:
        return "ok"

    return app.test_client(), quota


def test_a_raising_quota_exceeded_receiver_keeps_the_429(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver of quota_exceeded that raises is logged; the caller still gets 429,
    and a second receiver still hears of it."""
    client, _ = limited_app(app)
    heard: list[str] = []

    def boom(sender: Flask, **extra: Any) -> None:
        raise ValueError("receiver bug")

    def listen(sender: Flask, decision: Any, **extra: Any) -> None:
        heard.append(decision.denied.name)

    signals.quota_exceeded.connect(boom, app)
    signals.quota_exceeded.connect(listen, app)
    try:
        with caplog.at_level(logging.ERROR, logger="flask_quota"):
            statuses = [client.get("/one").status_code for _ in range(2)]
    finally:
        signals.quota_exceeded.disconnect(boom, app)
        signals.quota_exceeded.disconnect(listen, app)
    assert statuses == [200, 429]
    assert heard == ["one"]
    assert "receiver bug" in caplog.text


def test_a_raising_storage_signal_receiver_changes_nothing(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """storage_failed receivers run inside the breaker: one that raises is logged and the
    request still gets its fail-mode answer (open: 200)."""
    app.config.update(
        QUOTA_STORAGE_URL="redis://127.0.0.1:1/0",  # nothing listens there
        QUOTA_FAIL_MODE="open",
        QUOTA_BREAKER_THRESHOLD=1,
    )
    Quota(app)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    def boom(sender: Flask, **extra: Any) -> None:
        raise ValueError("storage receiver bug")

    signals.storage_failed.connect(boom, app)
    try:
        with caplog.at_level(logging.ERROR, logger="flask_quota"):
            statuses = [app.test_client().get("/ping").status_code for _ in range(3)]
    finally:
        signals.storage_failed.disconnect(boom, app)
    assert statuses == [200, 200, 200]
    assert "storage receiver bug" in caplog.text


def test_a_key_callable_returning_none_skips_that_limit(app: Flask) -> None:
    """key() -> None: the limit does not apply to that request (no org, no org limit);
    requests with a key are limited per key as before."""
    app.config.update(QUOTA_PLANS={"test": {}}, QUOTA_DEFAULT_PLAN="test")
    app.config["QUOTA_ANONYMOUS_PLAN"] = "test"
    quota = Quota(app)

    @app.get("/search")
    @quota.limit(
        "2/minute",
        resource="org_search",
        # docs/usage.md: ``key() -> str | None``; Quota.limit's annotation says ``str``.
        key=lambda: request.args.get("org"),
    )
    def search() -> str:
        return "ok"

    client = app.test_client()
    without = [client.get("/search") for _ in range(5)]
    assert [r.status_code for r in without] == [200] * 5
    assert all("org_search" not in r.headers.get("RateLimit-Policy", "") for r in without)
    assert [client.get("/search?org=acme").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/search?org=globex").status_code == 200


def test_a_key_callable_returning_a_non_str_still_raises(app: Flask) -> None:
    """A programming error the app can fix (key() returning an int) is raised visibly."""
    app.config.update(QUOTA_PLANS={"test": {}}, QUOTA_DEFAULT_PLAN="test")
    app.config["QUOTA_ANONYMOUS_PLAN"] = "test"
    quota = Quota(app)

    @app.get("/search")
    @quota.limit("2/minute", key=lambda: 42)  # type: ignore[arg-type, return-value]
    def search() -> str:
        return "ok"

    with pytest.raises(TypeError, match="not a str"):
        app.test_client().get("/search")


def test_a_custom_handler_keeps_the_blocks_retry_after(app: Flask) -> None:
    """With @app.errorhandler(QuotaExceeded), a blocked caller's 429 still carries
    Retry-After, the rest of the block, not a tier's one second."""
    app.config.update(QUOTA_PLANS={"test": {"user": "100/second"}}, QUOTA_DEFAULT_PLAN="test")
    app.config["QUOTA_ANONYMOUS_PLAN"] = "test"
    quota = Quota(app)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    @app.errorhandler(QuotaExceeded)
    def mine(exc: QuotaExceeded) -> tuple[dict[str, str], int]:
        return {"error": "slow down"}, 429

    client = app.test_client()
    assert client.get("/ping").status_code == 200
    with app.app_context():
        quota.block(ip="127.0.0.1", seconds=600)
    blocked = client.get("/ping")
    assert blocked.status_code == 429
    assert blocked.get_json() == {"error": "slow down"}
    assert 590 <= int(blocked.headers["Retry-After"]) <= 600


def test_a_custom_handler_gets_the_escalated_blocks_retry_after(app: Flask) -> None:
    """The request whose denial triggers QUOTA_BLOCK_AFTER gets the block's Retry-After
    under the app's own handler, not the tier's."""
    app.config.update(
        QUOTA_PLANS={"test": {"user": "1/minute"}},
        QUOTA_DEFAULT_PLAN="test",
        QUOTA_BLOCK_AFTER="2/minute",
        QUOTA_BLOCK_FOR=300,
    )
    app.config["QUOTA_ANONYMOUS_PLAN"] = "test"
    Quota(app)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    @app.errorhandler(QuotaExceeded)
    def mine(exc: QuotaExceeded) -> tuple[str, int]:
        return "no", 429

    client = app.test_client()
    responses = [client.get("/ping") for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 429, 429, 429, 429]
    waits = [int(r.headers["Retry-After"]) for r in responses[1:]]
    assert waits[0] <= 60  # an ordinary denial: the tier's wait
    assert waits[-1] > 60 and waits[-1] <= 300  # blocked: the block's rest
