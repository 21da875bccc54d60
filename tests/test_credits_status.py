"""Prepaid credits on the status endpoint (issue 41): an identified caller reads its
balances and the grants that still count; an anonymous caller gets an empty list; an
app where no plan sells credits answers as before (no ``credits`` key). On memory and
on a real redis-server."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request
from flask.testing import FlaskClient

from flask_quota import Identity, Quota
from flask_quota.sql.models import CreditGrant
from flask_quota.testing import FrozenClock, test_storage
from tests.sqldb import sql_store

PLANS = {
    "payg": {
        "user": "1000/minute",
        "resources": {"ai_tokens": {"rate": "credits", "unit": "tokens"}, "sms": "credits"},
    },
    "free": {"user": "10/minute"},
}


@pytest.fixture(params=["memory", "redis"])
def storage_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    server = request.getfixturevalue("redis_server")
    server.client().flushall()
    return str(server.url)


def status_app(
    tmp_path: Path, url: str, close_sql: Callable[[Flask], Flask], plans: dict[str, Any] = PLANS
) -> tuple[Flask, Quota, FlaskClient]:
    """Callers name themselves in ``X-Client`` (none: anonymous); ``POST /chat?cost=N``
    spends ``ai_tokens``; the status at /rate_limit."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True, QUOTA_PLANS=plans, QUOTA_DEFAULT_PLAN="payg", QUOTA_ANONYMOUS_PLAN="free",
        QUOTA_STATUS_URL="/rate_limit",
    )  # fmt: skip
    quota = Quota(app, storage=test_storage(url, FrozenClock(datetime.now(UTC).timestamp())))
    close_sql(app)

    @quota.identity_loader
    def caller() -> Identity | None:
        name = request.headers.get("X-Client")
        return Identity(name, "payg") if name else None

    @app.post("/chat")
    @quota.limit(resource="ai_tokens", cost=lambda: int(request.args.get("cost", "1")))
    def chat() -> str:
        return "ok"

    return app, quota, app.test_client()


def credits_of(http: FlaskClient, caller: str | None = "c1") -> Any:
    headers = {"X-Client": caller} if caller else {}
    response = http.get("/rate_limit", headers=headers)
    assert response.status_code == 200
    return response.get_json().get("credits", "absent")


def test_an_identified_caller_reads_its_balances_and_grants(
    tmp_path: Path, storage_url: str, close_sql: Callable[[Flask], Flask]
) -> None:
    """Every credits resource of the caller's plan is listed, with no grant a balance
    of 0; grants show units, left and expiry, soonest-expiring first, an expired one not
    at all; spending moves the balance; nothing of the operators' (note, id, who)."""
    app, quota, http = status_app(tmp_path, storage_url, close_sql)
    assert credits_of(http) == [
        {"resource": "ai_tokens", "balance": 0, "unit": "tokens", "grants": []},
        {"resource": "sms", "balance": 0, "unit": "requests", "grants": []},
    ]
    with app.app_context():
        quota.grant(identity="c1", resource="ai_tokens", units=100, note="invoice 7")
        quota.grant(identity="c1", resource="ai_tokens", units=50, expires="2099-01-01")
    with sql_store(app).change() as session:  # expired: new_grant refuses a past expiry
        session.add(CreditGrant(caller="c1", resource="ai_tokens", units=9, created_by="t",
                                expires_at=datetime(2001, 1, 1, tzinfo=UTC)))  # fmt: skip
    assert http.post("/chat?cost=60", headers={"X-Client": "c1"}).status_code == 200
    tokens, sms = credits_of(http)
    assert tokens == {
        "resource": "ai_tokens",
        "balance": 90,
        "unit": "tokens",
        "grants": [
            {"units": 50, "left": 0, "expires": "2099-01-01T00:00:00+00:00"},
            {"units": 100, "left": 90, "expires": None},
        ],
    }
    assert sms["balance"] == 0 and sms["grants"] == []
    assert credits_of(http, "c2")[0]["balance"] == 0  # another caller's own


def test_an_anonymous_caller_gets_an_empty_list(
    tmp_path: Path, storage_url: str, close_sql: Callable[[Flask], Flask]
) -> None:
    """Anonymous callers have no balance: ``"credits": []``."""
    _, _, http = status_app(tmp_path, storage_url, close_sql)
    assert credits_of(http, None) == []


def test_no_credits_key_where_no_plan_sells_credits(
    tmp_path: Path, close_sql: Callable[[Flask], Flask]
) -> None:
    """Without a credits resource in any plan the status is unchanged."""
    plans = {
        "payg": {"user": "10/minute", "resources": {"ai_tokens": "5/minute"}},
        "free": {"user": "1/minute"},
    }
    _, _, http = status_app(tmp_path, "memory://", close_sql, plans)
    assert credits_of(http) == "absent" and credits_of(http, None) == "absent"
