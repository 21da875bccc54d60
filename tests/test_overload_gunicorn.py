"""Overload protection's fleet capacity under 4 real gunicorn workers (threaded) on a
real redis-server: ``QUOTA_CAPACITY=N`` never lets more than N requests run at once,
counted by the view itself, and a SIGKILLed worker's slots come back within
``QUOTA_LEASE_SECONDS``."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.load import get
from tests.servers import Gunicorn, RedisServer

# quiet: leases expire on the Redis server's clock, and the gunicorn workers need the CPU.
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.quiet]

CAPACITY = 3
LEASE_SECONDS = 3


@pytest.fixture
def server(tmp_path: Path, own_redis: RedisServer) -> Iterator[tuple[Gunicorn, Path]]:
    gates = tmp_path / "gates"
    gates.mkdir()
    env = {
        "QUOTA_STORAGE_URL": own_redis.url,
        "QUOTA_PLANS": json.dumps({"free": {}}),
        "QUOTA_CAPACITY": str(CAPACITY),
        "QUOTA_RESERVE": "{}",  # every class up to the whole capacity
        "QUOTA_LEASE_SECONDS": str(LEASE_SECONDS),
        "QUOTA_STORAGE_TIMEOUT": "2",  # a slow call failing open would run unleased
        "QUOTA_FAIL_MODE": "closed",
        "COUNT_URL": f"redis://127.0.0.1:{own_redis.port}/1",
        "GATES": str(gates),
        "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
    }
    gunicorn = Gunicorn(env, workers=4, threads=4, app="tests.apps.overload:app")
    try:
        deadline = time.monotonic() + 30
        while get(gunicorn.port, "/healthz").status != 200:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        yield gunicorn, gates
    finally:
        gunicorn.stop()


def test_the_capacity_is_never_exceeded_across_workers(
    server: tuple[Gunicorn, Path], own_redis: RedisServer
) -> None:
    """48 slow requests, 16 at a time, over 4 workers of 4 threads: never more than 3 run
    at once (the views count themselves), the rest are shed with 503, and every slot
    comes back."""
    gunicorn, _ = server
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda _: get(gunicorn.port, "/slow"), range(48)))
    statuses = Counter(r.status for r in replies)
    with own_redis.client() as client:
        most = int((client.execute_command("SELECT", 1) and client.get("most")) or 0)
        running = int(client.get("running") or 0)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[200] >= CAPACITY and statuses[503] > 0, statuses
    assert 1 <= most <= CAPACITY, most
    assert running == 0
    assert get(gunicorn.port, "/slow").status == 200  # every slot is free again


def test_a_killed_workers_slots_come_back_within_the_lease(
    server: tuple[Gunicorn, Path],
) -> None:
    """Three requests hold the three slots; their workers are SIGKILLed. The slots stay
    taken (503) until their leases expire, then the fleet admits again, within
    QUOTA_LEASE_SECONDS of the kill (plus the time to notice)."""
    gunicorn, gates = server
    with ThreadPoolExecutor(CAPACITY) as pool:
        for _ in range(CAPACITY):
            pool.submit(get, gunicorn.port, "/hold?gate=kill", timeout=60)
        deadline = time.monotonic() + 20
        while len(list(gates.glob("kill.*.running"))) < CAPACITY:
            assert time.monotonic() < deadline, "the holding views did not start"
            time.sleep(0.02)
        pids = {int(p.name.split(".")[1]) for p in gates.glob("kill.*.running")}
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert get(gunicorn.port, "/slow").status == 503  # the dead workers' slots
        while get(gunicorn.port, "/slow").status != 200:
            assert time.monotonic() - killed < LEASE_SECONDS + 3, "the slots never came back"
            time.sleep(0.1)
        back = time.monotonic() - killed
        (gates / "kill").touch()
    assert back <= LEASE_SECONDS + 3
