"""QUOTA_PREFETCH under threads, on a real redis-server: one caller's burst on
``user: 300/minute`` from many threads of one process, and from gunicorn's threaded
workers (``-k gthread``), admits what the exact bucket admits, less a bounded few.

Threads of one worker share its shares: before the fix, two threads taking a share of
one bucket at once kept only the second, and the first one's units, charged in storage,
were lost (510-547 of 800 admitted on a 1000/month quota, ``Retry-After`` 28 days).
The property is ``tests/test_prefetch_model.py``'s threaded model; these are the
reports' own setups."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.apps.many import create_app
from tests.load import hammer, serve_many
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

PLANS = {"free": {"user": "300/minute", "global": "100000/minute"}}
REFILL = 300 / 60  # units per second the user bucket refills while the burst runs


def admitted_bounds(sent: int, elapsed: float) -> tuple[int, int]:
    """What the issue asks of a burst of ``sent`` on 300/minute: every one of up to 250,
    at least 285 of more; never more than the bucket and what it refilled meanwhile."""
    most = min(sent, 300 + int(elapsed * REFILL))
    return (sent if sent <= 250 else 285), most


@pytest.mark.parametrize("sent", [250, 400])
def test_sixteen_threads_of_one_process(own_redis: RedisServer, sent: int) -> None:
    app = create_app(
        QUOTA_STORAGE_URL=own_redis.url,
        QUOTA_PLANS=PLANS,
        QUOTA_DATABASE_URL="sqlite://",
        QUOTA_PREFETCH=0.05,
    )

    def one(_: int) -> int:
        return app.test_client().get("/ping", headers={"X-Client": "burst"}).status_code

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        statuses = Counter(pool.map(one, range(sent)))
    elapsed = time.monotonic() - started
    least, most = admitted_bounds(sent, elapsed)
    print(f"{sent} sent: {dict(statuses)} in {elapsed:.2f} s")
    assert set(statuses) <= {200, 429}, statuses
    assert least <= statuses[200] <= most, (statuses, elapsed)


@pytest.mark.slow
@pytest.mark.parametrize("sent", [250, 400])
def test_gunicorn_threaded_workers(tmp_path: Path, own_redis: RedisServer, sent: int) -> None:
    """``gunicorn -w 2 -k gthread --threads 8``, the setup of the report."""
    server = serve_many(
        tmp_path, PLANS, workers=2, threads=8, QUOTA_STORAGE_URL=own_redis.url,
        QUOTA_PREFETCH="0.05",
    )  # fmt: skip
    try:
        started = time.monotonic()
        replies = hammer(server.port, [("/ping", {"X-Client": "burst"}, "")] * sent, clients=16)
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    statuses = Counter(r.status for r in replies)
    least, most = admitted_bounds(sent, elapsed)
    print(f"{sent} sent: {dict(statuses)} in {elapsed:.2f} s")
    assert set(statuses) <= {200, 429}, statuses
    assert least <= statuses[200] <= most, (statuses, elapsed)
