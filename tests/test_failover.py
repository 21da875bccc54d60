"""Storage failures under a running app: fail modes, timeouts and the circuit breaker.

Every test owns a real redis-server and kills, restarts or pauses it while an
in-process Flask app keeps serving. Nothing is mocked: the breaker test only
wraps the real ``RedisStorage.decide`` to count how often it is called.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from flask_quota import Quota
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check, Storage, Verdict
from flask_quota.storage.breaker import DEFAULT_THRESHOLD
from flask_quota.storage.redis import RedisStorage
from tests.redis_probes import wait_until_asleep
from tests.servers import RedisServer

# quiet: every test here bounds request latencies while Redis is down or hung.
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.also_valkey, pytest.mark.quiet]

TIMEOUT = 0.2  # QUOTA_STORAGE_TIMEOUT of every app here
MAX_LATENCY = 1.0  # no request may take longer while Redis is down or hung
RECOVERY = 5.0  # seconds within which limits must apply again after a restart
LIMIT = 3
THRESHOLD = DEFAULT_THRESHOLD  # QUOTA_BREAKER_THRESHOLD: failures in a row that open the breaker
RATE_HEADERS = (
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "RateLimit",
    "RateLimit-Policy",
)


def quota_app(app: Flask, server: RedisServer, mode: str, **config: object) -> FlaskClient:
    """``app`` limited to LIMIT requests a minute per caller on ``server``, in ``mode``."""
    app.config.update(
        QUOTA_STORAGE_URL=server.url,
        QUOTA_STORAGE_TIMEOUT=TIMEOUT,
        QUOTA_FAIL_MODE=mode,
        QUOTA_PLANS={"test": {"user": f"{LIMIT}/minute"}},
        QUOTA_DEFAULT_PLAN="test",
        QUOTA_ANONYMOUS_PLAN="test",
        # These tests are about the fail modes; a cached denial (tests/test_denycache.py)
        # would rightly keep a denied caller denied through the outage.
        QUOTA_DENY_CACHE=False,
        **config,
    )
    Quota(app)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    return app.test_client()


def timed_get(client: FlaskClient) -> tuple[TestResponse, float]:
    start = time.perf_counter()
    response = client.get("/ping")
    return response, time.perf_counter() - start


def has_rate_headers(response: TestResponse) -> bool:
    return any(name in response.headers for name in RATE_HEADERS)


def poll_until(
    client: FlaskClient, done: Callable[[TestResponse], bool], *, allowed: set[int]
) -> list[TestResponse]:
    """Send requests until ``done`` holds, for RECOVERY s at most; each status in ``allowed``."""
    seen: list[TestResponse] = []
    deadline = time.monotonic() + RECOVERY
    while time.monotonic() < deadline:
        response = client.get("/ping")
        seen.append(response)
        assert response.status_code in allowed, [r.status_code for r in seen]
        if done(response):
            return seen
        time.sleep(0.05)
    pytest.fail(f"not recovered within {RECOVERY} s: {[r.status_code for r in seen]}")


def redis_keys(server: RedisServer) -> list[bytes]:
    client = server.client()
    try:
        return list(client.scan_iter("quota:*"))
    finally:
        client.close()


def assert_problem(response: TestResponse, status: int) -> None:
    retry_after = response.headers.get("Retry-After", "")
    assert retry_after.isdigit() and int(retry_after) >= 1, retry_after
    assert response.mimetype == "application/problem+json"
    body = response.get_json(force=True)
    assert body["status"] == status
    assert body["retry_after"] == int(retry_after)


def test_fail_open_serves_without_limits_while_redis_is_dead(
    app: Flask, own_redis: RedisServer
) -> None:
    """Fail-open: 200 without rate-limit headers while Redis is dead; limits return after."""
    client = quota_app(app, own_redis, "open")
    assert [client.get("/ping").status_code for _ in range(LIMIT + 1)] == [200] * LIMIT + [429]

    own_redis.kill()
    for _ in range(30):  # far past the limit: nothing is counted while Redis is dead
        response, elapsed = timed_get(client)
        assert response.status_code == 200
        assert not has_rate_headers(response), dict(response.headers)
        assert elapsed < MAX_LATENCY

    own_redis.start()  # empty: the restarted Redis grants a full budget again
    seen = poll_until(client, has_rate_headers, allowed={200})
    decided = [seen[-1].status_code] + [client.get("/ping").status_code for _ in range(LIMIT)]
    assert decided == [200] * LIMIT + [429]
    assert redis_keys(own_redis), "the restarted Redis holds no counter"


def test_fail_closed_refuses_with_503_problem_while_redis_is_dead(
    app: Flask, own_redis: RedisServer
) -> None:
    """Fail-closed: 503 + Retry-After + problem+json while Redis is dead; 200/429 after."""
    client = quota_app(app, own_redis, "closed")
    assert client.get("/ping").status_code == 200

    own_redis.kill()
    for _ in range(10):
        response, elapsed = timed_get(client)
        assert response.status_code == 503
        assert_problem(response, 503)
        assert elapsed < MAX_LATENCY

    own_redis.start()
    seen = poll_until(client, lambda r: r.status_code != 503, allowed={200, 503})
    decided = [seen[-1].status_code] + [client.get("/ping").status_code for _ in range(LIMIT)]
    assert decided == [200] * LIMIT + [429]


def test_fail_local_keeps_limiting_in_process_while_redis_is_dead(
    app: Flask, own_redis: RedisServer
) -> None:
    """Fail-local: an in-process limiter enforces the limit while Redis is dead; Redis after.

    The failed calls before the breaker opens are checked locally but not charged
    (a failed call may have counted on Redis): the local limit starts with the
    breaker open."""
    client = quota_app(app, own_redis, "local")
    assert client.get("/ping").status_code == 200

    own_redis.kill()
    timed = [timed_get(client) for _ in range(THRESHOLD + LIMIT + 3)]
    assert [r.status_code for r, _ in timed] == [200] * (THRESHOLD + LIMIT) + [429] * 3
    assert all(elapsed < MAX_LATENCY for _, elapsed in timed)
    assert timed[0][0].headers["X-RateLimit-Limit"] == str(LIMIT)
    checked_only = {r.headers["X-RateLimit-Remaining"] for r, _ in timed[:THRESHOLD]}
    assert checked_only == {str(LIMIT - 1)}  # checked against the local limit, not charged
    denied = timed[THRESHOLD + LIMIT][0]
    assert_problem(denied, 429)
    assert denied.get_json(force=True)["tier"] == "user"

    own_redis.start()  # empty, while the local limiter is spent: a 200 means Redis decides
    seen = poll_until(client, lambda r: r.status_code == 200, allowed={200, 429})
    assert redis_keys(own_redis), "back on Redis, yet the restarted Redis holds no counter"
    decided = [seen[-1].status_code] + [client.get("/ping").status_code for _ in range(LIMIT)]
    assert decided == [200] * LIMIT + [429]


@pytest.mark.parametrize("mode", ["open", "closed", "local"])
def test_hung_redis_costs_a_request_at_most_the_storage_timeout(
    app: Flask, own_redis: RedisServer, mode: str
) -> None:
    """A Redis that accepts but never answers delays requests by ~QUOTA_STORAGE_TIMEOUT only."""
    client = quota_app(app, own_redis, mode)
    assert client.get("/ping").status_code == 200  # connection and script are ready

    own_redis.pause(3000)
    timed: list[tuple[TestResponse, float]] = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline and len(timed) < 60:
        timed.append(timed_get(client))
        time.sleep(0.02)
    latencies = [elapsed for _, elapsed in timed]
    statuses = [response.status_code for response, _ in timed]

    assert max(latencies) < MAX_LATENCY, latencies
    # The test is only meaningful if the pause did stall a call until the timeout.
    assert max(latencies) >= TIMEOUT * 0.75, latencies
    assert len(timed) > THRESHOLD + LIMIT + 1
    if mode == "open":
        assert set(statuses) == {200}
    elif mode == "closed":
        assert set(statuses) == {503}
    else:  # the local limiter starts afresh once THRESHOLD timeouts have opened the breaker
        opened = THRESHOLD + LIMIT
        assert statuses[: opened + 1] == [200] * opened + [429]
        assert set(statuses[opened:]) == {429}


class CountingDecide:
    """Wraps the real ``decide`` of a storage and remembers when it was called."""

    def __init__(self, decide: Callable[[Sequence[Check]], Verdict]) -> None:
        self.decide = decide
        self.calls: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, checks: Sequence[Check]) -> Verdict:
        with self._lock:
            self.calls.append(time.monotonic())
        return self.decide(checks)


def test_breaker_probes_dead_redis_once_per_cooldown_and_logs_once(
    app: Flask,
    own_redis: RedisServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The breaker opens after THRESHOLD failures in a row, then calls the dead Redis
    ~once per cooldown, and logs each change once."""
    caplog.set_level(logging.INFO, logger="flask_quota")
    client = quota_app(app, own_redis, "open")
    state = app.extensions["quota"]
    spy = CountingDecide(state.storage.decide)
    monkeypatch.setattr(state.storage, "decide", spy)
    cooldown = state.settings.breaker_cooldown
    assert cooldown == 1.0  # QUOTA_BREAKER_COOLDOWN's default

    own_redis.kill()
    for _ in range(THRESHOLD - 1):
        assert client.get("/ping").status_code == 200
    assert not state.guard.degraded  # not yet: a blip is not an outage
    assert not [r for r in caplog.records if r.name == "flask_quota"]
    assert client.get("/ping").status_code == 200  # the failure that opens the breaker
    assert state.guard.degraded
    assert len(spy.calls) == THRESHOLD
    statuses: list[int] = []
    start = time.monotonic()

    def load() -> None:
        client = app.test_client()  # one client per thread
        for _ in range(50):
            if time.monotonic() - start > 1.5:
                return
            statuses.append(client.get("/ping").status_code)
            time.sleep(0.03)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(statuses) >= 100 and set(statuses) == {200}
    # ~1.5 s of 4 busy threads: the opening failure plus a probe at ~1 s (one more if slow).
    probes = spy.calls[THRESHOLD - 1 :]
    assert len(probes) <= 3, spy.calls
    gaps = [later - earlier for earlier, later in itertools.pairwise(probes)]
    assert all(gap >= cooldown * 0.9 for gap in gaps), gaps

    records = [r for r in caplog.records if r.name == "flask_quota"]
    assert [r.levelno for r in records] == [logging.ERROR], [r.getMessage() for r in records]
    assert "failed" in records[0].getMessage()

    own_redis.start()
    poll_until(client, has_rate_headers, allowed={200})
    records = [r for r in caplog.records if r.name == "flask_quota"]
    assert [r.levelno for r in records] == [logging.ERROR, logging.WARNING]
    assert "recovered" in records[1].getMessage()


def used(storage: Storage, key: bytes) -> int:
    """Units ``storage`` has counted on the token bucket ``key`` (LIMIT per minute)."""
    check = Check(key.decode(), Algorithm.TOKEN_BUCKET, parse_rate(f"{LIMIT}/minute"), 0)
    return LIMIT - storage.peek([check]).outcomes[0].remaining


def test_fail_local_never_counts_a_timed_out_request_twice(
    app: Flask, tmp_path: Path, server_kind: str
) -> None:
    """A call that timed out may still run on Redis once it wakes up: its request is
    checked against the local limiter but not charged there, so Redis and the local
    limiter together count every request exactly once."""
    server = RedisServer(
        tmp_path / "redis", None, "--enable-debug-command", "local", kind=server_kind
    )
    try:
        client = quota_app(app, server, "local")
        state = app.extensions["quota"]
        assert client.get("/ping").status_code == 200
        [key] = redis_keys(server)

        def sleep() -> None:
            with server.client() as admin:
                admin.execute_command("DEBUG", "SLEEP", "0.8")

        # DEBUG SLEEP, not CLIENT PAUSE: a paused server never ran the command of a
        # client that timed out and hung up (tried); a sleeping one runs it on waking,
        # as a Redis under load would.
        hang = threading.Thread(target=sleep)
        hang.start()
        wait_until_asleep(server)  # the next call times out, its command queued
        response, elapsed = timed_get(client)
        hang.join(timeout=10)
        assert response.status_code == 200
        assert TIMEOUT * 0.75 <= elapsed < MAX_LATENCY  # it did wait for the timeout

        redis_used = used(RedisStorage(server.client()), key)
        assert redis_used == 2, "the timed-out call should have run once Redis woke up"
        assert redis_used + used(state.guard.fallback, key) == 2  # two requests, two units
    finally:
        server.stop()


def test_fail_local_charges_failed_probes(app: Flask, own_redis: RedisServer) -> None:
    """With the breaker open, a worker whose every request is a probe (one request per
    cooldown) is still limited locally: a failed probe is charged there."""
    client = quota_app(app, own_redis, "local", QUOTA_BREAKER_COOLDOWN=0.05)
    own_redis.kill()
    for _ in range(THRESHOLD):  # open the breaker
        assert client.get("/ping").status_code == 200
    assert app.extensions["quota"].guard.degraded
    statuses = []
    for _ in range(LIMIT + 2):
        time.sleep(0.1)  # past the cooldown: this request is the probe
        statuses.append(client.get("/ping").status_code)
    assert statuses == [200] * LIMIT + [429] * 2
