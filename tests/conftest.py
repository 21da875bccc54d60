"""Fixtures: a fresh app per test, a frozen clock, and real redis-server processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask import Flask

from flask_quota.testing import FrozenClock
from tests.servers import REDIS_SERVER, RedisServer

# CI sets CI=true: there a missing redis-server is a failure, not a skip.
REDIS_REQUIRED = os.environ.get("CI", "").lower() in ("1", "true") or bool(
    os.environ.get("QUOTA_REQUIRE_REDIS")
)


def pytest_report_header() -> str:
    if REDIS_SERVER is None:
        return "!!! redis-server NOT FOUND: every Redis test is SKIPPED (apt-get install it)"
    return f"redis-server: {REDIS_SERVER}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if REDIS_SERVER is None:
        sys.stderr.write(
            "\n\n!!! WARNING: redis-server is not installed; all Redis tests were SKIPPED.\n"
            "!!! Install it (apt-get install redis-server) to run the full suite.\n\n"
        )


def _need_redis() -> None:
    if REDIS_SERVER is None:
        if REDIS_REQUIRED:
            pytest.fail("redis-server is required here (CI) but is not installed")
        pytest.skip("!!! redis-server not installed: Redis test SKIPPED")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One shared redis-server for tests that only read and write keys."""
    _need_redis()
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server this test alone may kill, pause or restart."""
    _need_redis()
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config["TESTING"] = True
    return app
