"""A reset or an unblock made with `flask quota` reaches every worker's deny cache:
4 gunicorn workers on a real redis-server, each answering 429s locally, serve the
caller again within 2 s of the command."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.demo import flask_quota
from tests.servers import RedisServer, get, gunicorn

pytestmark = [pytest.mark.redis, pytest.mark.slow]

WORKERS = 4
LIMIT = 20  # per day: nothing refills while the test runs


def evalsha_calls(server: RedisServer) -> int:
    client = server.client()
    try:
        stats = client.info("commandstats")  # the decide call: a function or a script
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))
    finally:
        client.close()


def burst(port: int, count: int) -> Counter[int]:
    """``count`` concurrent GETs on fresh connections (spread over the workers)."""
    with ThreadPoolExecutor(8) as pool:
        return Counter(pool.map(lambda _: get(port), range(count)))


def warm_deny_caches(port: int, redis: RedisServer) -> None:
    """Exhaust the budget, then send bursts until a whole burst of 40 never reaches
    Redis: every worker that answered it did so from its deny cache."""
    assert burst(port, LIMIT + 8)[429] >= 8
    deadline = time.monotonic() + 60
    while True:
        before = evalsha_calls(redis)
        statuses = burst(port, 40)
        assert statuses == {429: 40}, statuses
        if evalsha_calls(redis) == before:
            return
        assert time.monotonic() < deadline, "the deny caches never warmed up"


def env_for(tmp_path: Path, redis: RedisServer, **extra: str) -> dict[str, str]:
    return {
        "QUOTA_STORAGE_URL": redis.url,
        "QUOTA_STORAGE_TIMEOUT": "2",
        "QUOTA_DATABASE_URL": f"sqlite:///{tmp_path}/quota.sqlite3",
        "QUOTA_PLANS": json.dumps({"exact": {"user": f"{LIMIT}/day"}}),
        "QUOTA_DEFAULT_PLAN": "exact",
        "QUOTA_ANONYMOUS_PLAN": "exact",
        "QUOTA_DASHBOARD_URL": "",
        "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
        **extra,
    }


def test_cli_reset_reaches_every_workers_deny_cache(tmp_path: Path, own_redis: RedisServer) -> None:
    """Must-show: after `flask quota reset` under 4 workers with warm deny caches, the
    next LIMIT requests (starting 2 s after the command) all pass; the next one is 429."""
    env = env_for(tmp_path, own_redis)
    with gunicorn(env, workers=WORKERS) as server:
        warm_deny_caches(server.port, own_redis)
        flask_quota(env, "reset", "--ip", "127.0.0.1", "--actor", "ci")
        time.sleep(2.0)
        after = burst(server.port, LIMIT)
        over = get(server.port)
    assert after == {200: LIMIT}, after
    assert over == 429


def test_cli_unblock_reaches_every_workers_deny_cache(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """A caller blocked by QUOTA_BLOCK_AFTER is refused "blocked" by every worker from
    its deny cache; 2 s after `flask quota unblock` + reset, every worker serves it."""
    env = env_for(tmp_path, own_redis, QUOTA_BLOCK_AFTER="5/hour", QUOTA_BLOCK_FOR="3600")
    with gunicorn(env, workers=WORKERS) as server:
        warm_deny_caches(server.port, own_redis)
        client = own_redis.client()
        try:
            assert client.pttl("quota:{ip=127.0.0.1}:b") > 3_500_000  # blocked for an hour
        finally:
            client.close()
        flask_quota(env, "unblock", "--ip", "127.0.0.1", "--actor", "ci")
        flask_quota(env, "reset", "--ip", "127.0.0.1", "--actor", "ci")
        time.sleep(2.0)
        after = burst(server.port, LIMIT)
    assert after == {200: LIMIT}, after
