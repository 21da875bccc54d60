"""``flask quota db``: the packaged migrations, run on the database the quota extension uses.

Every command runs in a subprocess, as an operator types it, against a small app
written to a temporary directory, on a SQLite file and on PostgreSQL. Tables
made by the migrations, by the extension on first use, or by the host never
conflict: ``upgrade`` on any of them succeeds and ends at the head revision.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from flask_quota.models import SCHEMA_REVISION, metadata
from flask_quota.sql_store import VERSION_TABLE
from tests.servers import ROOT
from tests.sqldb import DATABASES, database

OWN_DATABASE = """
import os
from flask import Flask
from flask_quota import Quota

app = Flask(__name__, instance_path=os.environ["INSTANCE"])
app.config["QUOTA_DATABASE_URL"] = os.environ["DATABASE_URL"]
quota = Quota(app)
"""

HOST_DB = """
import os
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from flask_quota import Quota

app = Flask(__name__, instance_path=os.environ["INSTANCE"])
app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["DATABASE_URL"]
db = SQLAlchemy(app)
quota = Quota(app, db=db)
"""

QUOTA_TABLES = set(metadata.tables)


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test on a SQLite file and on a fresh PostgreSQL database."""
    yield from database(request.param, tmp_path)


class Project:
    """An app in a directory of its own, and the `flask` command run there."""

    def __init__(self, directory: Path, source: str, url: str) -> None:
        directory.mkdir()
        (directory / "app.py").write_text(source)
        self.directory = directory
        self.url = url

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("QUOTA_", "FLASK_"))},
            "DATABASE_URL": self.url,
            "INSTANCE": str(self.directory / "instance"),
            "FLASK_APP": "app",
            "PYTHONPATH": str(ROOT),
        }
        return subprocess.run(
            [sys.executable, "-m", "flask", *args],
            cwd=self.directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
        return result.stdout + result.stderr

    def python(self, code: str) -> None:
        """Python code with the app importable, e.g. the host's own ``db.create_all()``."""
        env = {**os.environ, "DATABASE_URL": self.url, "INSTANCE": str(self.directory / "instance")}
        env["PYTHONPATH"] = os.pathsep.join([str(self.directory), str(ROOT)])
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)

    def tables(self) -> set[str]:
        engine = create_engine(self.url)
        try:
            return set(inspect(engine).get_table_names())
        finally:
            engine.dispose()

    def execute(self, sql: str) -> None:
        engine = create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(text(sql))
        finally:
            engine.dispose()


@pytest.fixture
def project(tmp_path: Path, database_url: str) -> Project:
    """An app keeping the quota tables in its own database (QUOTA_DATABASE_URL)."""
    return Project(tmp_path / "own", OWN_DATABASE, database_url)


def test_upgrade_builds_the_schema_and_the_app_then_uses_it(project: Project) -> None:
    """`db upgrade` makes the tables at the head; first use seeds plans into them."""
    assert "no revision" in project.ok("quota", "db", "current")
    project.ok("quota", "db", "upgrade")
    assert project.tables() == QUOTA_TABLES | {VERSION_TABLE}
    assert f"{SCHEMA_REVISION} (head)" in project.ok("quota", "db", "current")
    assert "free" in project.ok("quota", "plans", "list")  # seeded on first use
    project.ok("quota", "db", "upgrade")  # again: nothing to do
    assert f"{SCHEMA_REVISION} (head)" in project.ok("quota", "db", "current")


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
    project = Project(tmp_path / "own", OWN_DATABASE, f"sqlite:///{tmp_path / 'q.sqlite3'}")
    project.ok("quota", "db", "upgrade")
    project.ok("quota", "db", "downgrade", "base")
    project.execute("CREATE TABLE quota_meta (id INTEGER PRIMARY KEY, other INTEGER)")
    result = project.run("quota", "db", "upgrade")
    assert result.returncode == 1
    assert "Error: the quota tables exist without a migration revision" in result.stderr
    assert "Traceback" not in result.stderr
    assert "no revision" in project.ok("quota", "db", "current")


def test_bad_revision_is_a_one_line_error(tmp_path: Path) -> None:
    """An unknown revision exits 1 with Alembic's message, no traceback."""
    project = Project(tmp_path / "own", OWN_DATABASE, f"sqlite:///{tmp_path / 'q.sqlite3'}")
    result = project.run("quota", "db", "upgrade", "no_such_revision")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error:") and "no_such_revision" in last
    assert "Traceback" not in result.stderr


def test_host_db_gets_the_tables_and_create_all_tables_are_adopted(
    tmp_path: Path, database_url: str
) -> None:
    """With Quota(app, db=db) the commands use db's database; create_all() tables are stamped."""
    host = Project(tmp_path / "host", HOST_DB, database_url)
    host.ok("quota", "db", "upgrade")
    assert host.tables() == QUOTA_TABLES | {VERSION_TABLE}
    host.ok("quota", "db", "downgrade", "base")
    host.execute(f"DROP TABLE {VERSION_TABLE}")

    host.python("from app import app, db\nwith app.app_context(): db.create_all()")
    assert host.tables() == QUOTA_TABLES
    assert "they match" in host.ok("quota", "db", "upgrade")
    assert f"{SCHEMA_REVISION} (head)" in host.ok("quota", "db", "current")
    assert "enterprise" in host.ok("quota", "plans", "list")
