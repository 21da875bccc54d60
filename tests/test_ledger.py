"""The usage ledger (``QUOTA_LEDGER``): what a request leaves in ``quota_usage``, how a
flush writes it, and what a database outage or a retried flush does to the counts.

Real databases (SQLite, PostgreSQL, MariaDB through ``database_url``), the test client
and memory storage; the gunicorn fleet is in tests/test_ledger_gunicorn.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from flask import Flask, Response, request, stream_with_context
from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.orm import Session

from flask_quota import Identity, Quota
from flask_quota.ledger import Ledger, caller_of, counted, day_of
from flask_quota.sql.models import CALLER_MAX, LedgerFlush, UsageRow
from flask_quota.state import get_state
from tests.sqldb import sql_store

Rows = dict[tuple[date, str, str, str], tuple[int, int, int]]
TODAY = datetime.now(UTC).date()


def ledger_app(app: Flask, url: str, **config: Any) -> Quota:
    """An app whose callers are ``X-User`` (tenant ``X-Tenant``), with a metered view."""
    app.config.update(
        QUOTA_LEDGER=True,
        QUOTA_DATABASE_URL=url,
        QUOTA_PLANS={
            "free": {
                "user": "1000/minute",
                "resources": {"tokens": "100000/month", "judged": "1000/day"},
            }
        },
        **config,
    )
    quota = Quota(app)

    @quota.identity_loader
    def caller() -> Identity | None:
        user = request.headers.get("X-User")
        return Identity(user, tenant=request.headers.get("X-Tenant")) if user else None

    @app.post("/complete")
    @quota.limit(resource="tokens", cost=lambda: int(request.args.get("cost", 10)))
    def complete() -> tuple[str, int]:
        if "actual" in request.args:
            quota.settle(int(request.args["actual"]))
        for units in request.args.getlist("charge"):
            quota.charge(int(units))
        return "ok", int(request.args.get("status", 200))

    @app.post("/judged")
    @quota.limit(resource="judged", cost=5, charge_when=lambda r: r.status_code < 400)
    def judged() -> tuple[str, int]:
        return "ok", int(request.args.get("status", 200))

    @app.get("/stream")
    @quota.limit(resource="tokens", cost=50)
    def stream() -> Response:
        def body() -> Iterator[str]:
            yield "a"
            quota.settle(int(request.args["actual"]))
            yield "b"

        return Response(stream_with_context(body()))

    @app.get("/tight")
    @quota.limit("2/minute", resource="tight")
    def tight() -> str:
        return "ok"

    @app.get("/plain")
    def plain() -> str:
        return "ok"

    return quota


def rows(app: Flask) -> Rows:
    with Session(sql_store(app).engine) as session:
        return counted(session.scalars(select(UsageRow)).all())


def flushed(app: Flask) -> Rows:
    ledger = get_state(app).ledger
    assert ledger is not None
    assert ledger.flush()
    return rows(app)


def test_admitted_units_per_caller_tenant_resource_and_day(
    app: Flask, database_url: str, close_sql: Callable[[Flask], Flask]
) -> None:
    """Each admitted request counts under the caller's requests ('') and its resource's
    units; settle, charge and charge_when refunds are what the row keeps; denials count
    as denied; anonymous callers are not recorded."""
    ledger_app(close_sql(app), database_url)
    http = app.test_client()
    ada = {"X-User": "ada", "X-Tenant": "acme"}
    assert http.post("/complete?cost=10", headers=ada).status_code == 200  # 10
    assert http.post("/complete?cost=100&actual=7", headers=ada).status_code == 200  # 7
    assert http.post("/complete?cost=10&charge=3&charge=2", headers=ada).status_code == 200  # 15
    assert http.post("/judged", headers=ada).status_code == 200  # 5
    assert http.post("/judged?status=500", headers=ada).status_code == 500  # refunded: 0
    streamed = http.get("/stream?actual=20", headers=ada)
    assert streamed.get_data() == b"ab"
    streamed.close()  # settled at its close: 20
    for _ in range(3):
        http.get("/tight", headers={"X-User": "bob"})  # 2 admitted, 1 denied
    http.get("/plain", headers={"X-User": "bob"})
    http.get("/plain")  # anonymous: not recorded
    found = flushed(app)
    assert found == {
        (TODAY, "ada", "acme", ""): (6, 6, 0),
        (TODAY, "ada", "acme", "tokens"): (10 + 7 + 15 + 20, 4, 0),
        (TODAY, "ada", "acme", "judged"): (5, 2, 0),
        (TODAY, "bob", "", ""): (3, 3, 1),
        (TODAY, "bob", "", "tight"): (2, 2, 1),
    }
    # A second flush adds to the rows rather than writing them again.
    http.post("/complete?cost=1", headers=ada)
    assert flushed(app)[(TODAY, "ada", "acme", "tokens")] == (53, 5, 0)


def test_a_retried_flush_counts_once(
    app: Flask, database_url: str, close_sql: Callable[[Flask], Flask]
) -> None:
    """A flush written again under its own id (its commit's answer was lost) is found by
    its id and skipped: the rows are counted once."""
    ledger_app(close_sql(app), database_url)
    http = app.test_client()
    http.post("/complete?cost=10", headers={"X-User": "ada"})
    ledger = get_state(app).ledger
    assert ledger is not None
    with ledger._lock:
        from flask_quota.ledger import _Batch

        batch = _Batch(ledger._counts, [])
        ledger._counts = {}
    assert ledger._write(batch)
    assert ledger._write(batch)  # the retry of a flush that had committed
    assert rows(app)[(TODAY, "ada", "", "tokens")] == (10, 1, 0)
    with Session(sql_store(app).engine) as session:
        assert session.get(LedgerFlush, batch.id) is not None


def test_the_database_down_loses_nothing_and_counts_nothing_twice(
    tmp_path: Path, close_sql: Callable[[Flask], Flask], caplog: pytest.LogCaptureFixture
) -> None:
    """While the ledger's database cannot be written, flushes fail and their counts
    wait (requests go on), with one warning, not one per flush; once it is back, every
    count is written exactly once."""
    url = f"sqlite:///{tmp_path}/ledger.sqlite3"
    app = close_sql(Flask(__name__, instance_path=str(tmp_path / "instance")))
    ledger_app(app, url)
    http = app.test_client()
    http.post("/complete?cost=10", headers={"X-User": "ada"})
    assert flushed(app)[(TODAY, "ada", "", "tokens")] == (10, 1, 0)
    ledger = get_state(app).ledger
    assert ledger is not None
    real = ledger.engine
    broken = create_engine(f"sqlite:///{tmp_path}/missing/dir/x.sqlite3")
    ledger.engine = lambda: broken
    caplog.clear()
    for _ in range(5):
        assert http.post("/complete?cost=10", headers={"X-User": "ada"}).status_code == 200
        assert not ledger.flush()  # kept, as the failed batch
    warned = [r for r in caplog.records if "usage ledger could not be written" in r.message]
    assert len(warned) == 1, warned
    ledger.engine = real
    assert ledger.flush()
    assert rows(app)[(TODAY, "ada", "", "tokens")] == (60, 6, 0)


def test_writes_per_flush_follow_the_callers_not_the_requests(
    app: Flask, close_sql: Callable[[Flask], Flask], tmp_path: Path
) -> None:
    """Ten requests or a thousand from the same three callers: each flush sends the
    database the same statements with the same number of rows."""
    ledger_app(close_sql(app), f"sqlite:///{tmp_path}/w.sqlite3")
    ledger = get_state(app).ledger
    assert ledger is not None
    # Only this test's flushes: a background one in flight when the list is cleared
    # left its last statement in it (CI: one flush seen as one and a half).
    ledger.interval = 3600.0
    http = app.test_client()
    engine = sql_store(app).engine
    statements: list[tuple[str, int]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def seen(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        if sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            statements.append((sql.split()[2], len(params) if many else 1))

    def flush_after(requests: int) -> list[tuple[str, int]]:
        for i in range(requests):
            http.post("/complete?cost=1", headers={"X-User": f"user{i % 3}"})
        statements.clear()
        assert ledger.flush()
        return list(statements)

    flush_after(3)  # the first flush also makes the tables
    few, many = flush_after(9), flush_after(999)
    assert few == many, (few, many)
    assert sum(n for table, n in many if table == "quota_usage") == 6  # 3 callers x 2 rows
    assert rows(app)[(TODAY, "user0", "", "tokens")] == (337, 337, 0)


def test_days_follow_the_time_zone() -> None:
    """A request at 23:59 and one at 00:01 local time fall on two days in that zone,
    whatever the UTC date."""
    zone = ZoneInfo("Asia/Seoul")  # UTC+9: 15:00 UTC is midnight
    before = int(datetime(2026, 11, 30, 14, 59, tzinfo=UTC).timestamp() * 1_000_000)
    after = before + 2 * 60_000_000
    assert day_of(before, zone) == date(2026, 11, 30)
    assert day_of(after, zone) == date(2026, 12, 1)
    ledger = Ledger(lambda: create_engine("sqlite://"), zone)
    ledger._thread_pid = os.getpid()  # no writer thread: this test reads the pending counts
    ledger.record(before, "ada", None, (), admitted=True)
    ledger.record(after, "ada", None, (), admitted=True)
    assert sorted(day for day, *_ in ledger._counts) == [date(2026, 11, 30), date(2026, 12, 1)]


def test_a_long_identity_is_filed_under_its_digest() -> None:
    """An identity longer than the caller column is recorded under a stable digest that
    fits it; a short one as itself."""
    long = "x" * 500
    assert caller_of("ada") == "ada"
    assert caller_of(long) == caller_of(long) and len(caller_of(long)) <= CALLER_MAX
    assert caller_of(long) != caller_of(long + "y")


def test_too_many_waiting_rows_are_dropped_not_held(tmp_path: Path) -> None:
    """With the database away, at most ``max_pending`` rows wait; further new rows are
    dropped and counted, existing rows still add up."""
    engine: Engine = create_engine(f"sqlite:///{tmp_path}/none/x.sqlite3")
    ledger = Ledger(lambda: engine, ZoneInfo("UTC"), max_pending=4)
    ledger._thread_pid = os.getpid()  # no writer thread
    now = 1_800_000_000_000_000
    for user in ("a", "b", "c"):
        ledger.record(now, user, None, (), admitted=True)
    assert len(ledger._counts) == 3 and ledger.dropped == 0
    ledger.record(now, "a", None, (("r", 2),), admitted=True)  # the 4th row
    ledger.record(now, "a", None, (), admitted=True)  # an existing row: added
    assert ledger._counts[(day_of(now, ZoneInfo("UTC")), "a", "", "")] == [3, 3, 0]
    ledger.record(now, "d", None, (), admitted=True)
    assert ledger.dropped == 1 and len(ledger._counts) == 4


def test_the_status_endpoint_shows_the_callers_own_period_usage(
    app: Flask, tmp_path: Path, close_sql: Callable[[Flask], Flask]
) -> None:
    """With the ledger on, QUOTA_STATUS_URL adds the caller's totals in its current
    billing period (what the flushes wrote); another caller's use is not in it; with
    the ledger off there is no usage key."""
    ledger_app(close_sql(app), f"sqlite:///{tmp_path}/s.sqlite3", QUOTA_STATUS_URL="/rate_limit")
    http = app.test_client()
    for cost in (10, 20):
        http.post(f"/complete?cost={cost}", headers={"X-User": "ada"})
    http.post("/complete?cost=99", headers={"X-User": "bob"})
    flushed(app)
    usage = http.get("/rate_limit", headers={"X-User": "ada"}).get_json()["usage"]
    first, last = (
        date.fromisoformat(usage["period"]["first"]),
        date.fromisoformat(usage["period"]["last"]),
    )
    assert first == TODAY.replace(day=1) and first <= TODAY <= last and last.day >= 28
    assert usage["totals"] == [
        {"resource": "", "units": 2, "requests": 2, "denied": 0},
        {"resource": "tokens", "units": 30, "requests": 2, "denied": 0},
    ]
    other = Flask(__name__, instance_path=str(tmp_path / "off"))
    other.config.update(QUOTA_STATUS_URL="/rate_limit")
    Quota(close_sql(other))
    assert "usage" not in other.test_client().get("/rate_limit").get_json()
