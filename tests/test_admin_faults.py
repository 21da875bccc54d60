"""Changes under database trouble: every change is audited or nothing changes, a
database error answers a clear message (never a 500), and concurrent writers of the
same row do not collide into an error."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import create_engine, event, select, text
from sqlalchemy.orm import Session

from flask_quota import Quota
from flask_quota.sql.admin import AdminError, QuotaAdmin
from flask_quota.sql.models import Client, PlanLimit, PlanRecord
from flask_quota.sql.store import DEFAULT_DATABASE_FILE, SqlStore
from flask_quota.storage import MemoryStorage, StorageError
from tests.dashboards import OPS, csrf_from
from tests.servers import RedisServer
from tests.sqldb import sql_store

PLANS = {"free": {"user": "5/hour"}, "pro": {"user": "50/hour"}}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    """An app on a SQLite file, its counters in this process (the CLI runner shares them)."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'q.sqlite3'}"
    )
    Quota(app, storage=MemoryStorage())
    app.add_url_rule("/items", "items", lambda: "items")
    yield app
    sql_store(app).close()


def audit_actions(sql: SqlStore) -> list[str]:
    return [e.action for e in reversed(QuotaAdmin(sql, actor="t").audit_log())]


def refuse_audit_entries(url: str) -> None:
    """From now on the database refuses every new audit entry (a real SQLite trigger)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON quota_audit_log "
                "BEGIN SELECT RAISE(ABORT, 'audit log refuses writes'); END"
            )
        )
    engine.dispose()


@pytest.mark.redis
def test_a_reset_whose_audit_entry_cannot_be_written_clears_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """`flask quota reset` writes its audit entry first: when that fails, the counters
    (in the Redis the server shares) are left as they were and the command says why."""
    redis_server.client().flushall()
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True,
        QUOTA_PLANS=PLANS,
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'q.sqlite3'}",
        QUOTA_STORAGE_URL=redis_server.url,
    )
    Quota(app)
    app.add_url_rule("/items", "items", lambda: "items")
    try:
        _reset_refused(app)
    finally:
        sql_store(app).close()


def _reset_refused(app: Flask) -> None:
    http = app.test_client()
    assert [http.get("/items").status_code for _ in range(3)] == [200] * 3
    runner = app.test_cli_runner()
    before = runner.invoke(args=["quota", "usage", "--ip", "127.0.0.1"]).output
    assert re.search(r"user\s+user\s+5/hour\s+2/5", before), before
    refuse_audit_entries(app.config["QUOTA_DATABASE_URL"])
    result = runner.invoke(args=["quota", "reset", "--ip", "127.0.0.1", "--actor", "ops"])
    assert result.exit_code == 1
    assert "audit log refuses writes" in result.output
    after = runner.invoke(args=["quota", "usage", "--ip", "127.0.0.1"]).output
    # Nothing was cleared: the same buckets and counts (a reset's seconds may tick by one
    # between the two readings).
    assert _no_seconds(after) == _no_seconds(before)


def _no_seconds(output: str) -> str:
    return re.sub(r"\b\d+ s\b", "N s", output)


def test_audited_records_the_change_before_it_and_a_failure_after_it(app: Flask) -> None:
    """QuotaAdmin.audited commits its entry before the body runs; a failing body adds
    an '<action>.failed' entry with the error and re-raises."""
    admin = QuotaAdmin(sql_store(app), actor="ops")
    seen_inside: list[list[str]] = []
    with admin.audited("usage.reset", "ip:1.2.3.4", None, {"buckets": 2}):
        seen_inside.append(audit_actions(sql_store(app)))
    assert seen_inside == [["usage.reset"]]  # committed before the change
    with (
        pytest.raises(StorageError),
        admin.audited("usage.reset", "ip:1.2.3.4", None, {"buckets": 2}),
    ):
        raise StorageError("redis down")
    assert audit_actions(sql_store(app)) == ["usage.reset", "usage.reset", "usage.reset.failed"]
    failed = admin.audit_log(limit=1)[0]
    assert failed.after is not None and "redis down" in failed.after["error"]


@pytest.fixture
def ops_app(ops_app: Flask, close_sql: Callable[[Flask], Flask]) -> Flask:
    """conftest's ``ops_app``, its SQL store closed when the test ends, as this module's
    ``app`` closes its own (conftest's leaves that to the garbage collector)."""
    return close_sql(ops_app)


def default_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'instance' / DEFAULT_DATABASE_FILE}"


def execute(url: str, statement: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(statement))
    engine.dispose()


def test_a_database_error_on_a_dashboard_post_answers_503_and_saves_nothing(
    ops_app: Flask, tmp_path: Path
) -> None:
    """A change the database cannot complete: 503 with a message saying nothing was saved."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/plans")
    execute(default_url(tmp_path), "DROP TABLE quota_audit_log")
    response = http.post(
        "/quota/plans/free/limit",
        headers=OPS,
        data={"csrf_token": token, "tier": "user", "rate": "9/minute"},
    )
    assert response.status_code == 503
    page = response.get_data(as_text=True)
    assert "nothing was saved" in page.lower()
    assert response.headers["Retry-After"].isdigit()
    engine = create_engine(default_url(tmp_path))
    with engine.connect() as conn:
        rates = conn.scalars(select(PlanLimit.rate).where(PlanLimit.tier == "user")).all()
    engine.dispose()
    assert rates == ["3/minute"]


def test_a_database_error_on_a_dashboard_page_answers_503(ops_app: Flask, tmp_path: Path) -> None:
    """An admin page whose table cannot be read answers 503 with a message, not 500."""
    http = ops_app.test_client()
    assert http.get("/quota/audit", headers=OPS).status_code == 200
    execute(default_url(tmp_path), "DROP TABLE quota_audit_log")
    response = http.get("/quota/audit", headers=OPS)
    assert response.status_code == 503
    assert "quota database" in response.get_data(as_text=True).lower()


class Race:
    """Another writer's uncommitted row, committed just as ``sql`` sends its own INSERT
    into ``table`` (both read "no such row", so both insert it), or after a second when
    the change waits for the other writer instead (SQLite's write lock, a row lock)."""

    def __init__(self, sql: SqlStore, url: str, table: str, row: Callable[[int], Any]) -> None:
        self.engine = create_engine(url)
        self.session = Session(self.engine)
        plan_id = self.session.scalar(select(PlanRecord.id).where(PlanRecord.name == "free"))
        assert plan_id is not None
        self.session.add(row(plan_id))
        self.session.flush()  # sent, not committed: invisible to the other writer
        self.reached = threading.Event()
        self.sql = sql
        self.table = table
        event.listen(sql.engine, "before_cursor_execute", self._spy)

    def _spy(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith(f"INSERT INTO {self.table.upper()}"):
            self.reached.set()

    def run(self, change: Callable[[], Any]) -> Any:
        """``change()`` in a thread; the other writer commits when it reaches its INSERT."""
        outcome: list[Any] = []

        def work() -> None:
            try:
                outcome.append(change())
            except Exception as exc:  # returned to the test
                outcome.append(exc)

        thread = threading.Thread(target=work)
        thread.start()
        try:
            if self.reached.wait(1.0):
                time.sleep(0.1)
            self.session.commit()
        finally:
            thread.join(60)
            event.remove(self.sql.engine, "before_cursor_execute", self._spy)
            self.session.close()
            self.engine.dispose()
        assert outcome, "the change did not finish"
        return outcome[0]


def export_limit(plan_id: int) -> PlanLimit:
    return PlanLimit(plan_id=plan_id, tier="endpoint", resource="export", rate="4/hour")


@pytest.fixture
def sql_app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url)
    Quota(app, storage=MemoryStorage())
    sql_store(app).ensure_ready()
    yield app
    sql_store(app).close()


def test_concurrent_sets_of_the_same_limit_both_succeed(sql_app: Flask, database_url: str) -> None:
    """Two writers add the same plan limit at once: no IntegrityError, the later one wins."""
    race = Race(
        sql_store(sql_app),
        database_url,
        "quota_plan_limits",
        export_limit,
    )
    admin = QuotaAdmin(sql_store(sql_app), actor="ops")
    result = race.run(lambda: admin.set_plan_limit("free", "endpoint", "9/hour", resource="export"))
    assert not isinstance(result, Exception), repr(result)
    rates = {(x.tier, x.resource): x.rate for x in admin.plans()[0].limits}
    assert rates[("endpoint", "export")] == "9/hour"


def test_concurrent_creates_of_the_same_client_name_get_a_clear_message(
    sql_app: Flask, database_url: str
) -> None:
    """Two writers create a client of the same name at once: the loser is told the name
    is taken, not shown an IntegrityError."""
    race = Race(
        sql_store(sql_app),
        database_url,
        "quota_clients",
        lambda plan_id: Client(
            name="acme", plan_id=plan_id, key_prefix="fq_other0000", key_salt="s", key_hash="h"
        ),
    )
    admin = QuotaAdmin(sql_store(sql_app), actor="ops")
    result = race.run(lambda: admin.create_client("acme", "free"))
    assert isinstance(result, AdminError), repr(result)
    assert "exists already" in str(result)


def test_concurrent_plan_edits_on_the_dashboard_answer_no_500(
    ops_app: Flask, tmp_path: Path
) -> None:
    """The dashboard's plan form racing another writer of the same limit saves the rate."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/plans")
    race = Race(
        sql_store(ops_app),
        default_url(tmp_path),
        "quota_plan_limits",
        export_limit,
    )
    response = race.run(
        lambda: http.post(
            "/quota/plans/free/limit",
            headers=OPS,
            data={"csrf_token": token, "tier": "endpoint", "resource": "export", "rate": "9/hour"},
        )
    )
    assert not isinstance(response, Exception), repr(response)
    assert response.status_code == 302
    page = http.get("/quota/plans", headers=OPS).get_data(as_text=True)
    assert "9/hour" in page and "4/hour" not in page


def test_a_database_error_on_an_identity_page_answers_503(ops_app: Flask, tmp_path: Path) -> None:
    """A client's identity page reads its client row: a database that cannot answer gives
    503 with a message, not 500; so does an identity reset, whose audit entry comes first."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/plans")
    with ops_app.app_context():
        from flask_quota.sql.admin import QuotaAdmin

        client, _ = QuotaAdmin(ops_app.extensions["quota"].sql, actor="t").create_client(
            "acme", "free"
        )
    tag = f"id={client.id}"
    ops_app.extensions["quota"].sql.wait_loaded(5)
    execute(default_url(tmp_path), "DROP TABLE quota_clients")
    execute(default_url(tmp_path), "DROP TABLE quota_audit_log")
    page = http.get(f"/quota/identity/{tag}", headers=OPS)
    assert page.status_code in (200, 503)  # 200 when the snapshot says it's no client
    assert page.status_code != 500
    reset = http.post(f"/quota/identity/{tag}/reset", headers=OPS, data={"csrf_token": token})
    assert reset.status_code == 503
    assert "quota database" in reset.get_data(as_text=True).lower()
