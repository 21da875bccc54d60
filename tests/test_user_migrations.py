"""An app with its own models and Flask-Migrate adds the quota tables by autogenerate.

This is the README's flow for ``Quota(app, db=db)``, run exactly as a user runs
it: ``flask db init``, ``flask db migrate``, ``flask db upgrade`` in a project
directory of its own, then ``flask quota plans list``. The migration that
Alembic writes must run as generated, on SQLite, PostgreSQL and MariaDB; and the
app's next ``flask db migrate`` finds nothing to do (docs/databases.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, inspect

from flask_quota.sql.models import copy_tables, metadata
from flask_quota.sql.schema import VERSION_TABLE
from tests.servers import ROOT

APP = """
import os

from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy

from flask_quota import Quota

app = Flask(__name__)
app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["DATABASE_URL"]
db = SQLAlchemy(app)
quota = Quota(app, db=db)


def include_name(name, type_, parent_names):
    # flask-quota's own revision table is flask-quota's business, not this app's.
    return not (type_ == "table" and name == "quota_alembic_version")


Migrate(app, db, include_name=include_name)


class Note(db.Model):
    id = db.Column(db.Integer, primary_key=True)
    text = db.Column(db.String(200), nullable=False)
    created_at = db.Column(db.DateTime(timezone=True))
"""

# The app's next model change (cycle two of the flow).
NOTE_TITLE = """
Note.title = db.Column(db.String(80), nullable=True)
"""


def flask(project: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`flask ...` in the user's project directory, as the user types it."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("QUOTA_", "FLASK_"))},
        "DATABASE_URL": url,
        "FLASK_APP": "app",
        "PYTHONPATH": str(ROOT),  # this checkout's flask_quota; the app is found in cwd
    }
    return subprocess.run(
        [sys.executable, "-m", "flask", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def revisions(project: Path) -> set[Path]:
    """The app's migration files."""
    return set((project / "migrations" / "versions").glob("*.py"))


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_copies_in_a_host_metadata_keep_names_and_use_plain_types() -> None:
    """The tables copied into a host's metadata name every constraint as migration 0001 does."""

    def names(meta: MetaData) -> dict[str, set[str]]:
        return {
            table.name: {str(c.name) for c in table.constraints}
            | {str(i.name) for i in table.indexes}
            for table in meta.sorted_tables
        }

    host = MetaData()
    copy_tables(host)
    assert names(host) == names(metadata)
    assert all("None" not in found for found in names(host).values())
    types = {type(column.type).__module__ for t in host.sorted_tables for column in t.columns}
    assert all(module.startswith("sqlalchemy.") for module in types), types


@pytest.mark.user_flow
def test_the_readme_flow_and_the_apps_next_migrations(tmp_path: Path, database_url: str) -> None:
    """db init / migrate / upgrade create the app's and the quota tables, as generated;
    then quota db upgrade -> migrate (nothing) -> upgrade, then a model change.

    The generated migration describes the models exactly, and ``flask quota db
    upgrade`` adopts the tables it made, stamping its own ``quota_alembic_version``:
    the app's autogenerate must neither drop it nor touch the quota tables, now or
    on the app's next real change. (One flow, not two tests that repeat its first
    half: each step is a ``flask`` process of its own.)
    """
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text(APP)

    ok(flask(project, database_url, "db", "init"))
    ok(flask(project, database_url, "db", "migrate", "-m", "notes and quota tables"))
    [first] = revisions(project)
    assert "quota_plans" in first.read_text()
    ok(flask(project, database_url, "db", "upgrade"))
    assert tables(database_url) >= {"note", "alembic_version", *metadata.tables}
    listed = ok(flask(project, database_url, "quota", "plans", "list"))
    for plan in ("free", "pro", "enterprise"):
        assert plan in listed
    # The generated migration describes the models exactly: nothing left to autogenerate.
    assert "No new upgrade operations detected" in ok(flask(project, database_url, "db", "check"))
    # The packaged migrations take over these tables without a "table exists" conflict.
    assert "stamped" in ok(flask(project, database_url, "quota", "db", "upgrade"))
    assert VERSION_TABLE in tables(database_url)
    assert "(head)" in ok(flask(project, database_url, "quota", "db", "current"))

    # Cycle one again, with no model change: no revision written, nothing to upgrade.
    again = ok(flask(project, database_url, "db", "migrate", "-m", "nothing"))
    assert "No changes in schema detected" in again, again
    assert revisions(project) == {first}
    ok(flask(project, database_url, "db", "upgrade"))

    # Cycle two: the app changes a model; its migration holds that change alone.
    (project / "app.py").write_text(APP + NOTE_TITLE)
    ok(flask(project, database_url, "db", "migrate", "-m", "note title"))
    [second] = revisions(project) - {first}
    upgrade_ops = second.read_text().split("def downgrade")[0]
    assert "title" in upgrade_ops
    assert "quota_" not in upgrade_ops, upgrade_ops
    ok(flask(project, database_url, "db", "upgrade"))
    assert "No new upgrade operations detected" in ok(flask(project, database_url, "db", "check"))
    assert "(head)" in ok(flask(project, database_url, "quota", "db", "current"))
    assert tables(database_url) >= {"note", VERSION_TABLE, *metadata.tables}
    assert "free" in ok(flask(project, database_url, "quota", "plans", "list"))
