"""The dashboard's Block action: on a caller's page and on the blocks list, CSRF-protected,
validated (bad input changes nothing), audited under the operator, enforced at once."""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota.sql.admin import QuotaAdmin
from tests.dashboards import OPS, csrf_from


def audit(app: Flask) -> list[tuple[str, str, str]]:
    """(action, target, actor) of every audit entry, oldest first."""
    entries = QuotaAdmin(app.extensions["quota"].sql, actor="test").audit_log(limit=100)
    return [(e.action, e.target, e.actor) for e in reversed(entries)]


def block_rows(http: FlaskClient) -> list[str]:
    """The tags listed on the blocks page."""
    page = http.get("/quota/blocks", headers=OPS).get_data(as_text=True)
    return re.findall(r'<tr data-tag="([^"]+)">', page)


def post(http: FlaskClient, url: str, page: str, **form: str) -> tuple[int, str]:
    form["csrf_token"] = csrf_from(http, page)
    response = http.post(url, headers=OPS, data=form, follow_redirects=True)
    return response.status_code, response.get_data(as_text=True)


def test_block_from_a_callers_page_is_enforced_listed_and_audited(ops_app: Flask) -> None:
    """Block on ada's page: her next request gets 429 "blocked", her page says so with an
    Unblock button, the blocks list shows her with the time left as a duration and the
    reason, and the audit log has one block entry by the logged-in operator."""
    http = ops_app.test_client()
    assert http.post("/infer", headers={"X-User": "ada"}).status_code == 200
    status, page = post(
        http, "/quota/identity/id=ada/block", "/quota/identity/id=ada",
        duration="2h", reason="scraping the catalogue",
    )  # fmt: skip
    assert status == 200 and "Blocked user ada for 2 h." in page
    assert "Blocked</strong> for 2 h more" in page and ">Unblock</button>" in page
    denied = http.post("/infer", headers={"X-User": "ada"})
    assert denied.status_code == 429 and denied.get_json()["tier"] == "blocked"
    assert http.post("/infer", headers={"X-User": "bob"}).status_code == 200
    assert block_rows(http) == ["id=ada"]
    listing = http.get("/quota/blocks", headers=OPS).get_data(as_text=True)
    assert "scraping the catalogue" in listing and ("2 h" in listing or "1 h 59 min" in listing)
    assert audit(ops_app) == [("block", "id=ada", "dashboard:ops")]


def test_unblock_from_a_callers_page_returns_to_it(ops_app: Flask) -> None:
    """The Unblock button on a blocked caller's page lifts the block and comes back to
    that page, which then says "Not blocked"."""
    http = ops_app.test_client()
    post(http, "/quota/identity/id=ada/block", "/quota/identity/id=ada", duration="10m")
    status, page = post(
        http, "/quota/blocks/id=ada/unblock", "/quota/identity/id=ada", next="identity"
    )
    assert status == 200 and "Unblocked user ada." in page and "Not blocked." in page
    assert http.post("/infer", headers={"X-User": "ada"}).status_code == 200


def test_block_from_the_blocks_list_by_identity_or_ip(ops_app: Flask) -> None:
    """The blocks page's form blocks a caller named by identity or by IP address."""
    http = ops_app.test_client()
    post(http, "/quota/blocks/new", "/quota/blocks", caller="bob", duration="30m")
    status, page = post(http, "/quota/blocks/new", "/quota/blocks", caller="10.1.2.3",
                        duration="1d", reason="flood")  # fmt: skip
    assert status == 200 and "Blocked IP 10.1.2.3 for 1 d." in page
    assert sorted(block_rows(http)) == ["id=bob", "ip=10.1.2.3"]
    anonymous = http.get("/items", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert anonymous.status_code == 429
    assert http.get("/items", headers={"X-User": "bob"}).status_code == 429


@pytest.mark.parametrize(
    ("duration", "reason", "message"),
    [
        ("", "", "say how long to block"),
        ("soon", "", "malformed duration 'soon'"),
        ("10 parsecs", "", "malformed duration"),
        ("-5m", "", "must be positive"),
        ("0m", "", "must be positive"),
        ("99999d", "", "longer than 3650 days"),
        ("10m", "x" * 201, "keep it to 200"),
    ],
)
def test_bad_block_input_says_why_and_changes_nothing(
    ops_app: Flask, duration: str, reason: str, message: str
) -> None:
    """A refused duration or reason answers 400 with the reason on the page; nobody is
    blocked and nothing is audited."""
    http = ops_app.test_client()
    for url, page, extra in (
        ("/quota/identity/id=ada/block", "/quota/identity/id=ada", {}),
        ("/quota/blocks/new", "/quota/blocks", {"caller": "ada"}),
    ):
        status, body = post(http, url, page, duration=duration, reason=reason, **extra)
        assert status == 400, body[:300]
        error = re.search(r'id="block-error">([^<]*)<', body)
        assert error is not None and message in error.group(1).replace("&#39;", "'"), body
        assert "Nothing changed" in error.group(1)
    assert block_rows(http) == []
    assert http.post("/infer", headers={"X-User": "ada"}).status_code == 200
    assert audit(ops_app) == []


def test_block_needs_a_caller_on_the_blocks_list(ops_app: Flask) -> None:
    """The blocks page's form without a caller answers 400 and says what to fill in."""
    http = ops_app.test_client()
    status, body = post(http, "/quota/blocks/new", "/quota/blocks", caller=" ", duration="1h")
    assert status == 400 and "name the caller" in body
    assert block_rows(http) == [] and audit(ops_app) == []


def test_block_without_csrf_is_refused(ops_app: Flask) -> None:
    """A Block POST without a valid CSRF token is 400 and blocks nobody."""
    http = ops_app.test_client()
    csrf_from(http, "/quota/identity/id=ada")  # the browser has its cookie, not the token
    for form in ({"duration": "1h"}, {"duration": "1h", "csrf_token": "forged"}):
        refused = http.post("/quota/identity/id=ada/block", headers=OPS, data=form)
        assert refused.status_code == 400
        refused = http.post("/quota/blocks/new", headers=OPS, data={**form, "caller": "ada"})
        assert refused.status_code == 400
    assert block_rows(http) == [] and audit(ops_app) == []


def test_public_reason_reaches_the_caller_only_when_ticked(ops_app: Flask) -> None:
    """With "show the reason to the caller" ticked the block's 429 carries the reason;
    without it, the reason stays with the operators (blocks list, audit log)."""
    http = ops_app.test_client()
    post(http, "/quota/identity/id=ada/block", "/quota/identity/id=ada",
         duration="1h", reason="unpaid invoice 42", public="on")  # fmt: skip
    post(http, "/quota/identity/id=bob/block", "/quota/identity/id=bob",
         duration="1h", reason="internal note 7")  # fmt: skip
    shown = http.post("/infer", headers={"X-User": "ada"})
    hidden = http.post("/infer", headers={"X-User": "bob"})
    assert shown.status_code == hidden.status_code == 429
    assert "unpaid invoice 42" in shown.get_data(as_text=True)
    assert "internal note 7" not in hidden.get_data(as_text=True)
    listing = http.get("/quota/blocks", headers=OPS).get_data(as_text=True)
    assert "internal note 7" in listing and listing.count("shown to the caller") == 1
