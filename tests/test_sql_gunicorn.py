"""A plan edited with `flask quota` reaches every worker of a running 4-worker gunicorn
within 2 s, with counters shared in a real redis-server."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from flask_quota.sql.models import AuditEntry
from tests.demo import flask_quota, probe
from tests.servers import ROOT, Gunicorn, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

WORKERS = 4
OLD, NEW = 100_000, 77_777  # user-tier rates per minute: high enough never to deny


def test_cli_plan_change_reaches_all_four_workers_within_two_seconds(
    tmp_path: Path, database_url: str, own_redis: RedisServer
) -> None:
    """Every worker enforces the new rate for requests starting 2 s after the commit."""
    env = {
        "QUOTA_DATABASE_URL": database_url,
        "QUOTA_STORAGE_URL": own_redis.url,
        "QUOTA_STORAGE_TIMEOUT": "2",
        "QUOTA_PLANS": json.dumps({"free": {"global": "100000/second", "user": f"{OLD}/minute"}}),
        "PYTHONPATH": str(ROOT),
        "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
    }
    made = flask_quota(env, "clients", "create", "probe", "--plan", "free")
    key = made.split("API key: ")[1].split()[0]
    server = Gunicorn(env, workers=WORKERS)
    stop = threading.Event()
    seen: list[tuple[float, int, int]] = []
    lock = threading.Lock()

    def hammer() -> None:
        while not stop.is_set():
            sample = probe(server.port, key)
            if sample is not None:
                with lock:
                    seen.append(sample)

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(hammer) for _ in range(8)]
            try:
                deadline = time.monotonic() + 60  # workers import the app: slow on a busy box
                while len({pid for _, pid, q in list(seen) if q == OLD}) < WORKERS:
                    assert time.monotonic() < deadline, "not every worker answered"
                    time.sleep(0.05)
                flask_quota(env, "plans", "set", "free", "user", f"{NEW}/minute", "--actor", "ci")
                returned = time.time()
                engine = create_engine(database_url)
                with engine.connect() as conn:
                    committed = conn.scalar(select(AuditEntry.at).order_by(AuditEntry.id.desc()))
                engine.dispose()
                assert committed is not None
                # MariaDB keeps whole seconds: the commit was before at + 1 and before the
                # CLI returned, so 2 s after the earlier of those is never too early.
                cutoff = min(returned, committed.timestamp() + 1.0) + 2.0
                # Wait until every worker has answered a request that started after the cutoff.
                deadline = time.monotonic() + 60
                while len({pid for t, pid, _ in list(seen) if t > cutoff}) < WORKERS:
                    assert time.monotonic() < deadline, "not every worker answered after the cutoff"
                    time.sleep(0.05)
            finally:
                stop.set()
                for future in futures:
                    future.result()
    finally:
        server.stop()
    late = [(t - cutoff + 2.0, pid, q) for t, pid, q in seen if t > cutoff and q != NEW]
    assert late == [], f"old rate served more than 2 s after the change: {late[:5]}"
    after = {pid for t, pid, q in seen if t > cutoff and q == NEW}
    assert len(after) == WORKERS  # every worker enforces the new rate
