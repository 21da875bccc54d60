"""The dashboard's Networks page: list, add (validated) and remove network rules, each
change audited under the operator and behind the CSRF token; a database that fails
gives a page that says so, never a 500."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from flask_quota.sql.admin import QuotaAdmin
from tests.dashboards import HASH, OPS, csrf_from, dashboard_app, post
from tests.sqldb import postgres_database, sql_store
from tests.sqlfaults import Proxy


def audit(app: Flask) -> list[tuple[str, str, str]]:
    entries = QuotaAdmin(sql_store(app), actor="t").audit_log()
    return [(e.actor, e.action, e.target) for e in reversed(entries)]


def listed(app: Flask) -> list[tuple[str, str]]:
    return [(n.cidr, n.action) for n in QuotaAdmin(sql_store(app), actor="t").networks()]


def rows_of(page: str) -> list[str]:
    """The networks the page's table lists, in order."""
    return re.findall(r'<tr data-cidr="([^"]+)">', page)


def test_the_page_lists_adds_and_removes_networks(ops_app: Flask) -> None:
    """Linked from the nav; adding a denial and an allowance (with a duration) lists
    them with reason, author and expiry, the denied network's requests get 403; Remove
    deletes one. Every change is audited as the logged-in operator."""
    http = ops_app.test_client()
    assert 'href="/quota/networks"' in http.get("/quota/", headers=OPS).get_data(as_text=True)
    empty = http.get("/quota/networks", headers=OPS)
    assert empty.status_code == 200 and "No network is denied or allowed" in empty.get_data(
        as_text=True
    )
    status, page = post(
        http, "/quota/networks/new", "/quota/networks",
        action="deny", cidr="203.0.113.9/24", duration="", reason="<b>scrapers</b>",
    )  # fmt: skip
    assert status == 200 and "Network 203.0.113.0/24 is denied (403)." in page
    status, page = post(
        http, "/quota/networks/new", "/quota/networks",
        action="allow", cidr="2001:db8::/32", duration="2h", reason="partner",
    )  # fmt: skip
    assert status == 200 and "Network 2001:db8::/32 is allowed" in page and " until " in page
    assert rows_of(page) == ["203.0.113.0/24", "2001:db8::/32"]
    assert "&lt;b&gt;scrapers&lt;/b&gt;" in page  # escaped
    row = page[page.index('data-cidr="2001:db8::/32"') :].split("</tr>")[0]
    assert "allow" in row and "partner" in row and "dashboard:ops" in row
    assert "until removed" not in row  # it has an expiry
    denied = http.get("/items", environ_base={"REMOTE_ADDR": "203.0.113.50"})
    assert denied.status_code == 403 and denied.get_json()["tier"] == "network"

    status, page = post(http, "/quota/networks/remove", "/quota/networks", cidr="203.0.113.0/24")
    assert status == 200 and "Removed the deny rule of 203.0.113.0/24." in page
    assert rows_of(page) == ["2001:db8::/32"]
    assert http.get("/items", environ_base={"REMOTE_ADDR": "203.0.113.50"}).status_code == 200
    assert audit(ops_app) == [
        ("dashboard:ops", "network.deny", "network:203.0.113.0/24"),
        ("dashboard:ops", "network.allow", "network:2001:db8::/32"),
        ("dashboard:ops", "network.remove", "network:203.0.113.0/24"),
    ]


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"action": "deny", "cidr": "300.1.2.3/8"}, "Octet 300"),
        ({"action": "deny", "cidr": "10.0.0.0/33"}, "&#39;33&#39; is not a valid netmask"),
        ({"action": "allow", "cidr": "abc"}, "Expected 4 octets"),
        ({"action": "deny", "cidr": ""}, "name the network"),
        ({"action": "block", "cidr": "10.0.0.0/8"}, "deny or allow"),
        ({"action": "deny", "cidr": "10.0.0.0/8", "duration": "soon"}, "malformed duration"),
        ({"action": "deny", "cidr": "10.0.0.0/8", "reason": "x" * 201}, "at most 200"),
    ],
)
def test_bad_input_is_shown_and_nothing_is_saved(
    ops_app: Flask, form: dict[str, str], message: str
) -> None:
    """A malformed network, action, duration or reason: 400, the page says why (and
    keeps what was typed), no rule and no audit entry."""
    http = ops_app.test_client()
    form = {"duration": "", "reason": "", **form}
    form["csrf_token"] = csrf_from(http, "/quota/networks")
    response = http.post("/quota/networks/new", headers=OPS, data=form)
    page = response.get_data(as_text=True)
    assert response.status_code == 400
    error = re.search(r'<p class="flash error" role="alert" id="network-error">(.*?)</p>', page)
    assert error is not None and message in error.group(1) and "Nothing changed" in error.group(1)
    if form["cidr"]:
        assert f'value="{form["cidr"]}"' in page  # what was typed, to correct
    assert listed(ops_app) == [] and audit(ops_app) == []


def test_removing_a_network_without_a_rule_says_so(ops_app: Flask) -> None:
    """Remove of a network that has no rule (removed meanwhile): 400 with the reason."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/networks")
    response = http.post(
        "/quota/networks/remove", headers=OPS, data={"csrf_token": token, "cidr": "10.0.0.0/8"}
    )
    assert response.status_code == 400
    assert "no rule for network 10.0.0.0/8" in response.get_data(as_text=True)
    assert audit(ops_app) == []


def test_changes_need_the_csrf_token_and_the_page_a_login(ops_app: Flask) -> None:
    """Without the CSRF token neither an add nor a remove changes anything (400);
    without credentials the page is refused."""
    http = ops_app.test_client()
    assert http.get("/quota/networks").status_code == 401
    add = http.post(
        "/quota/networks/new", headers=OPS, data={"action": "deny", "cidr": "10.0.0.0/8"}
    )
    assert add.status_code == 400 and "CSRF" in add.get_data(as_text=True)
    assert listed(ops_app) == []
    QuotaAdmin(sql_store(ops_app), actor="kim").deny_network("10.0.0.0/8")
    bad = {"cidr": "10.0.0.0/8", "csrf_token": "forged"}
    assert http.post("/quota/networks/remove", headers=OPS, data=bad).status_code == 400
    assert listed(ops_app) == [("10.0.0.0/8", "deny")]
    assert audit(ops_app) == [("kim", "network.deny", "network:10.0.0.0/8")]


def test_a_missing_table_gives_the_database_page(ops_app: Flask) -> None:
    """The table gone (one way to make the database fail): the page and a change answer
    503 with a page saying so, never a 500."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/networks")
    with sql_store(ops_app).engine.begin() as db:
        db.exec_driver_sql("DROP TABLE quota_networks")
    response = http.get("/quota/networks", headers=OPS)
    assert response.status_code == 503
    assert "The quota database did not answer" in response.get_data(as_text=True)
    change = http.post(
        "/quota/networks/new", headers=OPS,
        data={"csrf_token": token, "action": "deny", "cidr": "10.0.0.0/8"},
    )  # fmt: skip
    assert change.status_code == 503 and "nothing was saved" in change.get_data(as_text=True)


@pytest.fixture
def postgres() -> Iterator[str]:
    """A fresh PostgreSQL database (skipped, loudly, without QUOTA_TEST_DATABASE_URL)."""
    yield from postgres_database()


def test_a_database_that_went_away_gives_a_page_and_requests_keep_the_rules(
    tmp_path: Path, postgres: str
) -> None:
    """PostgreSQL behind a proxy that drops every connection: the page and a change
    answer 503 and say so; requests still meet the rules they had (in-process), so the
    denied network keeps getting 403. Back up, the page lists the rule unchanged."""
    proxy = Proxy(postgres)
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH}, QUOTA_DATABASE_URL=proxy.url)
    try:
        QuotaAdmin(sql_store(app), actor="kim").deny_network("203.0.113.0/24")
        http = app.test_client()
        token = csrf_from(http, "/quota/networks")
        proxy.kill()
        page = http.get("/quota/networks", headers=OPS)
        assert page.status_code == 503
        assert "The quota database did not answer" in page.get_data(as_text=True)
        change = http.post(
            "/quota/networks/new", headers=OPS,
            data={"csrf_token": token, "action": "deny", "cidr": "198.51.100.0/24"},
        )  # fmt: skip
        assert change.status_code == 503
        assert "nothing was saved" in change.get_data(as_text=True)
        denied = http.get("/items", environ_base={"REMOTE_ADDR": "203.0.113.9"})
        assert denied.status_code == 403
        proxy.revive()
        again = http.get("/quota/networks", headers=OPS)
        assert again.status_code == 200 and rows_of(again.get_data(as_text=True)) == [
            "203.0.113.0/24"
        ]
    finally:
        sql_store(app).close()
        proxy.close()
