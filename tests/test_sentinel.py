"""Redis Sentinel: URLs, decisions on the master the sentinels name, failover under load.

The group (one master, one replica, three sentinels, quorum 2) is started once
for this module; the failover test kills its master, so it runs last.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.storage import storage_from_url
from flask_quota.storage.sentinel import SentinelStorage, parse_sentinel_url
from tests.capacity import capacity_scenario
from tests.conftest import need_server
from tests.load import Flood, hammer, serve_many
from tests.sentinel import SentinelGroup
from tests.tenants import alternate, get, tenant_app

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.also_valkey]

RECOVERY = 10.0  # seconds from the master's death until limits apply again


@pytest.fixture(scope="module")
def sentinels(
    tmp_path_factory: pytest.TempPathFactory, server_kind: str
) -> Iterator[SentinelGroup]:
    """Redis Sentinel, or Valkey's (``valkey-server --sentinel``), by ``server_kind``."""
    need_server(server_kind)
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel"), kind=server_kind)
    yield group
    group.stop()


def test_sentinel_urls() -> None:
    """Several sentinels, a service name, an optional db and passwords are understood."""
    sentinels, service, options, sentinel_options = parse_sentinel_url(
        "redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380,[::1]/cache/2"
        "?sentinel_password=watch"
    )
    assert sentinels == [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26379)]
    assert service == "cache"
    assert options == {"username": None, "password": "s3cret", "db": 2}
    assert sentinel_options == {"password": "watch"}
    storage = storage_from_url("redis+sentinel://127.0.0.1:1/mymaster", timeout=0.1)
    assert isinstance(storage, SentinelStorage) and storage.name == "redis+sentinel"


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://127.0.0.1:26379",  # no service name
        "redis+sentinel:///mymaster",  # no sentinel
        "redis+sentinel://127.0.0.1:x/mymaster",  # bad port
        "redis+sentinel://127.0.0.1:26379/mymaster/zero",  # bad db
    ],
)
def test_bad_sentinel_urls_name_the_fix(url: str) -> None:
    """A malformed Sentinel URL fails at configuration time and shows the accepted form."""
    with pytest.raises(ValueError, match=r"redis\+sentinel://"):
        parse_sentinel_url(url)


def test_limits_live_on_the_master_the_sentinels_name(sentinels: SentinelGroup, app: Flask) -> None:
    """Decisions are exact and their counters reach the replica."""
    app.config.update(
        QUOTA_STORAGE_URL=sentinels.url,
        QUOTA_STORAGE_TIMEOUT=1,
        QUOTA_DATABASE_URL=f"sqlite:///{app.instance_path}/quota.sqlite3",
        QUOTA_PLANS={"free": {"user": "3/minute"}},
    )
    Quota(app)
    app.add_url_rule("/ping", "ping", lambda: "pong")
    client = app.test_client()
    assert [client.get("/ping").status_code for _ in range(4)] == [200, 200, 200, 429]
    replica = sentinels.replica
    assert replica is not None
    deadline = time.monotonic() + 10
    with replica.client() as r:
        while not r.keys("quota:*"):
            assert time.monotonic() < deadline, "the counter never reached the replica"
            time.sleep(0.05)


def test_the_fleet_capacity_is_exact_on_sentinel(sentinels: SentinelGroup, app: Flask) -> None:
    """The capacity scenario (``tests/capacity.py``) on the master the sentinels name."""
    capacity_scenario(app, QUOTA_STORAGE_URL=sentinels.url, QUOTA_STORAGE_TIMEOUT=1)


def test_a_tenants_callers_share_its_bucket_on_sentinel(
    sentinels: SentinelGroup, app: Flask
) -> None:
    """The tenant tier through Sentinel: alice and bob of acme alternate, 200 x5 then
    429 429 naming the tenant tier; carol of globex passes."""
    _, client = tenant_app(
        app,
        None,
        QUOTA_STORAGE_URL=sentinels.url,
        QUOTA_STORAGE_TIMEOUT=1,
        QUOTA_FAIL_MODE="closed",  # a slow first call must not fail open and admit
        QUOTA_DENY_CACHE=False,
    )
    assert alternate(client) == [200] * 5 + [429, 429]
    assert get(client, "alice", "acme").get_json()["tier"] == "tenant"
    assert [get(client, "carol", "globex").status_code for _ in range(3)] == [200] * 3


def test_failover_under_load(sentinels: SentinelGroup, tmp_path: Path) -> None:
    """Kill the master under load from 4 gunicorn workers: no 5xx while sentinels promote
    the replica (fail open), limits apply again within 10 s, exactly, on the new master."""
    server = serve_many(
        tmp_path,
        {"p": {"global": "100000/second", "user": "100000/minute", "resources": {"work": "5/day"}}},
        QUOTA_STORAGE_URL=sentinels.url,
        QUOTA_STORAGE_TIMEOUT="0.2",
    )
    old = sentinels.current_master()
    try:
        flood = Flood(
            server.port, [("/ping", {"X-Client": f"f{i}"}) for i in range(16)], clients=16
        )
        with flood:
            time.sleep(1.0)
            assert all(r.limited for r in flood.since(time.monotonic() - 0.5))
            sentinels.server(old).kill()
            killed = time.monotonic()
            while time.monotonic() - killed < RECOVERY + 5:
                time.sleep(0.2)
                recent = flood.since(time.monotonic() - 1.0)
                if (
                    time.monotonic() - killed > 2
                    and recent
                    and all(r.limited for r in recent)
                    and sentinels.current_master() != old
                ):
                    break
        replies = flood.replies
        failed = Counter(r.status for r in replies if r.status >= 500 or r.status == 0)
        assert not failed, failed
        after = [r for r in replies if r.sent >= killed]
        open_count = sum(not r.limited for r in after)
        assert open_count, "the switch went unnoticed: was the master really killed?"
        last_open = max(r.sent for r in after if not r.limited)
        recovery = last_open - killed
        assert recovery <= RECOVERY, f"limits back only after {recovery:.1f} s"

        # On the new master: exactly 5 of 15 concurrent requests of a fresh caller pass.
        batch = [("/work", {"X-Client": "fresh"}, "fresh")] * 15
        statuses = Counter(r.status for r in hammer(server.port, batch, clients=15))
        assert statuses == Counter({200: 5, 429: 10}), statuses
        print(
            f"sentinel failover: {len(after)} requests after the kill, {open_count} served "
            f"fail-open, limits enforced on every request {recovery:.2f} s after the kill"
        )
    finally:
        server.stop()
