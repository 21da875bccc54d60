"""Usage recording for the dashboard: counts per minute, bounded, off the request path."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from flask_quota import Quota
from flask_quota.storage import MemoryStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock
from flask_quota.usage import (
    HOUR,
    REQUESTS,
    TOP_KEPT,
    MemoryUsageSink,
    RedisUsageSink,
    UsageRecorder,
    UsageSink,
)
from tests.servers import RedisServer
from tests.test_redis import CountingConnection, counting_client


@pytest.fixture(params=["memory", "redis"])
def sink(request: pytest.FixtureRequest) -> UsageSink:
    if request.param == "memory":
        return MemoryUsageSink()
    client: redis.Redis = request.getfixturevalue("redis_client")
    return RedisUsageSink(client, "quota")


def test_counts_per_minute_tier_and_identity(sink: UsageSink) -> None:
    """Recorded outcomes come back per minute, per tier and per identity."""
    now = [600_000.0]
    recorder = UsageRecorder(sink, clock=lambda: now[0])
    for _ in range(3):
        recorder.record("id=ada", "pro", [("global", True), ("user", True)])
    recorder.record("ip=1.2.3.4", "free", [("user", False)])
    now[0] += 60
    recorder.record("id=ada", "pro", [("ai_inference", False)])
    recorder.flush()
    minute = int(now[0] // 60)
    first, second = sink.minutes(2, minute)
    assert first.tiers == Counter({("global", True): 3, ("user", True): 3, ("user", False): 1})
    assert first.identities == Counter({"id=ada": 3, "ip=1.2.3.4": 1})  # requests
    assert first.requests == Counter({True: 3, False: 1})
    assert second.tiers == Counter({("ai_inference", False): 1})
    assert second.requests == Counter({False: 1})
    ada = sink.identity_minutes("id=ada", 2, minute)
    assert [m.tiers for m in ada] == [
        Counter({("global", True): 3, ("user", True): 3}),
        Counter({("ai_inference", False): 1}),
    ]
    assert sink.plan_of(["id=ada", "ip=1.2.3.4", "id=nobody"], minute) == {
        "id=ada": "pro",
        "ip=1.2.3.4": "free",
    }


def test_memory_sink_keeps_one_hour() -> None:
    """Minutes older than an hour are dropped, with their identities."""
    sink = MemoryUsageSink()
    sink.add({(0, "id=old", "user", True): 1}, {"id=old": "free"})
    sink.add({(HOUR + 1, "id=new", "user", True): 1}, {"id=new": "free"})
    assert sink.minutes(1, 0)[0].tiers == Counter()
    assert sink.plan_of(["id=old", "id=new"], HOUR + 1) == {"id=new": "free"}


def test_redis_sink_bounds_its_keys(redis_client: redis.Redis) -> None:
    """Every usage key has a TTL and the per-minute top list is trimmed."""
    sink = RedisUsageSink(redis_client, "quota")
    batch = {(7, f"id={i}", REQUESTS, True): i + 1 for i in range(TOP_KEPT + 50)}
    sink.add(batch, {})
    assert redis_client.zcard("quota:usage:7:top") == TOP_KEPT
    assert redis_client.zrevrange("quota:usage:7:top", 0, 0) == [f"id={TOP_KEPT + 49}".encode()]
    keys = redis_client.keys("quota:usage:*")
    assert keys and all(0 < redis_client.ttl(key) <= (HOUR + 5) * 60 for key in keys)


def test_pending_counts_are_bounded() -> None:
    """When the sink cannot keep up, the recorder drops counts instead of growing."""
    recorder = UsageRecorder(MemoryUsageSink(), max_pending=10, clock=lambda: 0.0)
    recorder._thread_pid = -1  # keep the flusher off; nothing drains
    recorder._start = lambda: None  # type: ignore[method-assign]
    for i in range(100):
        recorder.record(f"id={i}", "free", [("user", True)])
    assert len(recorder._pending) == 10
    assert recorder._dropped == 95  # each request adds two counts: its tier and the request


def test_failing_sink_does_not_raise() -> None:
    """A flush that fails is logged and forgotten; requests never see it."""

    class Broken(MemoryUsageSink):
        def add(self, batch: Any, plans: dict[str, str]) -> None:
            raise redis.ConnectionError("down")

    recorder = UsageRecorder(Broken(), clock=lambda: 0.0)
    recorder.record("id=a", "free", [("user", True)])
    recorder.flush()
    assert recorder._pending == {}


def dashboard_app(tmp_path: Path, storage: Any, **config: Any) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.secret_key = "test"
    app.config.update({"QUOTA_PLANS": {"free": {"user": "2/minute"}}, **config})
    Quota(app, storage=storage)

    @app.get("/items")
    def items() -> str:
        return "ok"

    return app


def test_app_records_admitted_and_denied_requests(tmp_path: Path) -> None:
    """With the dashboard on, each request is counted once: allowed, or denied by its tier."""
    app = dashboard_app(tmp_path, MemoryStorage(FrozenClock()), QUOTA_DASHBOARD_URL="/quota")
    http = app.test_client()
    assert [http.get("/items").status_code for _ in range(3)] == [200, 200, 429]
    usage = app.extensions["quota"].usage
    usage.flush()
    import time

    minute = int(time.time() // 60)
    totals = sum((m.tiers for m in usage.sink.minutes(2, minute)), Counter())
    assert totals == Counter({("user", True): 2, ("user", False): 1})


def test_no_recording_without_the_dashboard(tmp_path: Path) -> None:
    """Usage recording costs nothing when the dashboard is not mounted."""
    app = dashboard_app(tmp_path, MemoryStorage())
    assert app.extensions["quota"].usage is None


def test_recording_adds_no_round_trip(tmp_path: Path, redis_server: RedisServer) -> None:
    """On Redis, a request still costs one round trip; usage goes out in the flush."""
    client = counting_client(redis_server)
    app = dashboard_app(tmp_path, RedisStorage(client), QUOTA_DASHBOARD_URL="/quota")
    http = app.test_client()
    http.get("/items")
    for _ in range(2):
        before = CountingConnection.sent
        http.get("/items")
        assert CountingConnection.sent - before == 1
