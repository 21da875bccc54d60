"""Fault injection on a single Redis under load from a real gunicorn (4 workers).

For each fault (killed, hung by ``DEBUG SLEEP``, ``CLIENT PAUSE``, out of memory
with ``noeviction``, and refusing connections from the start) and each fail
mode: ``open`` serves every request (no 5xx), ``closed`` answers 503 with
``Retry-After``; no request waits much longer than ``QUOTA_STORAGE_TIMEOUT``;
each worker's circuit breaker logs the failure once, not once per request; and
limits apply again within 5 s of the fault's end. One Redis and one gunicorn
per fail mode serve every fault in turn, which keeps the file near half a minute.

Each fault runs on both servers and in both fail modes, but not every pairing: the
default ``open`` on redis-server, ``closed`` on valkey-server. How a server fails is the
server's (Valkey answers a fault as Redis does, or not: each fault runs on each); what
a fail mode makes of a failure is ours and the same whichever server failed
(test_failover.py runs each mode on both servers).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import _need_redis, need_server
from tests.load import Flood, Reply, serve_many
from tests.servers import Gunicorn, RedisServer, free_port

# quiet: the load tests here bound request latencies (MAX_LATENCY) under each fault.
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.quiet]

TIMEOUT = 0.25  # QUOTA_STORAGE_TIMEOUT
MAX_LATENCY = 1.5  # a request's wall time, queueing behind 4 busy workers included
FAULT = 2.0  # seconds each fault lasts
RECOVERY = 5.0  # limits apply again within this long after the fault ends
WORKERS = 4
PLANS = {"p": {"global": "100000/second", "user": "100000/minute"}}
FAILED_LOG = "storage failed"
RECOVERED_LOG = "storage recovered"


@dataclass
class Rig:
    mode: str
    redis: RedisServer
    server: Gunicorn
    log: Path

    def log_lines(self, needle: str) -> int:
        return self.log.read_text(errors="replace").count(needle)


def serve(tmp_path: Path, mode: str, url: str) -> tuple[Gunicorn, Path]:
    server = serve_many(
        tmp_path,
        PLANS,
        workers=WORKERS,
        QUOTA_STORAGE_URL=url,
        QUOTA_FAIL_MODE=mode,
        QUOTA_STORAGE_TIMEOUT=str(TIMEOUT),
        QUOTA_BREAKER_COOLDOWN="0.5",
    )
    return server, tmp_path / "gunicorn.log"


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("open", "redis"), id="open-redis"),
        pytest.param(("closed", "valkey"), id="closed-valkey", marks=pytest.mark.valkey),
    ],
)
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    mode, kind = request.param
    need_server(kind)
    folder = tmp_path_factory.mktemp(f"faults-{mode}")
    redis = RedisServer(folder / "redis", None, "--enable-debug-command", "local", kind=kind)
    try:
        server, log = serve(folder / "gunicorn", mode, redis.url)
        try:
            yield Rig(mode, redis, server, log)
        finally:
            server.stop()
    finally:
        redis.stop()


def flood(port: int) -> Flood:
    return Flood(port, [("/ping", {"X-Client": f"c{i}"}) for i in range(8)], clients=8)


def healthy(reply: Reply) -> bool:
    return reply.status == 200 and reply.limited


def assert_degraded_well(mode: str, replies: list[Reply]) -> None:
    """Open: only 200s. Closed: 200s and 503s with a Retry-After; never another error."""
    statuses = Counter(r.status for r in replies)
    if mode == "open":
        assert set(statuses) == {200}, statuses
        return
    assert set(statuses) <= {200, 503}, statuses
    for reply in replies:
        if reply.status == 503:
            retry = reply.headers.get("Retry-After", "")
            assert retry.isdigit() and int(retry) >= 1, reply.headers


def recovered_within(load: Flood, since: float) -> float:
    """Wait until every reply of the last 0.5 s is decided by Redis; seconds after ``since``."""
    deadline = since + RECOVERY + 2
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = time.monotonic()
        recent = load.since(now - 0.5)
        if now - since > 0.5 and recent and all(healthy(r) for r in recent):
            bad = [r.sent for r in load.since(since) if not healthy(r)]
            return (max(bad) - since) if bad else 0.0
    pytest.fail(f"limits not back {RECOVERY + 2} s after the fault ended")


def latency_summary(replies: list[Reply]) -> str:
    times = sorted(r.elapsed for r in replies)
    p99 = times[int(len(times) * 0.99) - 1] if len(times) >= 100 else times[-1]
    ms = [statistics.median(times) * 1000, p99 * 1000, times[-1] * 1000]
    return "p50 {:.0f} ms, p99 {:.0f} ms, max {:.0f} ms".format(*ms)


# -- the faults: each starts at once and ends FAULT seconds later ----------------------


def kill(redis: RedisServer) -> None:
    redis.kill()
    time.sleep(FAULT)
    redis.start()  # empty: counters restart from zero (no persistence configured)


def debug_sleep(redis: RedisServer) -> None:
    def sleep() -> None:
        with redis.client() as client:
            client.execute_command("DEBUG", "SLEEP", str(FAULT))

    thread = threading.Thread(target=sleep)
    thread.start()
    thread.join(FAULT + 10)


def client_pause(redis: RedisServer) -> None:
    redis.pause(int(FAULT * 1000))
    time.sleep(FAULT)


def out_of_memory(redis: RedisServer) -> None:
    with redis.client() as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # every write is now refused with -OOM
        try:
            time.sleep(FAULT)
        finally:
            client.config_set("maxmemory", "0")


FAULTS: dict[str, Callable[[RedisServer], None]] = {
    "kill": kill,
    "debug-sleep": debug_sleep,
    "client-pause": client_pause,
    "out-of-memory": out_of_memory,
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_under_load(rig: Rig, fault: str) -> None:
    """The fail mode holds through the fault, latency stays bounded, the breaker logs
    once per worker, and limits are back within 5 s of the fault's end."""
    failed_before = rig.log_lines(FAILED_LOG)
    recovered_before = rig.log_lines(RECOVERED_LOG)
    with flood(rig.server.port) as load:
        time.sleep(0.5)
        assert all(healthy(r) for r in load.since(time.monotonic() - 0.3)), "not healthy"
        start = time.monotonic()
        FAULTS[fault](rig.redis)
        end = time.monotonic()
        recovery = recovered_within(load, end)
    during = [r for r in load.replies if r.sent >= start]
    degraded = [r for r in during if not healthy(r)]
    assert degraded, "the fault went unnoticed"
    assert_degraded_well(rig.mode, during)
    assert max(r.elapsed for r in during) <= MAX_LATENCY, latency_summary(during)

    failures = rig.log_lines(FAILED_LOG) - failed_before
    assert 1 <= failures <= WORKERS, f"{failures} breaker failure lines for {len(degraded)}"
    deadline = time.monotonic() + 3  # the recovery lines of idle workers may lag a little
    while rig.log_lines(RECOVERED_LOG) - recovered_before < failures:
        assert time.monotonic() < deadline, "a worker never logged its recovery"
        time.sleep(0.1)
    assert rig.log_lines(RECOVERED_LOG) - recovered_before == failures
    print(
        f"{fault} ({rig.mode}): {len(during)} requests, {len(degraded)} degraded, "
        f"limits back {recovery:.2f} s after the fault, latency {latency_summary(during)}"
    )


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_starts_while_redis_refuses_connections(mode: str, tmp_path: Path) -> None:
    """An app started with nothing on its Redis port serves by its fail mode, and limits
    apply within 5 s of Redis appearing there."""
    _need_redis()
    port = free_port()
    server, _ = serve(tmp_path / "gunicorn", mode, f"redis://127.0.0.1:{port}/0")
    redis: RedisServer | None = None
    try:
        with flood(server.port) as load:
            time.sleep(1.5)
            refused = list(load.replies)
            assert refused and not [r for r in refused if healthy(r)]
            redis = RedisServer(tmp_path / "redis", port)
            recovery = recovered_within(load, time.monotonic())
        assert_degraded_well(mode, load.replies)
        assert max(r.elapsed for r in load.replies) <= MAX_LATENCY, latency_summary(load.replies)
        print(f"refused ({mode}): limits back {recovery:.2f} s after Redis started")
    finally:
        server.stop()
        if redis is not None:
            redis.stop()
