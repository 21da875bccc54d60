"""Who owns the plans: QUOTA_PLANS_SOURCE, the start-up drift warning, export and import."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.core.plans import plans_config
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.plansync import sql_plans
from flask_quota.testing import MemoryStorage
from tests.dashboards import HASH, OPS, csrf_from

OLD = {"free": {"user": "3/minute"}, "pro": {"user": "50/minute"}}
NEW = {
    "free": {"user": {"rate": "7/minute", "algorithm": "fixed_window"}},
    "team": {"user": "70/minute", "resources": {"search": {"rate": "9/hour", "shadow": True}}},
}


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Start an app on one SQLite file, as a process would; closed at the end."""
    apps: list[Flask] = []

    def make(plans: dict[str, Any], **config: Any) -> Flask:
        app = Flask(__name__, instance_path=str(tmp_path / "instance"))
        app.secret_key = "test"
        app.config.update(
            TESTING=True,
            QUOTA_PLANS=plans,
            QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'quota.sqlite3'}",
            **config,
        )
        Quota(app, storage=MemoryStorage())

        @app.get("/items")
        def items() -> str:
            return "ok"

        sql = app.extensions["quota"].sql
        assert sql.wait_loaded(10), "the SQL snapshot did not load"
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["quota"].sql.close()


def user_policy(app: Flask) -> str:
    return app.test_client().get("/items").headers["RateLimit-Policy"]


def test_database_source_keeps_sql_and_warns_about_each_difference(
    start: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """QUOTA_PLANS edited between two starts (issue 10): with the default source the old
    plan is served, and one warning names QUOTA_PLANS, QUOTA_PLANS_SOURCE and every drift."""
    first = start(OLD)
    assert '"user";q=3;w=60' in user_policy(first)
    first.extensions["quota"].sql.close()
    with caplog.at_level(logging.WARNING, logger="flask_quota"):
        second = start(NEW)
    assert '"user";q=3;w=60' in user_policy(second)  # SQL wins
    warnings = [
        r.getMessage() for r in caplog.records if "differ from QUOTA_PLANS" in r.getMessage()
    ]
    assert len(warnings) == 1
    text = warnings[0]
    for part in (
        "QUOTA_PLANS_SOURCE=config",
        "plan 'team' is in QUOTA_PLANS but not in the database",
        "plan 'pro' is in the database but not in QUOTA_PLANS",
        "plan 'free' user: rate 7/minute in QUOTA_PLANS, 3/minute in the database",
        "plan 'free' user: algorithm fixed_window in QUOTA_PLANS, default in the database",
    ):
        assert part in text


def test_config_source_applies_quota_plans_at_every_start(
    start: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With QUOTA_PLANS_SOURCE=config the new rate is served: plans are added, changed
    and removed to match QUOTA_PLANS, audited as actor "config", and nothing is warned."""
    first = start(OLD)
    first.extensions["quota"].sql.close()
    with caplog.at_level(logging.WARNING, logger="flask_quota"):
        second = start(NEW, QUOTA_PLANS_SOURCE="config")
    assert '"user";q=7;w=60' in user_policy(second)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    store = second.extensions["quota"].sql
    assert plans_config(sql_plans(store)) == NEW
    audit = {(e.actor, e.action, e.target) for e in QuotaAdmin(store, actor="t").audit_log()}
    assert audit == {
        ("config", "plans.config.add", "plan:team"),
        ("config", "plans.config.update", "plan:free"),
        ("config", "plans.config.remove", "plan:pro"),
    }
    second.extensions["quota"].sql.close()
    third = start(NEW, QUOTA_PLANS_SOURCE="config")  # nothing to change: no new entries
    assert len(QuotaAdmin(third.extensions["quota"].sql, actor="t").audit_log()) == 3


def test_config_source_cannot_remove_a_plan_clients_use(
    start: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A plan that clients still use is not removed: nothing changes and the error says why."""
    first = start(OLD)
    QuotaAdmin(first.extensions["quota"].sql, actor="t").create_client("acme", "pro")
    first.extensions["quota"].sql.close()
    with caplog.at_level(logging.ERROR, logger="flask_quota"):
        second = start(NEW, QUOTA_PLANS_SOURCE="config")
    assert any("'pro' (1 clients)" in r.getMessage() for r in caplog.records)
    assert plans_config(sql_plans(second.extensions["quota"].sql)) == OLD


def test_config_source_refuses_plan_edits_in_the_cli_and_dashboard(start: Any) -> None:
    """Plans owned by QUOTA_PLANS are read-only: the CLI exits 1 and the dashboard
    shows why and answers 403 to an edit; nothing changes."""
    app = start(OLD, QUOTA_PLANS_SOURCE="config", QUOTA_DASHBOARD_URL="/quota",
                QUOTA_DASHBOARD_USERS={"ops": HASH})  # fmt: skip
    result = app.test_cli_runner().invoke(args=["quota", "plans", "set", "free", "user", "9/hour"])
    assert result.exit_code == 1 and "QUOTA_PLANS_SOURCE=config" in result.output
    http = app.test_client()
    page = http.get("/quota/plans", headers=OPS).get_data(as_text=True)
    assert 'id="plans-read-only"' in page and "QUOTA_PLANS_SOURCE=config" in page
    assert 'name="rate"' not in page
    token = csrf_from(http, "/quota/clients")
    response = http.post(
        "/quota/plans/free/limit",
        headers=OPS,
        data={"csrf_token": token, "tier": "user", "rate": "9/hour"},
    )
    assert response.status_code == 403
    assert plans_config(sql_plans(app.extensions["quota"].sql)) == OLD


def test_export_then_import_on_a_fresh_database_gives_identical_plans(
    tmp_path: Path, start: Any
) -> None:
    """`plans export FILE` then `plans import FILE` on a fresh database: identical plans
    (algorithms and shadow flags included), audited."""
    source = start(NEW)
    runner = source.test_cli_runner()
    runner.invoke(args=["quota", "plans", "set", "free", "global", "20/second", "--shadow"])
    exported = tmp_path / "plans.json"
    result = runner.invoke(args=["quota", "plans", "export", str(exported)])
    assert result.exit_code == 0, result.output
    stdout = runner.invoke(args=["quota", "plans", "export"]).output
    assert json.loads(stdout) == json.loads(exported.read_text())
    before = sql_plans(source.extensions["quota"].sql)

    fresh = Flask(__name__, instance_path=str(tmp_path / "other"))
    fresh.config.update(QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
    Quota(fresh, storage=MemoryStorage())
    try:
        result = fresh.test_cli_runner().invoke(
            args=["quota", "plans", "import", str(exported), "--actor", "alice"]
        )
        assert result.exit_code == 0, result.output
        store = fresh.extensions["quota"].sql
        assert sql_plans(store) == before
        actions = {(e.actor, e.action) for e in QuotaAdmin(store, actor="t").audit_log()}
        assert ("alice", "plans.import.add") in actions
    finally:
        fresh.extensions["quota"].sql.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"free": {"user": "lots"}}', "plans file['free']['user']: malformed rate 'lots'"),
        ('{"free": {"user": {"rate": "1/hour", "algorithm": "x"}}}', "['algorithm']='x'"),
        ('{"free": {"resources": {"no spaces!": "1/hour"}}}', "resource 'no spaces!'"),
        ('{" free": {"user": "1/hour"}}', "plan name ' free'"),
    ],
)
def test_import_validates_everything_before_writing(
    tmp_path: Path, start: Any, content: str, message: str
) -> None:
    """A bad plans file changes nothing and says what is wrong."""
    app = start(OLD)
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = app.test_cli_runner().invoke(args=["quota", "plans", "import", str(bad)])
    assert result.exit_code == 1 and message in result.output, result.output
    assert plans_config(sql_plans(app.extensions["quota"].sql)) == OLD


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({}, "QUOTA_DEFAULT_PLAN and QUOTA_ANONYMOUS_PLAN"),
        ({"QUOTA_DEFAULT_PLAN": "pro"}, "QUOTA_ANONYMOUS_PLAN"),
    ],
)
def test_import_without_a_plan_the_config_names_changes_nothing(
    tmp_path: Path, start: Any, config: dict[str, str], key: str
) -> None:
    """Must show: importing a file without the plan that is QUOTA_DEFAULT_PLAN (or
    QUOTA_ANONYMOUS_PLAN) exits non-zero, names the key, and changes nothing: `free`
    is still there and anonymous callers still get it."""
    app = start(OLD, **config)
    only_pro = tmp_path / "pro.json"
    only_pro.write_text(json.dumps({"pro": {"user": "60/minute"}, "team": {"user": "9/minute"}}))
    result = app.test_cli_runner().invoke(args=["quota", "plans", "import", str(only_pro)])
    assert result.exit_code == 1, result.output
    assert f"lack plan 'free', which is {key}" in result.output
    assert plans_config(sql_plans(app.extensions["quota"].sql)) == OLD
    assert user_policy(app) == '"user";q=3;w=60'
    assert QuotaAdmin(app.extensions["quota"].sql, actor="t").audit_log() == []


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ('{"free": {"user": "1/hour"}, "free": {"user": "9/hour"}, "pro": {}}', "'free'"),
        ('{"free": {"user": "1/hour", "user": "9/hour"}, "pro": {}}', "'user'"),
        ('{"free": {"resources": {"a": "1/hour", "a": "2/hour"}}, "pro": {}}', "'a'"),
    ],
)
def test_import_refuses_a_key_given_twice(
    tmp_path: Path, start: Any, content: str, key: str
) -> None:
    """A JSON object with a duplicate key is refused naming the key, at any depth,
    instead of silently keeping the last value."""
    app = start(OLD)
    bad = tmp_path / "twice.json"
    bad.write_text(content)
    result = app.test_cli_runner().invoke(args=["quota", "plans", "import", str(bad)])
    assert result.exit_code == 1, result.output
    assert f"the plans file has the key {key} twice" in result.output
    assert plans_config(sql_plans(app.extensions["quota"].sql)) == OLD
