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
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text

from flask_quota.sql.models import SCHEMA_REVISION, PlanRecord, QuotaMeta
from flask_quota.sql.schema import VERSION_TABLE
from tests.demo import flask_quota, probe
from tests.servers import ROOT, Gunicorn

OLD, NEW = 100_000, 66_666  # user-tier rates per minute: high enough never to deny
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
            line = starter.stdout.readline().strip()
            if line != "waiting":  # it died before its app was built: say why
                starter.wait(timeout=30)
                assert starter.stderr is not None
                raise AssertionError(f"a starter said {line!r}: {starter.stderr.read()[-3000:]}")
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


@pytest.mark.slow
def test_two_servers_on_one_database_both_apply_a_change_within_two_seconds(
    tmp_path: Path, database_url: str
) -> None:
    """Two gunicorn servers (each its own app) share one quota database: a client made
    by the CLI is known to both, and a plan change reaches both within 2 s."""
    env = {
        "QUOTA_DATABASE_URL": database_url,
        "QUOTA_PLANS": json.dumps({"free": {"global": "100000/second", "user": f"{OLD}/minute"}}),
        "PYTHONPATH": str(ROOT),
        "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
    }
    made = flask_quota(env, "clients", "create", "probe", "--plan", "free")
    key = made.split("API key: ")[1].split()[0]
    servers = [Gunicorn(env, workers=1)]
    try:
        servers.append(Gunicorn(env, workers=1))
        deadline = time.monotonic() + 60  # a fresh worker loads its snapshot in the background
        for server in servers:
            while (sample := probe(server.port, key)) is None or sample[2] != OLD:
                assert time.monotonic() < deadline, f"server {server.port} never served the key"
                time.sleep(0.05)
        flask_quota(env, "plans", "set", "free", "user", f"{NEW}/minute", "--actor", "ci")
        # Committed before the command returned: requests from 2 s later get the new rate.
        cutoff = time.time() + 2.0
        seen: list[tuple[int, float, int]] = []
        while time.time() < cutoff + 0.5:
            for server in servers:
                sample = probe(server.port, key)
                if sample is not None:
                    seen.append((server.port, sample[0], sample[2]))
            time.sleep(0.02)
    finally:
        for server in servers:
            server.stop()
    late = [
        (port, started - cutoff + 2.0, q)
        for port, started, q in seen
        if started > cutoff and q != NEW
    ]
    assert late == [], f"old rate served more than 2 s after the change: {late[:5]}"
    assert {port for port, started, q in seen if started > cutoff and q == NEW} == {
        server.port for server in servers
    }
