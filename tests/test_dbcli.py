"""``flask quota db``: the packaged migrations, run on the database the quota extension uses.

Every command runs on a fresh app, as a new process would, on a SQLite file and
on PostgreSQL (tests/test_wheel.py runs them in real processes from the
installed wheel). Tables made by the migrations, by the extension on first use,
or by the host never conflict: ``upgrade`` on any of them succeeds and ends at
the head revision.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flask_quota.sql.models import SCHEMA_REVISION, metadata
from flask_quota.sql.schema import VERSION_TABLE
from tests.projects import Project

QUOTA_TABLES = set(metadata.tables)


@pytest.fixture
def project(tmp_path: Path, database_url: str) -> Project:
    """An app keeping the quota tables in its own database (QUOTA_DATABASE_URL)."""
    return Project(tmp_path, database_url)


def test_upgrade_builds_the_schema_and_the_app_then_uses_it(project: Project) -> None:
    """`db upgrade` makes the tables at the head; first use seeds plans into them."""
    assert "no revision" in project.ok("quota", "db", "current")
    assert project.ok("quota", "db", "upgrade") == f"quota tables created at {SCHEMA_REVISION}\n"
    assert project.tables() == QUOTA_TABLES | {VERSION_TABLE}
    assert f"{SCHEMA_REVISION} (head)" in project.ok("quota", "db", "current")
    assert "free" in project.ok("quota", "plans", "list")  # seeded on first use
    project.ok("quota", "db", "upgrade")  # again: nothing to do
    assert f"{SCHEMA_REVISION} (head)" in project.ok("quota", "db", "current")


def test_upgrade_says_what_it_did_in_one_line_and_is_quiet_unless_asked(
    project: Project,
) -> None:
    """`db upgrade` prints one line on stdout (created / upgraded from / already at) and
    none of Alembic's INFO lines; `-v` adds those on stderr."""
    first = project.run("quota", "db", "upgrade", "-v")
    assert first.code == 0, first.output
    assert first.stdout == f"quota tables created at {SCHEMA_REVISION}\n"
    assert "Running upgrade  -> 0001_quota_tables" in first.stderr  # each revision in turn
    assert "Running upgrade 0001_quota_tables -> 0002_tenants" in first.stderr
    assert "Running upgrade 0002_tenants -> 0003_concurrency_units" in first.stderr
    assert "Running upgrade 0003_concurrency_units -> 0004_ledger_webhooks" in first.stderr
    assert "Running upgrade 0004_ledger_webhooks -> 0005_networks" in first.stderr
    assert f"Running upgrade 0005_networks -> {SCHEMA_REVISION}" in first.stderr
    again = project.run("quota", "db", "upgrade")
    assert again.code == 0 and again.stderr == "", again.output
    assert again.stdout == f"quota tables already at {SCHEMA_REVISION}; nothing to do\n"
    down = project.run("quota", "db", "downgrade", "base")
    assert down.code == 0 and "INFO" not in down.output, down.output
    assert down.stdout == f"quota tables dropped (downgraded to base from {SCHEMA_REVISION})\n"


def test_upgrade_after_create_on_first_use_is_a_no_op(project: Project) -> None:
    """Tables the extension made itself are stamped: `db upgrade` finds nothing to do."""
    assert "free" in project.ok("quota", "plans", "list")  # creates and stamps the tables
    out = project.ok("quota", "db", "upgrade")
    assert "Running upgrade" not in out and "stamped" not in out
    assert f"{SCHEMA_REVISION} (head)" in project.ok("quota", "db", "current")


def test_downgrade_base_drops_only_the_quota_tables(project: Project) -> None:
    """`db downgrade base` removes our tables and leaves the host's alone; upgrade restores."""
    project.execute("CREATE TABLE note (id INTEGER PRIMARY KEY)")
    project.ok("quota", "db", "upgrade")
    project.ok("quota", "db", "downgrade", "base")
    assert project.tables() == {"note", VERSION_TABLE}
    assert "no revision" in project.ok("quota", "db", "current")
    project.ok("quota", "db", "upgrade")
    assert project.tables() == {"note", VERSION_TABLE} | QUOTA_TABLES


def test_tables_without_a_revision_that_differ_are_refused(tmp_path: Path) -> None:
    """Unversioned tables unlike the models: a one-line error, nothing stamped or changed."""
    project = Project(tmp_path, f"sqlite:///{tmp_path / 'q.sqlite3'}")
    project.ok("quota", "db", "upgrade")
    project.ok("quota", "db", "downgrade", "base")
    project.execute("CREATE TABLE quota_meta (id INTEGER PRIMARY KEY, other INTEGER)")
    result = project.run("quota", "db", "upgrade")
    assert result.code == 1
    assert "Error: the quota tables exist without a migration revision" in result.output
    assert "no revision" in project.ok("quota", "db", "current")


def test_bad_revision_is_a_one_line_error(tmp_path: Path) -> None:
    """An unknown revision exits 1 with Alembic's message, no traceback."""
    project = Project(tmp_path, f"sqlite:///{tmp_path / 'q.sqlite3'}")
    result = project.run("quota", "db", "upgrade", "no_such_revision")
    assert result.code == 1
    assert result.output.strip().splitlines()[-1] == (
        "Error: Can't locate revision identified by 'no_such_revision'"
    )


def test_host_db_gets_the_tables_and_create_all_tables_are_adopted(
    tmp_path: Path, database_url: str
) -> None:
    """With Quota(app, db=db) the commands use db's database; create_all() tables are stamped."""
    host = Project(tmp_path, database_url, host_db=True)
    host.ok("quota", "db", "upgrade")
    assert host.tables() == QUOTA_TABLES | {VERSION_TABLE}
    host.ok("quota", "db", "downgrade", "base")
    host.execute(f"DROP TABLE {VERSION_TABLE}")

    host.create_all()
    assert host.tables() == QUOTA_TABLES
    assert "they match" in host.ok("quota", "db", "upgrade")
    assert f"{SCHEMA_REVISION} (head)" in host.ok("quota", "db", "current")
    assert "enterprise" in host.ok("quota", "plans", "list")
