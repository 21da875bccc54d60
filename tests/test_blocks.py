"""Blocks: QUOTA_BLOCK_AFTER escalates a caller who keeps getting denied into a block;
quota.block/unblock/blocks do it by hand. Memory, Redis (with the deny cache) and Cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask, request
from flask.testing import FlaskClient

from flask_quota import Identity, Quota
from flask_quota.settings import DEFAULTS, Settings
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.storage import MemoryStorage
from flask_quota.storage.denycache import DenyCache
from flask_quota.testing import FrozenClock
from tests.servers import RedisServer

PLANS = {"free": {"user": "1000/hour", "resources": {"export": "2/hour"}}}
PROBLEM_FIELDS = {
    "type", "title", "status", "detail", "violated-policies", "tier", "resource", "plan",
    "limit", "window", "remaining", "retry_after", "reset", "upgrade",
}  # fmt: skip


def blocks_app(app: Flask, storage: MemoryStorage | None = None, **config: Any) -> Quota:
    """Two limited routes and a tight one; callers name themselves in X-Client."""
    app.config.update(
        {
            "QUOTA_PLANS": PLANS,
            "QUOTA_DATABASE_URL": f"sqlite:///{app.instance_path}/quota.sqlite3",
            "QUOTA_BLOCK_AFTER": "3/hour",
            "QUOTA_BLOCK_FOR": 600,
            **config,
        }
    )
    quota = Quota(app, storage=storage)

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client) if client else None

    @app.get("/export")
    @quota.limit(resource="export")
    def export() -> str:
        return "exported"

    @app.get("/items")
    def items() -> str:
        return "items"

    @app.post("/orders")
    def orders() -> str:
        return "ordered"

    @app.get("/health")
    @quota.exempt
    def health() -> str:
        return "ok"

    return quota


def hammer_until_blocked(client: FlaskClient, headers: dict[str, str]) -> list[int]:
    """GET /export until a 429 says "blocked"; the statuses with their tier."""
    seen: list[int] = []
    for _ in range(20):
        response = client.get("/export", headers=headers)
        seen.append(response.status_code)
        if response.status_code == 429 and response.get_json()["tier"] == "blocked":
            return seen
    raise AssertionError(f"never blocked: {seen}")


def assert_blocked(client: FlaskClient, headers: dict[str, str], block_for: int) -> None:
    """Every limited route answers 429 "blocked" with Retry-After near the block's length."""
    for method, path in [("GET", "/export"), ("GET", "/items"), ("POST", "/orders")]:
        response = client.open(path, method=method, headers=headers)
        assert response.status_code == 429, (path, response.status_code)
        body = response.get_json()
        assert body["tier"] == "blocked" and body["violated-policies"] == ["blocked"]
        assert set(body) == PROBLEM_FIELDS
        retry = int(response.headers["Retry-After"])
        assert block_for - 30 <= retry <= block_for, retry
        assert body["retry_after"] == retry


# -- configuration ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("QUOTA_BLOCK_AFTER", "often"),
        ("QUOTA_BLOCK_AFTER", "0/minute"),
        ("QUOTA_BLOCK_AFTER", 20),
        ("QUOTA_BLOCK_FOR", 0),
        ("QUOTA_BLOCK_FOR", "10m"),
        ("QUOTA_BLOCK_FOR", True),
        ("QUOTA_BLOCK_FOR", 1.5),
    ],
)
def test_bad_block_settings_fail_naming_the_key(key: str, value: object) -> None:
    """A malformed block setting raises ValueError naming the key, at configuration time."""
    with pytest.raises(ValueError, match=key):
        Settings.from_config({**DEFAULTS, key: value})


def test_block_settings_parse_from_strings() -> None:
    """Environment-style strings work; None, '' and 'off' turn escalation off."""
    settings = Settings.from_config({**DEFAULTS, "QUOTA_BLOCK_AFTER": "20/minute",
                                     "QUOTA_BLOCK_FOR": "900"})  # fmt: skip
    assert settings.block_after is not None and settings.block_after.limit == 20
    assert settings.block_for == 900
    for off in (None, "", "off"):
        assert Settings.from_config({**DEFAULTS, "QUOTA_BLOCK_AFTER": off}).block_after is None


# -- escalation on memory -------------------------------------------------------------


def test_escalation_blocks_on_every_route_until_unblocked(app: Flask, clock: FrozenClock) -> None:
    """Denied more than 3/hour: blocked on every limited route with Retry-After ~ 600 s;
    other callers are untouched; quota.unblock() serves the caller again at once."""
    quota = blocks_app(app, MemoryStorage(clock))
    client, mallory = app.test_client(), {"X-Client": "mallory"}

    seen = hammer_until_blocked(client, mallory)
    # 2 allowed, then 3 denials within the threshold, the 4th one blocks.
    assert seen == [200, 200, 429, 429, 429, 429]
    assert_blocked(client, mallory, 600)
    assert client.get("/health", headers=mallory).status_code == 200  # exempt stays exempt
    assert client.get("/items", headers={"X-Client": "alice"}).status_code == 200

    with app.app_context():
        [listed] = quota.blocks()
        assert (listed.tag, listed.name, listed.by) == ("id=mallory", "mallory", "auto")
        assert 590 <= listed.remaining <= 600 and "3 per hour" in listed.reason
        assert quota.unblock("mallory") == ["id=mallory"]
        assert quota.blocks() == []
    assert client.get("/items", headers=mallory).status_code == 200


def test_a_block_ends_by_itself(app: Flask, clock: FrozenClock) -> None:
    """After QUOTA_BLOCK_FOR seconds the caller is served again without an unblock."""
    blocks_app(app, MemoryStorage(clock), QUOTA_BLOCK_FOR=60)
    client, mallory = app.test_client(), {"X-Client": "mallory"}
    hammer_until_blocked(client, mallory)
    clock.advance(59)
    assert client.get("/items", headers=mallory).get_json()["tier"] == "blocked"
    clock.advance(2)
    assert client.get("/items", headers=mallory).status_code == 200


def test_no_escalation_without_block_after(app: Flask, clock: FrozenClock) -> None:
    """QUOTA_BLOCK_AFTER=None (the default): denials stay ordinary 429s, never a block."""
    blocks_app(app, MemoryStorage(clock), QUOTA_BLOCK_AFTER=None)
    client = app.test_client()
    tiers = [client.get("/export").get_json() for _ in range(12)]
    assert [t["tier"] for t in tiers[2:]] == ["endpoint"] * 10
    assert client.get("/items").status_code == 200


def test_manual_block_of_an_ip_is_audited_listed_and_lifted(app: Flask, clock: FrozenClock) -> None:
    """quota.block(ip=...) blocks the anonymous caller of that address for `seconds`;
    the audit entry is written, the listing shows the reason; unblock lifts it."""
    quota = blocks_app(app, MemoryStorage(clock))
    client = app.test_client()
    with app.app_context():
        assert quota.block(ip="127.0.0.1", seconds=120, reason="scraping") == ["ip=127.0.0.1"]
        [listed] = quota.blocks()
    assert (listed.name, listed.reason, listed.by, listed.remaining) == (
        "127.0.0.1", "scraping", "api", 120,
    )  # fmt: skip
    assert_blocked(client, {}, 120)
    assert client.get("/items", headers={"X-Client": "bob"}).status_code == 200  # identified
    with app.app_context():
        assert quota.unblock(ip="127.0.0.1") == ["ip=127.0.0.1"]
        assert quota.unblock(ip="127.0.0.1") == []  # not blocked any more
        entries = QuotaAdmin(app.extensions["quota"].sql, actor="t").audit_log()
    actions = [(e.actor, e.action, e.target) for e in reversed(entries)]
    assert actions == [
        ("api", "block", "ip=127.0.0.1"),
        ("api", "unblock", "ip=127.0.0.1"),
        ("api", "unblock", "ip=127.0.0.1"),
    ]
    assert client.get("/items").status_code == 200


def test_block_rejects_bad_arguments(app: Flask, clock: FrozenClock) -> None:
    """No caller, or a non-positive length, is a ValueError; nothing is blocked."""
    quota = blocks_app(app, MemoryStorage(clock))
    with app.app_context():
        with pytest.raises(ValueError, match="identity"):
            quota.block()
        with pytest.raises(ValueError, match="seconds"):
            quota.block("x", seconds=0)
        assert quota.blocks() == []


# -- Redis, with the deny cache -----------------------------------------------------------


@pytest.mark.redis
def test_on_redis_a_block_is_answered_by_the_deny_cache(
    app: Flask, redis_server: RedisServer, redis_client: Any
) -> None:
    """Must-show on real Redis: blocked on every route with Retry-After ~ the block's
    length, those answers come from the deny cache, and quota.unblock() serves again."""
    quota = blocks_app(app, QUOTA_STORAGE_URL=redis_server.url, QUOTA_STORAGE_TIMEOUT=2)
    client, mallory = app.test_client(), {"X-Client": "mallory"}
    storage = app.extensions["quota"].storage
    assert isinstance(storage, DenyCache)

    hammer_until_blocked(client, mallory)
    key = "quota:{id=mallory}:b"
    assert 590_000 <= redis_client.pttl(key) <= 600_000
    assert json.loads(redis_client.get(key))["by"] == "auto"
    client.get("/items", headers=mallory)  # this worker learns about the block
    hits = storage.hits
    assert_blocked(client, mallory, 600)
    assert storage.hits == hits + 3  # none of the three reached Redis

    with app.app_context():
        [listed] = quota.blocks()
        assert listed.tag == "id=mallory"
        assert quota.unblock("mallory") == ["id=mallory"]
    assert redis_client.exists(key) == 0
    assert client.get("/items", headers=mallory).status_code == 200


# -- Redis Cluster ------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.slow
def test_on_the_cluster_the_block_shares_the_callers_slot(app: Flask, tmp_path: Any) -> None:
    """On Redis Cluster the block key lands in the caller's slot, a block is enforced
    with the tiers and listed (SCAN over every master), and unblock lifts it."""
    from redis.crc import key_slot

    from tests.cluster import REDIS_CLI, Cluster
    from tests.conftest import _need_redis

    _need_redis()
    if REDIS_CLI is None:
        pytest.skip("redis-cli not installed")
    cluster = Cluster(tmp_path / "cluster")
    try:
        cluster.wait_healthy()
        quota = blocks_app(app, QUOTA_STORAGE_URL=cluster.url, QUOTA_STORAGE_TIMEOUT=1)
        keys = app.extensions["quota"].policy.keys
        assert key_slot(keys.block_key("id=eve").encode()) == key_slot(
            keys.user_key("id=eve", app.extensions["quota"].settings.algorithm).encode()
        )
        client, eve = app.test_client(), {"X-Client": "eve"}
        hammer_until_blocked(client, eve)
        assert_blocked(client, eve, 600)
        with app.app_context():
            quota.block("zed", seconds=300, reason="manual")
            assert {b.tag for b in quota.blocks()} == {"id=eve", "id=zed"}
            quota.unblock("eve")
        assert client.get("/items", headers=eve).status_code == 200
    finally:
        cluster.stop()


# -- what a blocked caller is told ---------------------------------------------------


def test_an_automatic_block_says_why_on_every_request(app: Flask, clock: FrozenClock) -> None:
    """QUOTA_BLOCK_AFTER's block: the triggering 429 and the later ones say the caller was
    blocked after too many denied requests."""
    blocks_app(app, MemoryStorage(clock))
    client, mallory = app.test_client(), {"X-Client": "mallory"}
    hammer_until_blocked(client, mallory)
    detail = client.get("/items", headers=mallory).get_json()["detail"]
    assert "after too many denied requests" in detail


def test_an_operators_block_says_so_and_shows_only_a_public_reason(
    app: Flask, clock: FrozenClock
) -> None:
    """quota.block(): the 429 says an operator blocked the caller; the reason appears only
    when the operator made it public."""
    quota = blocks_app(app, MemoryStorage(clock))
    client = app.test_client()
    with app.app_context():
        quota.block("eve", reason="internal fraud score 97")
        quota.block("bob", reason="unpaid invoice 42", public=True)
    eve = client.get("/items", headers={"X-Client": "eve"}).get_json()["detail"]
    bob = client.get("/items", headers={"X-Client": "bob"}).get_json()["detail"]
    assert "Blocked by an operator" in eve and "fraud" not in eve
    assert "Blocked by an operator" in bob and "unpaid invoice 42" in bob
