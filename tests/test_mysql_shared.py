"""Several servers on one quota database: they set it up together and share every change.

Written for MariaDB / MySQL, whose DDL commits as it goes (there is no
transaction around ``CREATE TABLE``) and which has no advisory transaction lock,
and run on every database of ``tests/sqldb.py`` so that all of them keep the
same promise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text

from flask_quota.models import SCHEMA_REVISION, PlanRecord, QuotaMeta
from flask_quota.sql_store import VERSION_TABLE
from tests.servers import ROOT
from tests.sqldb import DATABASES, database

PLANS = {"free": {"user": "5/hour"}, "pro": {"user": "50/hour"}, "team": {"user": "500/hour"}}
STARTERS = 4

# One server's first start: build the app, wait for the common go, set up the tables.
STARTER = """
import os, sys, time
from flask import Flask
from flask_quota import Quota

app = Flask("starter")
app.config.update(QUOTA_DATABASE_URL=os.environ["URL"], QUOTA_PLANS=os.environ["PLANS"])
Quota(app)
store = app.extensions["quota"].sql
print("waiting", flush=True)
while not os.path.exists(os.environ["GO"]):
    time.sleep(0.002)
store.ensure_ready()
print("ready", store.version(), flush=True)
store.close()
"""


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test on a SQLite file and on fresh PostgreSQL and MariaDB databases."""
    yield from database(request.param, tmp_path)


def test_servers_starting_together_on_a_fresh_database_set_it_up_once(
    tmp_path: Path, database_url: str
) -> None:
    """Four processes whose first start is the same instant all come up, on one schema:

    the tables made once, the plans seeded once, one version row, one stamped revision.
    """
    go = tmp_path / "go"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("QUOTA_")},
        "URL": database_url,
        "PLANS": json.dumps(PLANS),
        "GO": str(go),
        "PYTHONPATH": str(ROOT),
    }
    starters = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(STARTERS)
    ]
    try:
        for starter in starters:  # every one has imported and built its app
            assert starter.stdout is not None
            assert starter.stdout.readline().strip() == "waiting"
        go.touch()
        results = [starter.communicate(timeout=60) for starter in starters]
    finally:
        for starter in starters:
            if starter.poll() is None:
                starter.kill()
                starter.wait()
    codes = [starter.returncode for starter in starters]
    assert codes == [0] * STARTERS, [err[-2000:] for _, err in results]
    assert [out.split() for out, _ in results] == [["ready", "1"]] * STARTERS

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            names = conn.scalars(select(PlanRecord.name).order_by(PlanRecord.position)).all()
            metas = conn.scalar(select(func.count()).select_from(QuotaMeta))
            stamps = conn.scalars(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    finally:
        engine.dispose()
    assert names == list(PLANS)
    assert metas == 1
    assert stamps == [SCHEMA_REVISION]
