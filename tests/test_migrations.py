"""``migrations/``: `flask quota db upgrade` (and Flask-Migrate's `flask db`) builds the
schema the models describe, on SQLite, PostgreSQL and MariaDB, `downgrade base` removes
it, and both agree with the models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from flask import Flask
from flask_migrate import Migrate, upgrade  # type: ignore[import-untyped]
from sqlalchemy import create_engine, inspect, text

from flask_quota import Quota
from flask_quota.sql.models import SCHEMA_REVISION, metadata
from flask_quota.sql.schema import VERSION_TABLE
from tests.projects import Project
from tests.servers import ROOT

MIGRATIONS = ROOT / "migrations"


def flask_db(directory: Path, url: str, *args: str) -> str:
    """`flask quota db ...` against ``url`` on a fresh app, as a new `flask` process would
    run it, in this process (each process took seconds of imports): the migrations are
    the same files, and Flask-Migrate's `flask db`, which runs them through its ini file,
    is test_models_and_the_migration_head_agree's, in a process of its own."""
    return Project(directory, url).ok("quota", "db", *args)


def quota_tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {t for t in inspect(engine).get_table_names() if t.startswith("quota_")}
    finally:
        engine.dispose()


def differences(url: str) -> list[Any]:
    """What autogenerate would change to make the database match the models."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "version_table": VERSION_TABLE,
                    "include_name": lambda name, type_, _: (
                        type_ != "table" or name.startswith("quota_")
                    ),
                },
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_from_nothing(tmp_path: Path, database_url: str) -> None:
    """`flask db upgrade` on an empty database builds the schema; `downgrade base` drops it."""
    assert quota_tables(database_url) == set()
    flask_db(tmp_path, database_url, "upgrade")
    assert quota_tables(database_url) == set(metadata.tables) | {VERSION_TABLE}
    assert differences(database_url) == []
    assert SCHEMA_REVISION in flask_db(tmp_path, database_url, "current")
    flask_db(tmp_path, database_url, "downgrade", "base")
    assert quota_tables(database_url) == {VERSION_TABLE}  # Alembic's own, now empty
    flask_db(tmp_path, database_url, "upgrade")
    assert quota_tables(database_url) == set(metadata.tables) | {VERSION_TABLE}
    assert differences(database_url) == []


def test_models_and_the_migration_head_agree(tmp_path: Path, database_url: str) -> None:
    """The newest revision is models.SCHEMA_REVISION, and it leaves nothing to autogenerate."""
    config = Config(str(MIGRATIONS / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(config)
    assert script.get_heads() == [SCHEMA_REVISION]
    flask_db(tmp_path, database_url, "upgrade")
    assert differences(database_url) == []
    # Flask-Migrate's own comparison, through env.py and its ini, as an operator runs it.
    check = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", "db", "check"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("QUOTA_")},
            "QUOTA_DATABASE_URL": database_url,
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr
    assert "No new upgrade operations detected" in check.stdout + check.stderr


def test_tables_the_extension_made_are_stamped_at_head(tmp_path: Path, database_url: str) -> None:
    """Tables created on first use record the head revision, so `db upgrade` is a no-op."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_DATABASE_URL"] = database_url
    Quota(app)
    Migrate().init_app(app, directory=str(MIGRATIONS))
    sql = app.extensions["quota"].sql
    try:
        sql.ensure_ready()
        engine = create_engine(database_url)
        with engine.connect() as conn:
            stamped = conn.scalar(text(f"SELECT version_num FROM {VERSION_TABLE}"))
        engine.dispose()
        assert stamped == SCHEMA_REVISION
        with app.app_context():
            upgrade(directory=str(MIGRATIONS))  # nothing to do, and no "table exists" error
        assert differences(database_url) == []
    finally:
        sql.close()


def test_a_0001_database_upgrades_in_place_to_tenants(tmp_path: Path, database_url: str) -> None:
    """A database at 0001 with a plan, a client and its override upgrades to 0002 keeping
    every row; then a tenant, a billing day, a tenant override and a tenant-tier plan
    limit fit, the constraints still refuse nonsense, and downgrade keeps 0001's rows."""
    flask_db(tmp_path, database_url, "upgrade", "0001_quota_tables")
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO quota_plans (id, name, description, position, created_at) "
                "VALUES (1, 'pro', '', 0, '2026-01-01 00:00:00')"
            )
            conn.exec_driver_sql(
                "INSERT INTO quota_clients (id, name, plan_id, key_prefix, key_salt, key_hash, "
                "created_at) VALUES (7, 'acme-bot', 1, 'fq_abc', 's', 'h', '2026-01-01 00:00:00')"
            )
            conn.exec_driver_sql(
                "INSERT INTO quota_overrides (id, client_id, tier, resource, rate, created_at) "
                "VALUES (3, 7, 'user', '', '9/minute', '2026-01-01 00:00:00')"
            )
        flask_db(tmp_path, database_url, "upgrade")
        assert differences(database_url) == []
        with engine.begin() as conn:
            assert conn.exec_driver_sql(
                "SELECT name, tenant, billing_day FROM quota_clients"
            ).all() == [("acme-bot", None, None)]
            assert conn.exec_driver_sql(
                "SELECT client_id, tenant, rate FROM quota_overrides"
            ).all() == [(7, None, "9/minute")]
            conn.execute(text("UPDATE quota_clients SET tenant = 'acme', billing_day = 15"))
            conn.exec_driver_sql(
                "INSERT INTO quota_overrides (id, tenant, tier, resource, rate, created_at) "
                "VALUES (4, 'acme', 'tenant', '', '50/minute', '2026-01-01 00:00:00')"
            )
            conn.exec_driver_sql(
                "INSERT INTO quota_plan_limits (plan_id, tier, resource, rate, shadow) "
                "VALUES (1, 'tenant', '', '500/minute', false)"
            )
        refused = [
            "UPDATE quota_clients SET billing_day = 32",
            "INSERT INTO quota_overrides (id, client_id, tenant, tier, resource, rate, "
            "created_at) VALUES (5, 7, 'acme', 'global', '', '1/second', '2026-01-01')",
            "INSERT INTO quota_overrides (id, tier, resource, rate, created_at) "
            "VALUES (6, 'global', '', '1/second', '2026-01-01')",
            "INSERT INTO quota_plan_limits (plan_id, tier, resource, rate, shadow) "
            "VALUES (1, 'nonsense', '', '1/second', false)",
        ]
        for statement in refused:
            with pytest.raises(Exception), engine.begin() as conn:  # noqa: B017 (any driver's)
                conn.execute(text(statement))
        flask_db(tmp_path, database_url, "downgrade", "0001_quota_tables")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, rate FROM quota_overrides")).all() == [
                (3, "9/minute")
            ]
            assert conn.execute(text("SELECT name FROM quota_clients")).all() == [("acme-bot",)]
    finally:
        engine.dispose()


def test_a_0002_database_upgrades_in_place_to_concurrency_and_units(
    tmp_path: Path, database_url: str
) -> None:
    """A database at 0002 with a plan and its limits upgrades to 0003 keeping every row
    (no bound, no unit); then a plan's concurrency and a resource's unit fit, a bound
    below 1 and a unit on the user tier are refused, and downgrade keeps 0002's rows."""
    flask_db(tmp_path, database_url, "upgrade", "0002_tenants")
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO quota_plans (id, name, description, position, created_at) "
                "VALUES (1, 'pro', '', 0, '2026-01-01 00:00:00')"
            )
            conn.exec_driver_sql(
                "INSERT INTO quota_plan_limits (id, plan_id, tier, resource, rate, shadow) "
                "VALUES (1, 1, 'user', '', '100/minute', false), "
                "(2, 1, 'endpoint', 'ai_tokens', '2000/hour', false)"
            )
        flask_db(tmp_path, database_url, "upgrade")
        assert differences(database_url) == []
        with engine.begin() as conn:
            assert conn.execute(text("SELECT name, concurrent FROM quota_plans")).all() == [
                ("pro", None)
            ]
            assert conn.exec_driver_sql(
                "SELECT resource, rate, unit FROM quota_plan_limits ORDER BY id"
            ).all() == [("", "100/minute", None), ("ai_tokens", "2000/hour", None)]
            conn.execute(text("UPDATE quota_plans SET concurrent = 4"))
            conn.execute(text("UPDATE quota_plan_limits SET unit = 'tokens' WHERE id = 2"))
        refused = [
            "UPDATE quota_plans SET concurrent = 0",
            "UPDATE quota_plan_limits SET unit = 'tokens' WHERE id = 1",
        ]
        for statement in refused:
            with pytest.raises(Exception), engine.begin() as conn:  # noqa: B017 (any driver's)
                conn.execute(text(statement))
        flask_db(tmp_path, database_url, "downgrade", "0002_tenants")
        assert "concurrent" not in {c["name"] for c in inspect(engine).get_columns("quota_plans")}
        assert "unit" not in {c["name"] for c in inspect(engine).get_columns("quota_plan_limits")}
        with engine.begin() as conn:
            assert conn.execute(text("SELECT name FROM quota_plans")).all() == [("pro",)]
            assert conn.exec_driver_sql(
                "SELECT resource, rate FROM quota_plan_limits ORDER BY id"
            ).all() == [("", "100/minute"), ("ai_tokens", "2000/hour")]
    finally:
        engine.dispose()
