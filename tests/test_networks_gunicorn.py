"""`flask quota networks deny` reaches every worker of a fleet within 2 s: 4 gunicorn
workers on 2 servers sharing one PostgreSQL and one redis-server (issue 42's must-show)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from flask_quota.sql.models import AuditEntry
from tests.demo import flask_quota
from tests.servers import ROOT, Gunicorn, RedisServer, wait_for_workers
from tests.sqldb import postgres_database

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SERVERS, WORKERS = 2, 2  # per server: 4 workers in all
DENIED, OTHER = "203.0.113.9", "203.0.114.1"  # inside 203.0.113.0/24, and just outside


@pytest.fixture
def postgres() -> Iterator[str]:
    """A fresh PostgreSQL database (skipped, loudly, without QUOTA_TEST_DATABASE_URL)."""
    yield from postgres_database()


@dataclass(frozen=True)
class Sample:
    started: float  # wall clock when the request was sent
    worker: int  # the pid that answered (X-Worker)
    address: str  # the client address X-Forwarded-For named
    status: int
    tier: str | None  # the problem body's "tier", on a refusal


def call(port: int, address: str) -> Sample:
    """One GET /v1/items from ``address`` (through the app's ProxyFix) on a fresh
    connection."""
    started = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/v1/items", headers={"X-Forwarded-For": address})
        response = conn.getresponse()
        body = response.read()
        tier = None
        if response.getheader("Content-Type") == "application/problem+json":
            tier = json.loads(body).get("tier")
        return Sample(started, int(response.getheader("X-Worker") or 0), address,
                      response.status, tier)  # fmt: skip
    finally:
        conn.close()


def test_a_denied_network_reaches_four_workers_on_two_servers_within_two_seconds(
    tmp_path: Path, postgres: str, own_redis: RedisServer
) -> None:
    """Before the change both addresses are served by every worker; the CLI, in its own
    process against the shared database, denies 203.0.113.0/24; every request sent 2 s
    after the commit from 203.0.113.9 gets the 403 problem, from 203.0.114.1 a 200, on
    each of the 4 workers."""
    env = {
        "QUOTA_DATABASE_URL": postgres,
        "QUOTA_STORAGE_URL": own_redis.url,
        "QUOTA_STORAGE_TIMEOUT": "2",
        "QUOTA_PLANS": json.dumps({"free": {"global": "100000/second", "user": "100000/minute"}}),
        "PYTHONPATH": str(ROOT),
        "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
    }
    servers: list[Gunicorn] = []
    seen: list[Sample] = []
    lock = threading.Lock()
    stop = threading.Event()

    def hammer(n: int) -> None:
        while not stop.is_set():
            server = servers[n % SERVERS]
            for address in (DENIED, OTHER):
                sample = call(server.port, address)
                with lock:
                    seen.append(sample)

    def workers_since(moment: float, address: str) -> set[int]:
        with lock:
            return {s.worker for s in seen if s.started > moment and s.address == address}

    try:
        for _ in range(SERVERS):
            servers.append(Gunicorn(env, workers=WORKERS, app="tests.apps.networks:app"))
        for server in servers:
            wait_for_workers(server.port, WORKERS)
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(hammer, n) for n in range(8)]
            try:
                deadline = time.monotonic() + 60
                while len(workers_since(0.0, DENIED)) < SERVERS * WORKERS:
                    assert time.monotonic() < deadline, "not every worker answered"
                    time.sleep(0.05)
                out = flask_quota(
                    env, "networks", "deny", "203.0.113.0/24", "--reason", "fleet", "--actor", "ci"
                )
                returned = time.time()
                assert out == "denied 203.0.113.0/24 until removed\n"
                engine = create_engine(postgres)
                with engine.connect() as conn:
                    committed = conn.scalar(select(AuditEntry.at).order_by(AuditEntry.id.desc()))
                engine.dispose()
                assert committed is not None
                commit = min(returned, committed.timestamp())
                cutoff = commit + 2.0
                deadline = time.monotonic() + 60
                while min(len(workers_since(cutoff, a)) for a in (DENIED, OTHER)) < 4:
                    assert time.monotonic() < deadline, "not every worker answered after 2 s"
                    time.sleep(0.05)
            finally:
                stop.set()
                for future in futures:
                    future.result()
    finally:
        for server in servers:
            server.stop()
    before = [s for s in seen if s.started < commit - 0.5]
    assert {s.status for s in before} == {200}  # the network was served before
    late = [s for s in seen if s.started > cutoff and s.address == DENIED and s.status != 403]
    assert late == [], f"served more than 2 s after the change: {late[:5]}"
    refused = [s for s in seen if s.started > cutoff and s.address == DENIED]
    assert {s.tier for s in refused} == {"network"}
    others = [s for s in seen if s.started > cutoff and s.address == OTHER]
    assert {s.status for s in others} == {200}
    assert len({s.worker for s in refused}) == len({s.worker for s in others}) == 4
    first = {}
    for s in sorted(seen, key=lambda s: s.started):
        if s.address == DENIED and s.status == 403 and s.worker not in first:
            first[s.worker] = s.started - commit
    print(f"first 403 per worker, seconds after the commit: {sorted(first.values())}")
