"""An operator page never holds an app worker for long: with the plan table locked by
another transaction, or a database that accepts connections and never answers, the
dashboard answers 503 within a few seconds and API requests go on."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from flask_quota import Quota
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.testing import MemoryStorage
from tests.dashboards import HASH, OPS, csrf_from, dashboard_app
from tests.sqldb import database, sql_store

# What "a few seconds" means here: the admin bound (2 s) plus slack for a busy machine;
# before these bounds a locked table held a page for 5 s, a silent server for 10-20 s.
PAGE_BOUND = 4.0


@pytest.fixture(params=["postgresql", "mysql"])
def server_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh PostgreSQL or MariaDB database."""
    yield from database(request.param, tmp_path)


class TableLock:
    """Another transaction holding ``quota_plans`` exclusively (as a long migration or a
    stuck batch job would) for up to ``seconds``, released by ``release()``."""

    def __init__(self, url: str, seconds: float = 14.0) -> None:
        self.engine = create_engine(url)
        self.conn = self.engine.connect()
        if self.engine.dialect.name == "postgresql":
            self.conn.execute(text("LOCK TABLE quota_plans IN ACCESS EXCLUSIVE MODE"))
        else:
            self.conn.execute(text("SELECT * FROM quota_plans FOR UPDATE"))
        self.timer = threading.Timer(seconds, self.release)
        self.timer.start()

    def release(self) -> None:
        self.timer.cancel()
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()
            self.engine.dispose()


def timed(call: Any) -> tuple[float, Any]:
    began = time.monotonic()
    result = call()
    return time.monotonic() - began, result


def test_a_locked_plan_table_answers_503_within_a_few_seconds(
    tmp_path: Path, server_url: str
) -> None:
    """With quota_plans locked for 14 s, a dashboard plan edit (and, on PostgreSQL, the
    plans page itself) gives up within a few seconds with a 503 saying nothing was
    saved, while API requests keep being answered at once."""
    app = dashboard_app(
        tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH}, QUOTA_DATABASE_URL=server_url
    )
    try:
        http = app.test_client()
        token = csrf_from(http, "/quota/plans")
        lock = TableLock(server_url)
        try:
            form = {"csrf_token": token, "tier": "user", "rate": "9/minute"}
            took, edit = timed(lambda: http.post("/quota/plans/free/limit", headers=OPS, data=form))
            assert edit.status_code == 503 and took < PAGE_BOUND, (edit.status_code, took)
            assert "nothing was saved" in edit.get_data(as_text=True).lower()
            if server_url.startswith("postgresql"):  # InnoDB reads do not wait for row locks
                took, page = timed(lambda: http.get("/quota/plans", headers=OPS))
                assert page.status_code == 503 and took < PAGE_BOUND, (page.status_code, took)
            took, api = timed(lambda: http.get("/items"))
            assert api.status_code == 200 and took < 2.0  # a page waits its bound: the API never
        finally:
            lock.release()
        assert http.get("/quota/plans", headers=OPS).status_code == 200
    finally:
        sql_store(app).close()


def test_the_bound_holds_on_the_hosts_engine_too(tmp_path: Path) -> None:
    """With Quota(app, db=db) the engine is the host's, with no timeouts of ours; on
    PostgreSQL each operator transaction still sets its own statement_timeout, so a
    locked plan table stops an admin call within a few seconds."""
    url = next(database("postgresql", tmp_path))
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(SQLALCHEMY_DATABASE_URI=url, QUOTA_PLANS={"free": {"user": "5/hour"}})
    db = SQLAlchemy(app)
    Quota(app, db=db, storage=MemoryStorage())
    with app.app_context():
        db.create_all()
        sql = sql_store(app)
        admin = QuotaAdmin(sql, actor="ops")
        assert [p.name for p in admin.plans()] == ["free"]
        lock = TableLock(url)
        try:
            began = time.monotonic()
            with pytest.raises(SQLAlchemyError, match="statement timeout"):
                admin.set_plan_limit("free", "user", "9/hour")
            assert time.monotonic() - began < PAGE_BOUND
        finally:
            lock.release()
        sql.close()
        db.engine.dispose()


class SilentServer:
    """A TCP server that accepts every connection and never says a word."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.mark.parametrize(
    "scheme",
    [
        "postgresql+psycopg2://postgres@127.0.0.1:{port}/q",
        "mysql+pymysql://root@127.0.0.1:{port}/q",
    ],
)
def test_a_database_that_never_answers_is_bounded(tmp_path: Path, scheme: str) -> None:
    """A quota database that accepts TCP and stays silent: each dashboard page answers
    503 within a few seconds (the sync thread's own attempt is not waited for twice)
    and API requests are served meanwhile."""
    server = SilentServer()
    app = dashboard_app(
        tmp_path,
        QUOTA_DASHBOARD_USERS={"ops": HASH},
        QUOTA_DATABASE_URL=scheme.format(port=server.port),
    )
    try:
        http = app.test_client()
        for path in ("/quota/plans", "/quota/clients", "/quota/audit"):
            took, page = timed(lambda path=path: http.get(path, headers=OPS))
            assert page.status_code == 503 and took < PAGE_BOUND, (path, page.status_code, took)
            assert page.headers["Retry-After"].isdigit()
        took, api = timed(lambda: http.get("/items"))
        assert api.status_code == 200 and took < 2.0  # a page waits its bound: the API never
    finally:
        server.close()
        sql_store(app).close()
