"""flask_quota.testing and the pytest plugin: what users get for their own test suites."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.storage import MemoryStorage
from flask_quota.testing import (
    FrozenClock,
    assert_limited,
    quota_disabled,
    reset_all,
    test_storage,
)

from .servers import RedisServer


def _app(tmp_path: Path, storage: object) -> tuple[Flask, Quota]:
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_PLANS"] = {"free": {"user": "2/minute"}}
    quota = Quota(app, storage=storage)  # type: ignore[arg-type]

    @app.get("/")
    def index() -> str:
        return "ok"

    return app, quota


def test_the_plugin_is_registered_for_pytest() -> None:
    """The installed distribution names flask_quota.pytest_plugin under pytest11."""
    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("flask_quota") == "flask_quota.pytest_plugin"


def test_plugin_fixtures_need_no_import(
    quota_clock: FrozenClock, quota_storage: MemoryStorage, tmp_path: Path
) -> None:
    """quota_clock and quota_storage come from the plugin; the storage runs on the clock."""
    app, _ = _app(tmp_path, quota_storage)
    http = app.test_client()
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]
    quota_clock.advance(60)
    assert http.get("/").status_code == 200


def test_quota_disabled_lifts_every_limit_inside_the_block(tmp_path: Path) -> None:
    """Inside quota_disabled(app) nothing is limited or charged; after it, limits apply."""
    app, _ = _app(tmp_path, MemoryStorage(FrozenClock()))
    http = app.test_client()
    with quota_disabled(app):
        responses = [http.get("/") for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert all("X-RateLimit-Limit" not in r.headers for r in responses)
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]


def test_assert_limited_accepts_our_429_and_names_what_is_wrong(tmp_path: Path) -> None:
    """assert_limited passes on a quota 429 and fails, saying why, on anything else."""
    app, _ = _app(tmp_path, MemoryStorage(FrozenClock()))
    http = app.test_client()
    ok = http.get("/")
    http.get("/")
    body = assert_limited(http.get("/"), tier="user")
    assert body["limit"] == 2
    with pytest.raises(AssertionError, match="expected 429"):
        assert_limited(ok)
    with pytest.raises(AssertionError, match="not 'endpoint'"):
        assert_limited(http.get("/"), tier="endpoint")


@pytest.mark.redis
def test_reset_all_and_frozen_clock_on_real_redis(own_redis: RedisServer, tmp_path: Path) -> None:
    """test_storage(url, clock) decides on the frozen clock; reset_all empties every key."""
    clock = FrozenClock()
    app, _ = _app(tmp_path, test_storage(own_redis.url, clock))
    http = app.test_client()
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]
    clock.advance(30)  # half the window of a 2/minute bucket: one token back
    assert [http.get("/").status_code for _ in range(2)] == [200, 429]
    assert own_redis.client().keys("quota:*")
    reset_all(app)
    assert own_redis.client().keys("quota:*") == []
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]


def test_reset_all_on_memory(tmp_path: Path) -> None:
    """reset_all forgets the in-process counters."""
    app, _ = _app(tmp_path, MemoryStorage(FrozenClock()))
    http = app.test_client()
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]
    reset_all(app)
    assert [http.get("/").status_code for _ in range(3)] == [200, 200, 429]
