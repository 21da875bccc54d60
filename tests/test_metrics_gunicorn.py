"""Metrics under 4 real gunicorn workers on a real redis-server: whichever worker
answers a scrape reports the whole app (prometheus_client's multiprocess mode,
PROMETHEUS_MULTIPROC_DIR and the child_exit hook from tests/apps/gunicorn_metrics.py).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.load import get
from tests.prom import Scrape
from tests.servers import Gunicorn, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

WORKERS = 4
# Sliding log: exactly 5 in any 60 s, however long the test takes to send them.
PLANS = {"t": {"global": "1000/minute", "user": "1000/minute", "resources": {"work": "5/minute"}}}


@contextmanager
def metered(tmp_path: Path, redis: RedisServer, **env: str) -> Iterator[Gunicorn]:
    """``tests.apps.metered`` under 4 workers, sharing metrics through an empty directory."""
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    server = Gunicorn(
        {
            "QUOTA_STORAGE_URL": redis.url,
            "QUOTA_ALGORITHM": "sliding_window_log",
            "QUOTA_PLANS": json.dumps(PLANS),
            "QUOTA_DEFAULT_PLAN": "t",
            "QUOTA_ANONYMOUS_PLAN": "t",
            "QUOTA_DATABASE_URL": f"sqlite:///{tmp_path}/quota.sqlite3",
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
            "GUNICORN_CMD_ARGS": "--config python:tests.apps.gunicorn_metrics",
            "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
            **env,
        },
        workers=WORKERS,
        app="tests.apps.metered:app",
    )
    try:
        wait_for_workers(server.port)
        yield server
    finally:
        server.stop()


def wait_for_workers(port: int, timeout: float = 60.0) -> set[str]:
    """Every worker has answered: otherwise the first one up may serve everything alone."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < WORKERS:
        assert time.monotonic() < deadline, f"only workers {seen} answered in {timeout} s"
        with ThreadPoolExecutor(2 * WORKERS) as pool:
            replies = pool.map(lambda _: get(port, "/healthz"), range(2 * WORKERS))
            seen.update(r.headers["X-Worker"] for r in replies if r.status == 200)
    return seen


def scrape(port: int) -> tuple[str, Scrape]:
    """(the worker that answered, its exposition)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read().decode()
        assert response.status == 200, body
        return str(response.getheader("X-Worker")), Scrape.parse(body)
    finally:
        conn.close()


def scrapes(port: int, count: int = 8, limit: int = 40) -> Iterator[Scrape]:
    """At least ``count`` scrapes, until two different workers have answered (at most
    ``limit``): each one must hold the whole app's counts."""
    workers: set[str] = set()
    for done in range(limit):
        worker, seen = scrape(port)
        workers.add(worker)
        yield seen
        if done + 1 >= count and len(workers) >= 2:
            return
    pytest.fail(f"{limit} scrapes were all answered by worker {workers}")


def send(port: int, total: int, headers: dict[str, str]) -> tuple[Counter[int], set[str]]:
    """``total`` GET /work over 8 connections at once: (statuses, workers that answered)."""
    statuses, workers, _ = send_counting(port, total, headers)
    return statuses, workers


def send_counting(
    port: int, total: int, headers: dict[str, str]
) -> tuple[Counter[int], set[str], int]:
    """``send``, plus how many answers failed open (they carry no rate-limit headers)."""
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: get(port, "/work", headers), range(total)))
    unlimited = sum(1 for r in replies if not r.limited)
    return (
        Counter(r.status for r in replies),
        {r.headers.get("X-Worker", "") for r in replies},
        unlimited,
    )


def test_every_scrape_reports_the_whole_apps_decisions(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """60 requests to a 5/minute resource under 4 workers: every one of 8 scrapes, whoever
    answers it, reports exactly 5 allowed and 55 denied on that endpoint tier (the deny
    cache's answers among them), one storage timing per request, and no label value that
    is the caller's identity or address."""
    identity = f"client-{uuid.uuid4().hex}"
    with metered(tmp_path, own_redis) as server:
        statuses, workers = send(server.port, 60, {"X-Client": identity})
        assert statuses == {200: 5, 429: 55}
        assert len(workers) >= 2, "the requests were not spread over several workers"
        for seen in scrapes(server.port):
            endpoint = {"tier": "endpoint", "resource": "work", "plan": "t"}
            assert seen.decisions(outcome="allowed", **endpoint) == 5
            assert seen.decisions(outcome="denied", **endpoint) == 55
            assert seen.decisions(tier="user", outcome="allowed") == 5
            assert "flask_quota_storage_seconds_bucket" in seen.names()
            assert seen.value("flask_quota_storage_seconds_count") == 60
            assert 0 < seen.value("flask_quota_deny_cache_hits_total") <= 55
            assert seen.value("flask_quota_breaker_open") == 0
            labels = seen.label_values()
            assert not {identity, "127.0.0.1", f"id={identity}", "ip=127.0.0.1"} & labels
            assert not any(identity in value for value in labels)


def test_shadow_mode_denies_nothing_and_every_scrape_counts_what_it_would_deny(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """QUOTA_SHADOW=true under 4 workers: 40 requests to a 5/minute resource all answer
    200, and every scrape shows the 35 it would have denied as `shadow_denied`."""
    with metered(tmp_path, own_redis, QUOTA_SHADOW="true") as server:
        statuses, _ = send(server.port, 40, {"X-Client": "shadowed"})
        assert statuses == {200: 40}
        for seen in scrapes(server.port):
            endpoint = {"tier": "endpoint", "resource": "work", "plan": "t"}
            assert seen.decisions(outcome="shadow_denied", **endpoint) == 35
            assert seen.decisions(outcome="denied") == 0


def test_breaker_gauge_and_fail_open_under_workers_and_a_dead_workers_gauge_is_dropped(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Redis killed, fail mode open: every request is counted `fail_open` and every scrape
    shows the breaker open. Redis back and one failing worker killed: its counts stay, its
    gauge goes with it (the child_exit hook), and the gauge returns to 0 once the live
    workers' breakers close."""
    env = {
        "QUOTA_FAIL_MODE": "open",
        "QUOTA_STORAGE_TIMEOUT": "0.5",
        "QUOTA_BREAKER_THRESHOLD": "1",
        "QUOTA_BREAKER_COOLDOWN": "0.2",
    }
    with metered(tmp_path, own_redis, **env) as server:
        statuses, _ = send(server.port, 4, {"X-Client": "before"})
        assert statuses == {200: 4}
        own_redis.kill()
        statuses, failing = send(server.port, 40, {"X-Client": "during"})
        assert statuses == {200: 40}
        endpoint = {"tier": "endpoint", "resource": "work", "plan": "t"}
        for seen in scrapes(server.port):
            assert seen.value("flask_quota_breaker_open") == 1
            assert seen.decisions(outcome="fail_open", **endpoint) == 40
            assert seen.decisions(outcome="allowed", **endpoint) == 4

        own_redis.start()
        victim = int(sorted(failing)[0])
        os.kill(victim, signal.SIGKILL)  # its breaker was open: its gauge file said 1
        deadline = time.monotonic() + 60
        later_fail_open = 0  # requests sent while some breaker was still open
        while True:
            _, seen = scrape(server.port)
            if seen.value("flask_quota_breaker_open") == 0:
                break
            assert time.monotonic() < deadline, "the breaker gauge stayed at 1 after recovery"
            # Probes close the live breakers; until then these fail open too.
            later_fail_open += send_counting(server.port, 8, {"X-Client": "after"})[2]
            time.sleep(0.25)
        # The dead worker's counts included.
        assert seen.decisions(outcome="fail_open", **endpoint) == 40 + later_fail_open
