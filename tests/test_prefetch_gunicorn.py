"""QUOTA_PREFETCH under 4 real gunicorn workers on one redis-server: one user's quick
burst on ``user: 100/minute`` admits close to the limit and never past what the
exact bucket allows, with fewer decide calls than requests."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from tests.load import hammer, serve_many
from tests.redis_probes import decide_calls
from tests.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PLANS = {"free": {"user": "100/minute", "global": "100000/minute"}}


@pytest.mark.parametrize(("prefetch", "threads"), [("0.05", 1), ("0.05", 4), (None, 1)])
def test_a_quick_burst_admits_nearly_the_limit_and_never_more(
    tmp_path: Path, own_redis: RedisServer, prefetch: str | None, threads: int
) -> None:
    env = {"QUOTA_STORAGE_URL": own_redis.url}
    if prefetch is not None:
        env["QUOTA_PREFETCH"] = prefetch
    server = serve_many(tmp_path, PLANS, workers=4, threads=threads, **env)
    try:
        client = own_redis.client()
        client.config_resetstat()
        started = time.monotonic()
        replies = hammer(server.port, [("/ping", {"X-Client": "burst"}, "")] * 300, clients=8)
        elapsed = time.monotonic() - started
        calls = decide_calls(client)
    finally:
        server.stop()
    statuses = Counter(r.status for r in replies)
    print(f"prefetch={prefetch}: {dict(statuses)} in {elapsed:.2f} s, {calls} decide calls")
    assert set(statuses) <= {200, 429}, statuses
    refilled = int(elapsed * 100 / 60)  # what the exact bucket refills meanwhile
    assert 80 <= statuses[200] <= 100 + refilled, (statuses, elapsed)
    if prefetch is None:
        assert statuses[200] >= 100  # exact: the whole bucket
        assert calls >= 300 - statuses[429]  # every admitted request asked Redis
    else:
        assert calls < 300, calls  # shares and the deny cache spared Redis
