"""Every change is audited with its real outcome: resets, blocks and unblocks write the
same entries from the API, the CLI and the dashboard, a failed storage call is recorded
as ``.failed``, and the CLI refuses changes that cannot reach the server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request

from flask_quota import Identity, Quota
from flask_quota.blocking import caller_facing
from flask_quota.core.algorithms import Outcome
from flask_quota.core.errors import PROBLEM_TYPE, CallerBlocked, QuotaExceeded
from flask_quota.core.policy import Decision
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.storage import StorageError
from flask_quota.testing import MemoryStorage
from tests.servers import RedisServer
from tests.sqldb import sql_store

PLANS = {"free": {"global": "100/second", "user": "3/hour"}}


def make_app(tmp_path: Path, **config: Any) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True,
        QUOTA_PLANS=PLANS,
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'q.sqlite3'}",
        **config,
    )
    storage = MemoryStorage() if "QUOTA_STORAGE_URL" not in config else None
    quota = Quota(app, storage=storage)

    @quota.identity_loader
    def load() -> Identity | None:
        user = request.headers.get("X-User")
        return Identity(user) if user else None

    app.add_url_rule("/items", "items", lambda: "items")
    app.config["TEST_QUOTA"] = quota
    return app


@pytest.fixture
def memory_app(tmp_path: Path) -> Iterator[Flask]:
    app = make_app(tmp_path)
    yield app
    sql_store(app).close()


@pytest.fixture
def redis_app(tmp_path: Path, own_redis: RedisServer) -> Iterator[Flask]:
    """An app on a redis-server this test may stop."""
    app = make_app(tmp_path, QUOTA_STORAGE_URL=own_redis.url, QUOTA_STORAGE_TIMEOUT=0.5)
    yield app
    sql_store(app).close()


def entries(app: Flask) -> list[tuple[str, str, str]]:
    log = QuotaAdmin(sql_store(app), actor="t").audit_log()
    return [(e.actor, e.action, e.target) for e in reversed(log)]


def test_quota_reset_is_audited(memory_app: Flask) -> None:
    """Must show: after quota.block(...) and quota.reset(...) in an app context, the audit
    log has a reset entry (actor api, the caller's tag, how many buckets)."""
    quota = memory_app.config["TEST_QUOTA"]
    with memory_app.app_context():
        quota.block("amy", seconds=60)
        assert quota.reset("amy", ip="10.0.0.1") > 0
    assert entries(memory_app) == [("api", "block", "id=amy"), ("api", "usage.reset", "id=amy")]
    reset = QuotaAdmin(sql_store(memory_app), actor="t").audit_log(limit=1)[0]
    assert reset.after is not None and reset.after["tags"] == ["id=amy", "ip=10.0.0.1"]


@pytest.mark.redis
def test_a_failed_reset_block_or_unblock_is_audited_as_failed(
    redis_app: Flask, own_redis: RedisServer
) -> None:
    """With Redis down, quota.reset/block/unblock raise StorageError, and each leaves its
    entry followed by `<action>.failed` with the error: never recorded as done."""
    quota = redis_app.config["TEST_QUOTA"]
    own_redis.stop()
    call: Callable[[], object]
    with redis_app.app_context():
        for call in (
            lambda: quota.reset("amy"),
            lambda: quota.block("amy", seconds=60),
            lambda: quota.unblock("amy"),
        ):
            with pytest.raises(StorageError):
                call()
    assert entries(redis_app) == [
        ("api", "usage.reset", "id=amy"),
        ("api", "usage.reset.failed", "id=amy"),
        ("api", "block", "id=amy"),
        ("api", "block.failed", "id=amy"),
        ("api", "unblock", "id=amy"),
        ("api", "unblock.failed", "id=amy"),
    ]
    failed = QuotaAdmin(sql_store(redis_app), actor="t").audit_log(limit=1)[0]
    assert failed.after is not None and failed.after["error"]


@pytest.mark.redis
def test_the_cli_writes_the_same_entries_as_the_api(redis_app: Flask) -> None:
    """`flask quota block|reset|unblock` on a shared Redis act, and are audited under
    --actor exactly as quota.block/reset/unblock are under "api"."""
    runner = redis_app.test_cli_runner()
    http = redis_app.test_client()
    for args in (["block", "amy", "--for", "10m"], ["reset", "amy"], ["unblock", "amy"]):
        result = runner.invoke(args=["quota", *args, "--actor", "kim"])
        assert result.exit_code == 0, result.output
        if args[0] == "block":
            assert http.get("/items", headers={"X-User": "amy"}).status_code == 429
    assert http.get("/items", headers={"X-User": "amy"}).status_code == 200
    quota = redis_app.config["TEST_QUOTA"]
    with redis_app.app_context():
        quota.block("amy", seconds=60)
        quota.reset("amy")
        quota.unblock("amy")
    cli = [(action, target) for actor, action, target in entries(redis_app) if actor == "kim"]
    api = [(action, target) for actor, action, target in entries(redis_app) if actor == "api"]
    assert cli == api == [("block", "id=amy"), ("usage.reset", "id=amy"), ("unblock", "id=amy")]


@pytest.mark.parametrize(
    ("args", "page"),
    [
        (["block", "amy", "--for", "10m"], "Block on the Blocks page"),
        (["unblock", "amy"], "Unblock on the Blocks page"),
        (["reset", "--ip", "10.0.0.1"], "Reset on the caller's identity page"),
    ],
)
def test_the_cli_refuses_changes_on_memory_storage(
    memory_app: Flask, args: list[str], page: str
) -> None:
    """On memory storage (the demo's default) the CLI process's counters are not the
    server's: block, unblock and reset exit non-zero, say what to use instead, and
    neither change nor audit anything."""
    result = memory_app.test_cli_runner().invoke(args=["quota", *args, "--actor", "kim"])
    assert result.exit_code == 1, result.output
    assert "would not reach the server" in result.output
    assert page in result.output and f"quota.{args[0]}(...)" in result.output
    assert entries(memory_app) == []
    with memory_app.app_context():
        assert memory_app.config["TEST_QUOTA"].blocks() == []


# -- what a blocked caller is told -----------------------------------------------


def blocked(seconds: int, **who: Any) -> CallerBlocked:
    now = 1_000_000_000_000
    outcome = Outcome(False, 0, 0, now + seconds * 1_000_000, seconds * 1_000_000)
    return CallerBlocked(Decision("free", (), now), outcome, **who)


def test_a_block_is_a_quota_exceeded_built_by_its_constructor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CallerBlocked`` is made by ``QuotaExceeded.__init__`` (the one place a 429's
    attributes are set), and its body and headers stay what callers are told."""
    made = []
    build = QuotaExceeded.__init__

    def spy(self: QuotaExceeded, *args: Any, **kwargs: Any) -> None:
        made.append(type(self))
        build(self, *args, **kwargs)

    monkeypatch.setattr(QuotaExceeded, "__init__", spy)
    exc = blocked(30, by="auto")
    assert made == [CallerBlocked]
    assert exc.problem() == {
        "type": PROBLEM_TYPE,
        "title": "Too Many Requests",
        "status": 429,
        "detail": "Blocked for 30 more s after too many denied requests.",
        "violated-policies": ["blocked"],
        "tier": "blocked",
        "resource": None,
        "plan": "free",
        "limit": 0,
        "window": 30,
        "remaining": 0,
        "retry_after": 30,
        "reset": 1_000_030,
        "upgrade": None,
    }
    assert exc.get_headers() == [
        ("Content-Type", "application/problem+json"),
        ("Retry-After", "30"),
    ]
    assert exc.code == 429 and exc.policy == "blocked"


def test_an_operator_block_says_so_and_shows_only_a_public_reason(memory_app: Flask) -> None:
    """A manual block's 429 says an operator blocked the caller, not "too many denied
    requests"; the reason appears only when the operator made it public. Blocks stored
    without the flag (an earlier release) keep their reason private."""
    quota = memory_app.config["TEST_QUOTA"]
    storage = memory_app.extensions["quota"].storage
    with memory_app.app_context():
        quota.block("amy", seconds=600, reason="card testing")
        [private] = quota.blocks()
        quota.unblock("amy")
        from flask_quota.tools import blocks
        from flask_quota.tools.inspection import Caller

        state = memory_app.extensions["quota"]
        blocks.block(state, Caller.of("amy"), 600, "card testing", "ops", public=True)
        [public] = quota.blocks()
    assert (private.public, public.public) == (False, True)
    [entry] = storage.blocks("quota:{id=amy}:b")
    assert caller_facing(entry.info) == {"by": "ops", "reason": "card testing"}
    detail = blocked(597, **caller_facing(entry.info)).description
    assert detail == "Blocked by an operator for 597 more s. Reason: card testing"
    legacy = '{"reason": "card testing", "by": "kim", "at": 1, "seconds": 600}'
    assert caller_facing(legacy) == {"by": "kim", "reason": None}
    assert blocked(597, **caller_facing(legacy)).description == (
        "Blocked by an operator for 597 more s."
    )
    auto = blocked(30, by="auto")
    assert auto.description == "Blocked for 30 more s after too many denied requests."
    assert auto.problem()["tier"] == "blocked" and auto.retry_after == 30
    assert "denied requests" not in blocked(30).description  # unknown: no cause claimed
