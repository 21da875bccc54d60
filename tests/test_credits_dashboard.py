"""Prepaid credits on the dashboard (issue 41): a client's page shows each balance and
its grants, and grants more through a form behind the CSRF token, audited under the
operator, spendable at once; refused input shows why and changes nothing. One check in
a real Chromium that the balance and the new grant show after submitting the form."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request
from sqlalchemy import func, select

from flask_quota import Identity, Quota
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.models import CreditGrant
from flask_quota.storage import MemoryStorage
from tests.dashboards import HASH, OPS, csrf_from, post
from tests.sqldb import sql_store

PLANS = {
    "payg": {
        "user": "1000/minute",
        "resources": {"ai_tokens": {"rate": "credits", "unit": "tokens"}},
    },
    "free": {"user": "10/minute"},
}


def credits_app(tmp_path: Path, **config: Any) -> Flask:
    """The dashboard at /quota (operator ``ops``), one SQL client ``acme`` on ``payg``
    (id 1, spending as ``X-User: 1``) and ``POST /chat?cost=N`` spending ``ai_tokens``."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.secret_key = "test-secret"
    app.config.update(
        {
            "TESTING": True,
            "QUOTA_DASHBOARD_URL": "/quota",
            "QUOTA_DASHBOARD_USERS": {"ops": HASH},
            "QUOTA_PLANS": PLANS,
            "QUOTA_DEFAULT_PLAN": "payg",
            **config,
        }
    )
    quota = Quota(app, storage=MemoryStorage())

    @quota.identity_loader
    def load() -> Identity | None:
        user = request.headers.get("X-User")
        return Identity(user, "payg") if user else None

    @app.post("/chat")
    @quota.limit(resource="ai_tokens", cost=lambda: int(request.args.get("cost", "1")))
    def chat() -> str:
        return "ok"

    with app.app_context():
        QuotaAdmin(sql_store(app), actor="t").create_client("acme", "payg")
    return app


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    app = credits_app(tmp_path)
    yield app
    sql_store(app).close()


PAGE = "/quota/identity/id=1"
GRANT = "/quota/clients/1/credits"


def balance_of(page: str, resource: str = "ai_tokens") -> str:
    found = re.search(
        rf'<tr data-resource="{resource}">.*?<td class="balance">(.*?)</td>', page, re.S
    )
    assert found is not None, "the page lists the balance"
    return found.group(1).strip()


def grant_rows(page: str) -> dict[str, str]:
    """Each grant row of the page, by grant id: its text, tags removed."""
    rows = re.findall(r'<tr data-grant="(\d+)"([^>]*)>(.*?)</tr>', page, re.S)
    return {
        gid: attrs + " " + re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))
        for gid, attrs, body in rows
    }


def grants_written(app: Flask) -> int:
    with sql_store(app).session() as session:
        return session.scalar(select(func.count()).select_from(CreditGrant)) or 0


def audit(app: Flask) -> list[tuple[str, str, str]]:
    entries = QuotaAdmin(sql_store(app), actor="t").audit_log()
    return [(e.actor, e.action, e.target) for e in reversed(entries) if e.action.startswith("cred")]


def test_the_page_shows_balances_and_grants_and_grants_more(
    database_url: str, tmp_path: Path
) -> None:
    """Before: balance 0, no grants. The form grants 500 tokens (PRG: 302 back to the
    page), audited as the operator; the page shows the balance, the grant (units, left,
    expiry, note escaped, who, when), and it is spendable at once: a request of 30 leaves
    470, shown on the page."""
    app = credits_app(tmp_path, QUOTA_DATABASE_URL=database_url)
    try:
        http = app.test_client()
        page = http.get(PAGE, headers=OPS).get_data(as_text=True)
        assert 'id="credits"' in page and balance_of(page) == "0" and "No grants." in page
        assert "<option>ai_tokens</option>" in page  # the plan's credits resource
        assert http.post("/chat?cost=1", headers={"X-User": "1"}).status_code == 402

        token = csrf_from(http, PAGE)
        form = {"csrf_token": token, "resource": "ai_tokens", "units": "500",
                "expires": "2099-01-01", "note": "<b>invoice 1042</b>"}  # fmt: skip
        made = http.post(GRANT, headers=OPS, data=form)
        assert made.status_code == 302
        assert made.headers["Location"].endswith("/quota/identity/id=1#credits")
        page = http.get(PAGE, headers=OPS).get_data(as_text=True)
        assert "Granted 500 ai_tokens to client acme until 2099-01-01 00:00 UTC" in page
        assert balance_of(page) == "500"
        (row,) = grant_rows(page).values()
        assert "ai_tokens 500 500 2099-01-01 00:00" in row and "dashboard:ops" in row
        assert "&lt;b&gt;invoice 1042&lt;/b&gt;" in row and "expired" not in row
        assert f"{datetime.now(UTC):%Y-%m-%d}" in row  # when it was given
        assert audit(app) == [("dashboard:ops", "credits.grant", "credits:1:ai_tokens")]

        assert http.post("/chat?cost=30", headers={"X-User": "1"}).status_code == 200
        page = http.get(PAGE, headers=OPS).get_data(as_text=True)
        assert balance_of(page) == "470" and " 500 470 " in next(iter(grant_rows(page).values()))
        info = http.get("/quota/api/identity/id=1", headers=OPS).get_json()
        assert info["credits"]["balances"] == [
            {"resource": "ai_tokens", "balance": 470, "unit": "tokens"}
        ]
    finally:
        sql_store(app).close()


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"units": "five"}, "units must be a whole number from 1 to"),
        ({"units": "1e3"}, "units must be a whole number from 1 to"),
        ({"units": "²"}, "units must be a whole number from 1 to"),
        ({"units": "0"}, "units must be a whole number from 1 to"),
        ({"units": "1000000000001"}, "units must be a whole number from 1 to"),
        ({"resource": "sms"}, "no plan has a credits resource &#39;sms&#39;"),
        ({"expires": "2001-01-01"}, "must be in the future"),
        ({"expires": "soon"}, "is not a date"),
        ({"note": "x" * 501}, "the note must be text of at most 500 characters"),
    ],
)
def test_refused_input_is_shown_and_changes_nothing(
    app: Flask, form: dict[str, str], message: str
) -> None:
    """Each mistake re-renders the page (400) with why, the form keeping what was typed;
    no grant is written, nothing audited, the balance unchanged."""
    http = app.test_client()
    data = {"csrf_token": csrf_from(http, PAGE), "resource": "ai_tokens", "units": "7", **form}
    response = http.post(GRANT, headers=OPS, data=data)
    page = response.get_data(as_text=True)
    assert response.status_code == 400
    error = re.search(
        r'<p class="flash error" role="alert" id="credits-error">(.*?)</p>', page, re.S
    )
    assert error is not None and message in error.group(1) and "Nothing changed." in error.group(1)
    units = re.search(r'<input name="units"[^>]*value="([^"]*)"', page)
    assert units is not None and units.group(1) == data["units"]  # kept (escaped) for a retry
    assert grants_written(app) == 0 and audit(app) == []
    assert balance_of(page) == "0"


def test_a_grant_needs_the_csrf_token(app: Flask) -> None:
    """Without the page's token the POST is refused (400) and nothing is granted."""
    http = app.test_client()
    http.get(PAGE, headers=OPS)
    refused = http.post(GRANT, headers=OPS, data={"resource": "ai_tokens", "units": "5"})
    assert refused.status_code == 400 and "CSRF" in refused.get_data(as_text=True)
    assert grants_written(app) == 0


def test_an_unknown_client_is_404(app: Flask) -> None:
    http = app.test_client()
    token = csrf_from(http, PAGE)
    data = {"csrf_token": token, "resource": "ai_tokens", "units": "5"}
    response = http.post("/quota/clients/99/credits", headers=OPS, data=data)
    assert response.status_code == 404 and grants_written(app) == 0


def test_expired_grants_are_marked_and_do_not_count(app: Flask) -> None:
    """A grant past its expiry stays listed, marked expired, and counts for nothing."""
    with sql_store(app).change() as session:  # written directly: new_grant refuses a past expiry
        past = datetime.now(UTC) - timedelta(days=1)
        session.add(CreditGrant(caller="1", resource="ai_tokens", units=40, note="old",
                                expires_at=past, created_by="t"))  # fmt: skip
    http = app.test_client()
    status, page = post(http, GRANT, PAGE, resource="ai_tokens", units="5", expires="", note="")
    assert status == 200
    rows = grant_rows(page)
    assert 'class="expired"' in rows["1"] and "expired" in rows["1"] and " 40 0 " in rows["1"]
    assert "expired" not in rows["2"] and "never" in rows["2"]
    assert balance_of(page) == "5"


def test_a_plan_without_credits_shows_no_form(app: Flask) -> None:
    """On a plan with no credits resource the section says so instead of the form; an
    app where no plan sells credits shows no section at all."""
    with app.app_context():
        QuotaAdmin(sql_store(app), actor="t").create_client("basic", "free")
    page = app.test_client().get("/quota/identity/id=2", headers=OPS).get_data(as_text=True)
    assert 'id="credits-no-form"' in page and 'id="credit-grant-form"' not in page


def test_no_section_when_no_plan_sells_credits(tmp_path: Path) -> None:
    app = credits_app(
        tmp_path, QUOTA_PLANS={"payg": {"user": "10/minute"}, "free": {"user": "5/minute"}}
    )
    try:
        page = app.test_client().get(PAGE, headers=OPS).get_data(as_text=True)
        assert 'id="client"' in page and 'id="credits"' not in page
    finally:
        sql_store(app).close()


# -- a real browser ---------------------------------------------------------------------


@pytest.mark.browser
def test_a_grant_from_the_form_shows_in_chromium(tmp_path: Path) -> None:
    """Chromium fills the form and submits it: after the redirect the page shows the new
    balance and the grant."""
    from tests.apps.dashboard_demo import serving
    from tests.browsers import CHROMIUM, CHROMIUM_ARGS, require_chromium

    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    env = {
        "DASHBOARD_DEMO_USER": "ops", "DASHBOARD_DEMO_PASSWORD": "pw",
        "DASHBOARD_DEMO_INSTANCE": str(tmp_path / "instance"), "DASHBOARD_DEMO_SECRET": "s",
        "QUOTA_PLANS": '{"payg": {"user": "100/minute", "resources": {"ai_tokens": "credits"}}}',
        "QUOTA_DEFAULT_PLAN": "payg", "QUOTA_ANONYMOUS_PLAN": "payg",
    }  # fmt: skip
    with serving(env) as (app, base), sync_playwright() as p:
        with app.app_context():
            QuotaAdmin(sql_store(app), actor="t").create_client("acme", "payg")
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(http_credentials={"username": "ops", "password": "pw"})
            page = context.new_page()
            page.goto(base + "/quota/identity/id=1")
            form = page.locator("#credit-grant-form")
            form.locator("input[name=units]").fill("250")
            form.locator("input[name=expires]").fill("2099-06-30")
            form.locator("input[name=note]").fill("trial")
            form.locator("button[type=submit]").click()
            page.wait_for_url("**/quota/identity/id=1#credits")
            expect(
                page.locator('#credit-balances tr[data-resource="ai_tokens"] .balance')
            ).to_have_text("250")
            row = page.locator("#credit-grants tr[data-grant]")
            expect(row).to_have_count(1)
            expect(row).to_contain_text("2099-06-30 00:00")
            expect(row).to_contain_text("trial")
            expect(page.locator(".flash.ok")).to_contain_text(
                "Granted 250 ai_tokens to client acme"
            )
        finally:
            browser.close()
