"""The demo app under real ``gunicorn wsgi:app`` workers, on a real redis-server.

Requests come from many client threads over loopback; all of them are
anonymous callers from 127.0.0.1, so they share one budget.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import RedisServer, get, gunicorn

pytestmark = [pytest.mark.redis, pytest.mark.slow]

MEMORY_WARNING = "flask-quota: QUOTA_STORAGE_URL is memory://"


def quota_env(
    tmp_path: Path, storage_url: str, rate: str, algorithm: str = "token_bucket"
) -> dict[str, str]:
    """Environment for ``wsgi.py``: one plan limiting the user tier only to ``rate``."""
    return {
        "QUOTA_STORAGE_URL": storage_url,
        "QUOTA_ALGORITHM": algorithm,
        "QUOTA_PLANS": json.dumps({"exact": {"user": rate}}),
        "QUOTA_DEFAULT_PLAN": "exact",
        "QUOTA_ANONYMOUS_PLAN": "exact",
        "QUOTA_FAIL_MODE": "open",
        "QUOTA_STORAGE_TIMEOUT": "0.5",
        "QUOTA_DENY_CACHE": "false",  # fail-open is under test, not the deny cache
        "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
    }


def evalsha_connections(server: RedisServer) -> int:
    """How many connections to ``server`` ran the decision script last: one per worker."""
    client = server.client()
    try:
        return sum(1 for c in client.client_list() if c["cmd"] in ("fcall", "evalsha", "eval"))
    finally:
        client.close()


@pytest.mark.parametrize(
    "algorithm", ["token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"]
)
def test_four_workers_on_redis_allow_exactly_the_limit(
    tmp_path: Path, own_redis: RedisServer, algorithm: str
) -> None:
    """32 concurrent clients over 4 workers: exactly N requests pass, the rest get 429."""
    limit, total = 50, 200
    # A one-day window: nothing refills during the test. Windowed algorithms align
    # windows on UTC midnight, so never start within a minute of it.
    to_midnight = 86400 - time.time() % 86400
    if to_midnight < 60:
        time.sleep(to_midnight + 1)
    env = quota_env(tmp_path, own_redis.url, f"{limit}/day", algorithm)

    with gunicorn(env, workers=4) as server, ThreadPoolExecutor(32) as pool:
        statuses = Counter(pool.map(lambda _: get(server.port), range(total)))
        workers_seen = evalsha_connections(own_redis)

    assert statuses == {200: limit, 429: total - limit}
    assert workers_seen >= 2, "the requests were not spread over several workers"
    log = Path(env["GUNICORN_LOG"]).read_text()
    assert "Booting worker" in log and MEMORY_WARNING not in log


@dataclass(frozen=True)
class Sample:
    start: float
    end: float
    status: int  # 0: the request itself failed (refused, reset, timed out)


class Load:
    """Client threads sending GETs until stopped (and at most ``per_thread`` each)."""

    def __init__(self, port: int, threads: int = 8, per_thread: int = 2000) -> None:
        self.port = port
        self.per_thread = per_thread
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self) -> None:
        for _ in range(self.per_thread):
            if self._stop.is_set():
                return
            start = time.monotonic()
            try:
                status = get(self.port, timeout=10)
            except OSError:
                status = 0
            self.samples.append(Sample(start, time.monotonic(), status))
            time.sleep(0.02)  # leave the two cores some room

    def between(self, start: float, end: float) -> list[Sample]:
        """Requests sent at or after ``start`` and answered by ``end``."""
        return [s for s in list(self.samples) if s.start >= start and s.end <= end]


def test_fail_open_survives_redis_killed_mid_load(tmp_path: Path, own_redis: RedisServer) -> None:
    """Redis killed under load with 4 workers: no 5xx at all; 429s return soon after restart."""
    env = quota_env(tmp_path, own_redis.url, "5/minute")
    env["QUOTA_STORAGE_TIMEOUT"] = "0.2"

    with gunicorn(env, workers=4) as server, Load(server.port) as load:
        time.sleep(1.0)
        own_redis.kill()
        killed = time.monotonic()
        time.sleep(2.0)
        restarting = time.monotonic()
        own_redis.start()  # empty: the budget starts afresh
        up = time.monotonic()
        deadline = up + 5.0
        while time.monotonic() < deadline:
            if any(s.status == 429 for s in load.between(up, deadline)):
                break
            time.sleep(0.05)
        time.sleep(0.2)

    samples = list(load.samples)
    statuses = Counter(s.status for s in samples)
    assert not [code for code in statuses if code == 0 or code >= 500], statuses
    assert any(s.status == 429 for s in load.between(0, killed)), "no limit before the kill"
    outage = load.between(killed, restarting)
    assert len(outage) >= 10, len(outage)
    assert {s.status for s in outage} == {200}, Counter(s.status for s in outage)
    assert any(s.status == 429 for s in load.between(up, up + 5.0)), "limits never came back"


def test_memory_storage_under_gunicorn_warns_in_every_worker(tmp_path: Path) -> None:
    """memory:// under 2 gunicorn workers logs the per-worker-counters warning in each worker."""
    log = tmp_path / "gunicorn.log"
    with gunicorn({"GUNICORN_LOG": str(log)}, workers=2):
        deadline = time.monotonic() + 30
        while log.read_text().count(MEMORY_WARNING) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log.read_text()

    assert text.count(MEMORY_WARNING) == 2, text
    assert "QUOTA_STORAGE_URL=redis://" in text  # the warning says how to fix it
