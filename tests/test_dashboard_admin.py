"""Dashboard pages that change quotas: validated, CSRF-protected, audited, enforced."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.dashboards import HASH, OPS, cell, dashboard_app, post


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
