"""Plan names are URL path segments on the dashboard: names a browser rewrites (``/``,
``.`` and ``..`` segments, percent signs, blanks) are refused wherever a plan is named,
and plans named so by an earlier release keep working."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import create_engine, text

from flask_quota import Quota
from flask_quota.core.validators import plan_name
from flask_quota.sql.admin import AdminError, QuotaAdmin
from flask_quota.sql.plansync import sql_plans
from flask_quota.testing import MemoryStorage
from tests.dashboards import HASH, OPS, csrf_from, dashboard_app
from tests.sqldb import sql_store

PLANS = {"free": {"user": "5/hour"}, "pro": {"user": "50/hour"}}
UNSAFE = ["/team", "x/../team", "..", ".", "team/", "a b", "%2e%2e", "te#am", "t?x", "zz\\"]


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'q.sqlite3'}"
    )
    Quota(app, storage=MemoryStorage())
    app.add_url_rule("/items", "items", lambda: "items")
    yield app
    sql_store(app).close()


def names(app: Flask) -> list[str]:
    return [plan.name for plan in sql_plans(sql_store(app))]


@pytest.mark.parametrize("name", UNSAFE)
def test_the_validator_refuses_names_a_url_would_rewrite(name: str) -> None:
    """`/`, `.`/`..` segments, `%`, blanks, `#`, `?` and `\\` are refused with the rule."""
    with pytest.raises(ValueError, match="dashboard's URLs") as error:
        plan_name(name)
    assert "not '.' or '..'" in str(error.value)


def test_safe_names_still_pass() -> None:
    """Letters, digits, `_`, `-` and dots inside a name (e.g. a version) stay valid."""
    for name in ("free", "pro-2", "team_v1.2", "...x", "A" * 64):
        assert plan_name(name) == name


@pytest.mark.parametrize("name", ["/team", "x/../team", "..", "."])
def test_cli_plans_create_refuses_them_and_changes_nothing(app: Flask, name: str) -> None:
    """Must show: `flask quota plans create /team` (and `x/../team`, `..`) exits non-zero
    with the rule, and no plan or audit entry is added."""
    result = app.test_cli_runner().invoke(args=["quota", "plans", "create", name])
    assert result.exit_code == 1, result.output
    assert f"plan name {name!r} must be" in result.output
    assert names(app) == ["free", "pro"]
    assert QuotaAdmin(sql_store(app), actor="t").audit_log() == []


def test_plans_import_refuses_them(app: Flask, tmp_path: Path) -> None:
    """A plans file naming `x/../team` is refused whole: nothing changes."""
    bad = tmp_path / "plans.json"
    bad.write_text(json.dumps({**PLANS, "x/../team": {"user": "9/hour"}}))
    result = app.test_cli_runner().invoke(args=["quota", "plans", "import", str(bad)])
    assert result.exit_code == 1 and "plan name 'x/../team' must be" in result.output
    assert names(app) == ["free", "pro"]


def test_quota_plans_with_such_a_name_fails_at_init_app(tmp_path: Path) -> None:
    """`QUOTA_PLANS` naming `/team` fails at init_app with a message naming the key,
    not later when the first seed fails in the background."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(QUOTA_PLANS={"free": {"user": "5/hour"}, "/team": {"user": "9/hour"}})
    with pytest.raises(ValueError, match=r"QUOTA_PLANS: plan name '/team' must be"):
        Quota(app, storage=MemoryStorage())


def test_the_dashboard_refuses_them(tmp_path: Path) -> None:
    """The dashboard's New plan form goes through the same rule: 400, nothing created."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH})
    try:
        http = app.test_client()
        token = csrf_from(http, "/quota/plans")
        for name in ("/zz", "x/../team", ".."):
            response = http.post(
                "/quota/plans/new", headers=OPS, data={"csrf_token": token, "name": name}
            )
            assert response.status_code == 400
            assert "dashboard&#39;s URLs" in response.get_data(as_text=True)
        assert names(app) == ["free"]
    finally:
        sql_store(app).close()


def test_a_database_holding_such_a_name_keeps_working(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plan named `x/../team` by an earlier release (here by hand) loads at the next
    start and limits its clients; start-up warns how to replace it; the CLI can still
    edit and delete it, and nothing can create another such name."""
    url = f"sqlite:///{tmp_path / 'q.sqlite3'}"

    def start() -> Flask:
        app = Flask(__name__, instance_path=str(tmp_path / "instance"))
        app.config.update(TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=url)
        Quota(app, storage=MemoryStorage())
        app.add_url_rule("/items", "items", lambda: "items")
        return app

    first = start()
    sql_store(first).ensure_ready()
    sql_store(first).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO quota_plans (name, description, position, created_at) "
                "VALUES (:n, '', 5, CURRENT_TIMESTAMP)"
            ),
            {"n": "x/../team"},
        )
    engine.dispose()
    app = start()
    sql = sql_store(app)
    try:
        with caplog.at_level(logging.WARNING, logger="flask_quota"):
            sql.start()
            assert sql.wait_loaded(10)
        assert any("x/../team" in r.getMessage() and "plans delete" in r.getMessage()
                   for r in caplog.records), caplog.text  # fmt: skip
        admin = QuotaAdmin(sql, actor="ops")
        admin.set_plan_limit("x/../team", "user", "2/hour")
        client, key = admin.create_client("acme", "x/../team")
        http = app.test_client()
        codes = [http.get("/items", headers={"X-API-Key": key}).status_code for _ in range(3)]
        assert codes == [200, 200, 429]  # its 2/hour applies
        runner = app.test_cli_runner()
        listing = runner.invoke(args=["quota", "plans", "list"])
        assert listing.exit_code == 0 and "x/../team" in listing.output
        admin.set_client_plan(client.id, "pro")
        deleted = runner.invoke(args=["quota", "plans", "delete", "x/../team", "--actor", "ops"])
        assert deleted.exit_code == 0, deleted.output
        assert names(app) == ["free", "pro"]
        with pytest.raises(AdminError, match="must be"):
            admin.create_plan("x/../team")
    finally:
        sql.close()
