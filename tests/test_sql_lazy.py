"""No surprises from the SQL default: nothing is created and no thread runs until
something needs SQL, and a local SQLite database beside shared counters is named."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from flask import Flask
from sqlalchemy import create_engine, inspect

from flask_quota import Quota
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.store import DEFAULT_DATABASE_FILE
from flask_quota.storage import MemoryStorage
from tests.sqldb import sql_store

PLANS = {
    "free": {"user": "3/minute"},
    "pro": {"user": "50/minute"},
}


def sync_threads() -> set[threading.Thread]:
    """The stores' sync threads. Not their short-lived attempt threads: syncs that
    earlier tests left running start those at any time."""
    return {t for t in threading.enumerate() if t.name == "flask-quota-sync"}


@pytest.fixture
def build(tmp_path: Path, close_sql: Callable[[Flask], Flask]) -> Callable[..., Flask]:
    """Apps with one limited route; ``name`` picks the instance folder (shared = same DB)."""

    def make(name: str = "instance", **config: Any) -> Flask:
        app = Flask(__name__, instance_path=str(tmp_path / name))
        app.config.update({"TESTING": True, "QUOTA_PLANS": PLANS, **config})
        Quota(app, storage=MemoryStorage())
        app.add_url_rule("/items", "items", lambda: "items")
        return close_sql(app)

    return make


def user_quota(app: Flask, key: str | None = None) -> int:
    headers = {"X-API-Key": key} if key else {}
    policy = app.test_client().get("/items", headers=headers).headers["RateLimit-Policy"]
    return int(policy.split('"user";q=')[1].split(";")[0])


def cli(app: Flask, *args: str) -> str:
    result = app.test_cli_runner().invoke(args=["quota", *args])
    assert result.exit_code == 0, result.output
    return result.output


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``condition`` until true; the seconds it took. Fails after ``seconds``."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, f"{what} within {seconds} s"
        time.sleep(0.02)
    return time.monotonic() - started


def test_a_decorator_only_app_creates_no_database_and_runs_no_thread(
    build: Callable[..., Flask], tmp_path: Path
) -> None:
    """Requests, with or without an API key, create no file and start no sync thread;
    the configured plans apply."""
    before = sync_threads()
    app = build()
    http = app.test_client()
    statuses = [http.get("/items").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]  # QUOTA_PLANS' free plan: 3/minute
    invented = http.get("/items", headers={"X-API-Key": "fq_" + "x" * 40})
    assert invented.status_code == 429  # unknown key: the anonymous budget, no fresh bucket
    assert not (tmp_path / "instance" / DEFAULT_DATABASE_FILE).exists()
    assert sync_threads() - before == set()
    assert not sql_store(app).health().started


def test_an_unknown_key_without_any_database_is_refused_and_creates_nothing(
    build: Callable[..., Flask], tmp_path: Path
) -> None:
    """With QUOTA_REJECT_UNKNOWN_KEYS and no database at all, no key can be valid: 401."""
    app = build(QUOTA_REJECT_UNKNOWN_KEYS=True)
    response = app.test_client().get("/items", headers={"X-API-Key": "fq_" + "y" * 40})
    assert response.status_code == 401
    assert not (tmp_path / "instance" / DEFAULT_DATABASE_FILE).exists()


def test_a_plan_change_from_the_cli_reaches_a_lazy_app_within_two_seconds(
    build: Callable[..., Flask], tmp_path: Path
) -> None:
    """A running app on the default database sees a change made by another process's
    `flask quota` (which creates the database) within 2 s."""
    serving = build()
    assert user_quota(serving) == 3
    assert not (tmp_path / "instance" / DEFAULT_DATABASE_FILE).exists()
    operator = build()  # same instance folder: another process on the same server
    cli(operator, "plans", "set", "free", "user", "7/minute", "--actor", "ops")
    assert (tmp_path / "instance" / DEFAULT_DATABASE_FILE).is_file()
    wait_for(lambda: user_quota(serving) == 7, 2.0, "the serving app applies the change")


def test_a_new_app_on_an_existing_default_database_verifies_keys(
    build: Callable[..., Flask],
) -> None:
    """Where the default database exists, a new app starts its sync at once and knows
    the clients made with the CLI."""
    operator = build()
    made = cli(operator, "clients", "create", "acme", "--plan", "pro")
    key = made.split("API key: ")[1].split()[0]
    before = sync_threads()
    serving = build()
    assert user_quota(serving, key) == 50
    assert len(sync_threads() - before) == 1


def test_a_configured_database_is_loaded_in_the_background_at_start(
    build: Callable[..., Flask], tmp_path: Path
) -> None:
    """With QUOTA_DATABASE_URL the tables are made and loaded without waiting for a request,
    so plan changes reach this worker whether or not it has served anything."""
    url = f"sqlite:///{tmp_path / 'quota.sqlite3'}"
    app = build(QUOTA_DATABASE_URL=url)
    wait_for(lambda: sql_store(app).health().loaded, 10.0, "the first load")
    engine = create_engine(url)
    assert inspect(engine).has_table("quota_plans")
    engine.dispose()
    QuotaAdmin(sql_store(app), actor="t").set_plan_limit("free", "user", "9/minute")
    assert user_quota(app) == 9


def test_an_app_made_by_a_flask_command_starts_nothing(
    build: Callable[..., Flask], tmp_path: Path
) -> None:
    """Inside a `flask ...` command (e.g. `flask db upgrade`) init_app touches no database:
    migrations must find it as it is."""
    url = f"sqlite:///{tmp_path / 'quota.sqlite3'}"
    before = sync_threads()
    with click.Context(click.Command("db")):
        app = build(QUOTA_DATABASE_URL=url)
    time.sleep(0.3)
    assert not (tmp_path / "quota.sqlite3").exists()
    assert sync_threads() - before == set()
    assert user_quota(app) == 3  # a request (e.g. `flask run`) starts it in the background
    wait_for(lambda: sql_store(app).health().loaded, 10.0, "the first load")


@pytest.mark.parametrize(
    ("storage_url", "database", "warns"),
    [
        ("redis://10.0.0.5:6379/0", "sqlite-file", True),
        ("rediss://10.0.0.5:6380/0", "sqlite-memory", True),
        ("redis+sentinel://10.0.0.5:26379/main", "default-existing", True),
        ("redis+cluster://10.0.0.5:7000", "sqlite-file", True),
        ("valkey://10.0.0.5:6379/0", "sqlite-file", True),
        ("valkey+cluster://10.0.0.5:7000", "sqlite-file", True),
        ("redis://10.0.0.5:6379/0", "default-absent", False),  # nothing uses SQL yet
        ("redis://10.0.0.5:6379/0", "postgresql", False),
        ("unix:///run/redis.sock", "sqlite-file", False),  # a local Redis: one server
        ("memory://", "sqlite-file", False),
    ],
)
def test_shared_counters_beside_a_local_sqlite_database_warn_at_start(
    build: Callable[..., Flask],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    storage_url: str,
    database: str,
    warns: bool,
) -> None:
    """Counters shared between servers but plans in a local SQLite file: a warning
    says that changes made on one server stay on that server."""
    config: dict[str, Any] = {"QUOTA_STORAGE_URL": storage_url}
    if database == "sqlite-file":
        config["QUOTA_DATABASE_URL"] = f"sqlite:///{tmp_path / 'q.sqlite3'}"
    elif database == "sqlite-memory":
        config["QUOTA_DATABASE_URL"] = "sqlite://"
    elif database == "postgresql":
        config["QUOTA_DATABASE_URL"] = "postgresql+psycopg2://q@127.0.0.1:1/q"
    elif database == "default-existing":
        (tmp_path / "instance").mkdir()
        (tmp_path / "instance" / DEFAULT_DATABASE_FILE).touch()
    caplog.set_level(logging.WARNING, logger="flask_quota")
    build(**config)
    messages = [r.getMessage() for r in caplog.records if "local SQLite" in r.getMessage()]
    if warns:
        assert len(messages) == 1, caplog.text
        assert "QUOTA_DATABASE_URL" in messages[0]
    else:
        assert messages == []


def test_quota_before_the_hosts_flask_sqlalchemy_starts_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Quota(app, db=db) set up before db.init_app(app): no failure is logged, and the
    first request starts the sync on the host's database."""
    from flask_sqlalchemy import SQLAlchemy

    caplog.set_level(logging.WARNING, logger="flask_quota")
    db = SQLAlchemy()
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'host.sqlite3'}", QUOTA_PLANS=PLANS
    )
    Quota(app, db=db, storage=MemoryStorage())
    db.init_app(app)
    app.add_url_rule("/items", "items", lambda: "items")
    try:
        with app.app_context():
            db.create_all()
        assert user_quota(app) == 3
        wait_for(lambda: sql_store(app).health().loaded, 10.0, "the first load")
        assert "does not answer" not in caplog.text
    finally:
        sql_store(app).close()
        with app.app_context():
            db.engine.dispose()
