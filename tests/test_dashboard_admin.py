"""Dashboard pages that change quotas: validated, CSRF-protected, audited, enforced."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from dashboard.session import COOKIE
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.dashboards import HASH, OPS, cell, csrf_from, dashboard_app, post


def free_user_rate(http: FlaskClient) -> str | None:
    return cell(http, "free", "user")


def test_plan_edit_is_saved_audited_and_enforced(ops_app: Flask) -> None:
    """A valid rate is saved, shown, written to the audit log and enforced at once."""
    http = ops_app.test_client()
    assert free_user_rate(http) == "3/minute"
    status, _ = post(http, "/quota/plans/free/limit", "/quota/plans", tier="user", rate="5/minute")
    assert status == 200
    assert free_user_rate(http) == "5/minute"
    statuses = [http.get("/items", headers={"X-User": "bob"}).status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]  # the new rate, not the old 3/minute
    audit = http.get("/quota/audit", headers=OPS).get_data(as_text=True)
    assert "plan.limit.set" in audit and "dashboard:ops" in audit
    assert "3/minute" in audit and "5/minute" in audit  # before and after


def test_plan_form_accepts_several_rates(tmp_path: Path) -> None:
    """The plan form takes comma-separated rates; the canonical text is shown and enforced."""
    # A frozen clock: on the wall clock 2/second gives a token back every 0.5 s.
    storage = MemoryStorage(FrozenClock())
    http = dashboard_app(tmp_path, storage, QUOTA_DASHBOARD_USERS={"ops": HASH}).test_client()
    form = {"tier": "user", "rate": "2/second,3/minute"}
    status, _ = post(http, "/quota/plans/free/limit", "/quota/plans", **form)
    assert status == 200
    assert free_user_rate(http) == "2/second, 3/minute"
    statuses = [http.get("/items", headers={"X-User": "bob"}).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


@pytest.mark.parametrize(
    "rate", ["", "five per minute", "0/minute", "-3/minute", "10/fortnight", "<b>1</b>/minute"]
)
def test_malformed_rates_are_refused_and_nothing_saved(ops_app: Flask, rate: str) -> None:
    """Malformed or non-positive rates get a message on the form (400); nothing changes."""
    http = ops_app.test_client()
    status, page = post(http, "/quota/plans/free/limit", "/quota/plans", tier="user", rate=rate)
    assert status == 400
    assert 'id="form-error"' in page
    assert "<b>1</b>" not in page  # the echoed input is escaped
    assert free_user_rate(http) == "3/minute"
    assert "plan.limit.set" not in http.get("/quota/audit", headers=OPS).get_data(as_text=True)


def test_plan_edit_without_csrf_changes_nothing(ops_app: Flask) -> None:
    """A forged POST (no token) is refused and the plan keeps its rate."""
    http = ops_app.test_client()
    response = http.post(
        "/quota/plans/free/limit", headers=OPS, data={"tier": "user", "rate": "1000/minute"}
    )
    assert response.status_code == 400
    assert free_user_rate(http) == "3/minute"


def test_client_key_is_shown_once_and_works(ops_app: Flask) -> None:
    """Creating a client shows its key once; the list never shows it again; it works."""
    http = ops_app.test_client()
    status, page = post(http, "/quota/clients/new", "/quota/clients", name="acme", plan="free")
    assert status == 200
    key = re.search(r'<div id="new-key">([^<]+)</div>', page)
    assert key is not None
    listing = http.get("/quota/clients", headers=OPS).get_data(as_text=True)
    assert "acme" in listing and key.group(1) not in listing
    first = http.post("/infer", headers={"X-API-Key": key.group(1)})
    assert first.status_code == 200
    assert ops_app.extensions["quota"].sql.identify(key.group(1)) is not None


def test_revoked_client_becomes_anonymous(ops_app: Flask) -> None:
    """After revocation the key is unknown: its caller shares the anonymous budget."""
    http = ops_app.test_client()
    _, page = post(http, "/quota/clients/new", "/quota/clients", name="gone", plan="free")
    key = re.search(r'<div id="new-key">([^<]+)</div>', page)
    assert key is not None
    client_id = re.search(r"<td>(\d+)</td>\s*<td><a [^>]*>gone</a>", page)
    assert client_id is not None
    status, _ = post(http, f"/quota/clients/{client_id.group(1)}/revoke", "/quota/clients")
    assert status == 200
    assert ops_app.extensions["quota"].sql.identify(key.group(1)) is None
    assert "revoked" in http.get("/quota/clients", headers=OPS).get_data(as_text=True)


def test_identity_page_changes_plan_and_adds_override(ops_app: Flask) -> None:
    """From a client's identity page: change its plan, add an expiring override."""
    http = ops_app.test_client()
    _, page = post(http, "/quota/clients/new", "/quota/clients", name="zed", plan="free")
    key = re.search(r'<div id="new-key">([^<]+)</div>', page)
    assert key is not None
    client = ops_app.extensions["quota"].sql.identify(key.group(1))
    tag = f"id={client.id}"
    page_url = f"/quota/identity/{tag}"
    assert "Client zed" in http.get(page_url, headers=OPS).get_data(as_text=True)
    status, _ = post(
        http,
        f"/quota/clients/{client.id}/override",
        page_url,
        tier="endpoint",
        resource="ai",
        rate="7/minute",
        expires="7d",
        next="identity",
    )
    assert status == 200
    info = http.get(f"/quota/api/identity/{tag}", headers=OPS).get_json()
    assert {b["name"]: b["limit"] for b in info["buckets"]}["ai (POST)"] == 7
    status, page = post(
        http, f"/quota/clients/{client.id}/override", page_url, tier="user", rate="0/minute"
    )
    assert status == 400 and "Override refused" in page
    bad_expiry = post(
        http, f"/quota/clients/{client.id}/override", page_url, tier="user", rate="9/minute",
        expires="-1d",
    )  # fmt: skip
    assert bad_expiry[0] == 400
    audit = http.get("/quota/audit", headers=OPS).get_data(as_text=True)
    assert audit.count("override.set") == 1


# Every form that creates something, with input it accepts: (action, form page, fields).
CREATE_FORMS = [
    ("/quota/plans/new", "/quota/plans", {"name": "team"}),
    ("/quota/plans/limit", "/quota/plans",
     {"plan": "free", "tier": "endpoint", "resource": "pdf", "rate": "4/minute"}),
    ("/quota/clients/new", "/quota/clients", {"name": "acme", "plan": "free"}),
    ("/quota/networks/new", "/quota/networks", {"cidr": "203.0.113.0/24", "action": "deny"}),
    ("/quota/blocks/new", "/quota/blocks", {"caller": "mallory", "duration": "10m"}),
    ("/quota/tenant/acme/override", "/quota/clients", {"tier": "tenant", "rate": "50/minute"}),
    ("/quota/clients/{client}/override", "/quota/clients",
     {"tier": "user", "rate": "50/minute", "next": "identity"}),
    ("/quota/identity/id={client}/block", "/quota/clients", {"duration": "10m"}),
]  # fmt: skip


@pytest.mark.parametrize(("action", "form_page", "fields"), CREATE_FORMS)
def test_every_create_form_redirects_after_its_post(
    ops_app: Flask, action: str, form_page: str, fields: dict[str, str]
) -> None:
    """Post/Redirect/Get: a create form that succeeds answers a redirect to a page, so
    reloading what the browser shows GETs that page and creates nothing twice."""
    store = ops_app.extensions["quota"].sql
    client, _ = QuotaAdmin(store, actor="t").create_client("acme-user", "free", tenant="acme")
    store.refresh()
    http = ops_app.test_client()
    token = csrf_from(http, form_page)
    url = action.format(client=client.id)
    response = http.post(url, headers=OPS, data={**fields, "csrf_token": token})
    assert response.status_code in (302, 303), response.get_data(as_text=True)[:500]
    target = response.headers["Location"]
    assert target.startswith("/quota/")
    shown = http.get(target, headers=OPS)
    assert shown.status_code == 200
    assert 'class="flash ok"' in shown.get_data(as_text=True)


def test_a_new_clients_key_is_shown_once_after_the_redirect(ops_app: Flask) -> None:
    """The new client's key survives the redirect in the dashboard's cookie, encrypted
    (never readable there, even by someone who can decode the signed cookie), and is
    shown by the next page only: a reload shows it no more, and creates nothing."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/clients")
    response = http.post(
        "/quota/clients/new",
        headers=OPS,
        data={"name": "acme", "plan": "free", "csrf_token": token},
    )
    assert response.status_code in (302, 303)
    cookie = http.get_cookie(COOKIE, path="/quota")
    assert cookie is not None
    payload = cookie.value.split(".")[0]
    decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    page = http.get(response.headers["Location"], headers=OPS).get_data(as_text=True)
    key = re.search(r'<div id="new-key">([^<]+)</div>', page)
    assert key is not None and ops_app.extensions["quota"].sql.identify(key.group(1)) is not None
    assert key.group(1) not in decoded and key.group(1)[8:] not in cookie.value
    again = http.get("/quota/clients", headers=OPS).get_data(as_text=True)
    assert 'id="new-key"' not in again and key.group(1) not in again
    assert again.count(">acme</a>") == 1
