"""``flask quota credits grant|show`` on SQLite, PostgreSQL and MariaDB: a grant is a row,
audited, in the balance; bad input exits 1 with one line and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import func, select

from flask_quota import Quota
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.models import CreditGrant
from flask_quota.storage.memory import MemoryStorage
from tests.sqldb import sql_store

PLANS = {"payg": {"user": "100/minute", "resources": {"ai_tokens": "credits"}}}


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    """An app on plan ``payg`` keeping the quota tables in ``database_url``, with one SQL
    client, ``acme``."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True, QUOTA_DATABASE_URL=database_url, QUOTA_PLANS=PLANS,
        QUOTA_DEFAULT_PLAN="payg", QUOTA_ANONYMOUS_PLAN="payg",
    )  # fmt: skip
    Quota(app, storage=MemoryStorage())
    with app.app_context():
        QuotaAdmin(sql_store(app), actor="t").create_client("acme", "payg")
    yield app
    sql_store(app).close()


def cli(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(args=["quota", "credits", *args])
    return result.exit_code, result.output


def grants(app: Flask) -> int:
    with sql_store(app).session() as session:
        return session.scalar(select(func.count()).select_from(CreditGrant)) or 0


def test_grant_and_show(app: Flask) -> None:
    """A grant prints what it did, is audited under --actor, and show lists the balance
    and each grant."""
    code, out = cli(app, "grant", "acme", "500", "--resource", "ai_tokens",
                    "--expires", "2099-01-01", "--note", "welcome", "--actor", "ops")  # fmt: skip
    assert code == 0, out
    assert "granted 500 ai_tokens to client acme until 2099-01-01" in out
    code, out = cli(app, "show", "acme")
    assert code == 0, out
    assert "ai_tokens: balance 500" in out
    assert "welcome" in out and "2099-01-01" in out
    entry = QuotaAdmin(sql_store(app), actor="t").audit_log(1)[0]
    assert (entry.actor, entry.action) == ("ops", "credits.grant")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nobody", "5", "--resource", "ai_tokens"], "no client named 'nobody'"),
        (["acme", "five", "--resource", "ai_tokens"], "UNITS must be a whole number"),
        (["acme", "0", "--resource", "ai_tokens"], "units must be a whole number from 1"),
        (["acme", "5", "--resource", "sms"], "no plan has a credits resource 'sms'"),
        (["acme", "5", "--resource", "ai_tokens", "--expires", "2001-01-01"], "future"),
        (["acme", "5", "--resource", "ai_tokens", "--expires", "soon"], "not a date"),
    ],
)
def test_bad_input_exits_1_with_one_line_and_changes_nothing(
    app: Flask, args: list[str], message: str
) -> None:
    """Each mistake is named on one line; no grant is written."""
    code, out = cli(app, "grant", *args)
    assert code == 1 and message in out and out.count("\n") == 1, out
    assert grants(app) == 0


def test_a_credits_resource_set_with_plans_set_takes_grants_and_is_spent(
    tmp_path: Path, database_url: str
) -> None:
    """On plans kept in SQL, ``flask quota plans set PLAN endpoint credits --resource R``
    makes R a credits resource as it would a rate: R is then grantable, and a view on R
    spends the balance down to a 402."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_DATABASE_URL=database_url)
    quota = Quota(app, storage=MemoryStorage())

    @app.post("/sms")
    @quota.limit(resource="sms")
    def sms() -> str:
        return "sent"

    try:
        with app.app_context():
            _, key = QuotaAdmin(sql_store(app), actor="t").create_client("acme", "free")
        code, out = cli(app, "grant", "acme", "2", "--resource", "sms")
        assert code == 1 and "no plan has a credits resource 'sms'" in out
        made = app.test_cli_runner().invoke(
            args=["quota", "plans", "set", "free", "endpoint", "credits", "--resource", "sms"]
        )
        assert made.exit_code == 0, made.output
        code, out = cli(app, "grant", "acme", "2", "--resource", "sms")
        assert code == 0, out
        http = app.test_client()
        replies = [http.post("/sms", headers={"X-API-Key": key}) for _ in range(3)]
        assert [r.status_code for r in replies] == [200, 200, 402]
        assert replies[2].get_json()["tier"] == "credits"
    finally:
        sql_store(app).close()
