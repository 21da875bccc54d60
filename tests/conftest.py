"""Fixtures: a fresh app per test, a frozen clock, and real redis-server processes.

CI (``CI=true``) runs every real part: a missing redis-server or PostgreSQL
fails the tests that need it instead of skipping them (tests/sqldb.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from flask import Flask
from sqlalchemy.engine import make_url

from flask_quota.testing import FrozenClock
from tests.cluster import REDIS_CLI, Cluster
from tests.servers import REDIS_SERVER, RedisServer
from tests.sqldb import POSTGRES_REQUIRED, POSTGRES_URL, sql_store

# CI sets CI=true: there a missing redis-server is a failure, not a skip.
REDIS_REQUIRED = os.environ.get("CI", "").lower() in ("1", "true") or bool(
    os.environ.get("QUOTA_REQUIRE_REDIS")
)


def pytest_report_header() -> list[str]:
    lines = [
        f"redis-server: {REDIS_SERVER}"
        if REDIS_SERVER is not None
        else "!!! redis-server NOT FOUND: every Redis test is SKIPPED (apt-get install it)"
    ]
    if POSTGRES_URL is not None:
        lines.append(f"PostgreSQL: {make_url(POSTGRES_URL).render_as_string(hide_password=True)}")
    else:
        lines.append("!!! QUOTA_TEST_DATABASE_URL not set: PostgreSQL variants are SKIPPED")
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if REDIS_SERVER is None:
        sys.stderr.write(
            "\n\n!!! WARNING: redis-server is not installed; all Redis tests were SKIPPED.\n"
            "!!! Install it (apt-get install redis-server) to run the full suite.\n\n"
        )
    if POSTGRES_URL is None and not POSTGRES_REQUIRED:
        sys.stderr.write(
            "\n!!! WARNING: QUOTA_TEST_DATABASE_URL is not set; the PostgreSQL variants were\n"
            "!!! SKIPPED. scripts/test.sh finds or starts a PostgreSQL and sets it.\n\n"
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A six-node Redis Cluster (three masters, three replicas), one per test module."""
    _need_redis()
    if REDIS_CLI is None:
        pytest.skip("redis-cli not installed")
    nodes = Cluster(tmp_path_factory.mktemp("cluster"))
    yield nodes
    nodes.stop()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def close_sql() -> Iterator[Callable[[Flask], Flask]]:
    """Register an app (returned as is) whose SQL store is closed when the test ends."""
    apps: list[Flask] = []

    def register(app: Flask) -> Flask:
        apps.append(app)
        return app

    yield register
    for app in apps:
        sql_store(app).close()


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config["TESTING"] = True
    return app
