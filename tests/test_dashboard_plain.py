"""The dashboard speaks plainly: clients by name, hand-typed tags resolved or "no such
caller", durations as durations, and a favicon of its own."""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient

from dashboard.data import duration_text
from flask_quota.sql.admin import QuotaAdmin
from tests.dashboards import OPS, csrf_from, flush


def new_client(app: Flask, name: str) -> tuple[str, str]:
    """A client made through QuotaAdmin, as the CLI does: (its id, its API key)."""
    info, key = QuotaAdmin(app.extensions["quota"].sql, actor="test").create_client(name, "free")
    app.extensions["quota"].sql.refresh()
    return str(info.id), key


def body_of(html: str, tbody_id: str) -> str:
    return html.split(f'<tbody id="{tbody_id}"', 1)[1].split("</tbody>", 1)[0]


def test_clients_are_named_in_the_top_and_near_limit_lists(ops_app: Flask) -> None:
    """An API client appears by its name (with the client badge), not its bare id, in the
    overview's top identities and near-limit list, in the page and in its JSON."""
    client_id, key = new_client(ops_app, "acme-analytics")
    http = ops_app.test_client()
    for _ in range(2):
        http.post("/infer", headers={"X-API-Key": key})  # ai 2/minute: 100% used
    flush(ops_app)
    data = http.get("/quota/api/overview", headers=OPS).get_json()
    assert [(r["tag"], r["kind"], r["name"]) for r in data["top"]] == [
        (f"id={client_id}", "client", "acme-analytics")
    ]
    assert [r["name"] for r in data["near_limit"]] == ["acme-analytics"]
    page = http.get("/quota/", headers=OPS).get_data(as_text=True)
    for tbody in ("top", "near-limit"):
        rows = body_of(page, tbody)
        assert ">client</span>" in rows and ">acme-analytics</a>" in rows, rows
        assert f">{client_id}</a>" not in rows


def test_clients_are_named_on_the_blocks_list_and_their_page(ops_app: Flask) -> None:
    """A blocked client is listed by name; its own page's heading names it too."""
    client_id, _ = new_client(ops_app, "globex")
    http = ops_app.test_client()
    token = csrf_from(http, f"/quota/identity/id={client_id}")
    http.post(f"/quota/identity/id={client_id}/block", headers=OPS,
              data={"csrf_token": token, "duration": "1h"})  # fmt: skip
    listing = http.get("/quota/blocks", headers=OPS).get_data(as_text=True)
    assert ">client</span>" in listing and ">globex</a>" in listing
    page = http.get(f"/quota/identity/id={client_id}", headers=OPS).get_data(as_text=True)
    assert re.search(r'<span class="identity">globex</span>', page), page[:3000]


def test_names_fall_back_to_ids_while_the_database_is_gone(ops_app: Flask) -> None:
    """If the client names cannot be read, the overview still answers 200, with ids."""
    client_id, key = new_client(ops_app, "initech")
    http = ops_app.test_client()
    http.post("/infer", headers={"X-API-Key": key})
    flush(ops_app)
    with ops_app.extensions["quota"].sql.engine.begin() as db:
        db.exec_driver_sql("DROP TABLE quota_clients")  # one way to make the read fail
    ops_app.extensions["quota_dashboard_names"].ttl = 0  # no cached name
    response = http.get("/quota/api/overview", headers=OPS)
    assert response.status_code == 200
    assert [r["name"] for r in response.get_json()["top"]] == [client_id]


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("id=acct:1", "id=acct%253A1"),  # ':' escaped in the tag: %3A, so %253A in a URL
        ("id=acct%3A1", "id=acct%253A1"),  # the tag percent-decoded once by the server
        ("id=a b", "id=a%2520b"),
        ("ip=::1", "ip=%253A%253A%252F64"),  # an IPv6 caller is its /64
    ],
)
def test_a_hand_typed_tag_resolves_to_the_callers_page(
    ops_app: Flask, typed: str, canonical: str
) -> None:
    """A tag typed with a character left unescaped redirects to that caller's own page,
    whose buckets are the caller's (spent ones included), not an empty identity's."""
    http = ops_app.test_client()
    redirect = http.get(f"/quota/identity/{typed}", headers=OPS)
    assert redirect.status_code == 302
    assert redirect.headers["Location"].endswith(f"/quota/identity/{canonical}")
    api = http.get(f"/quota/api/identity/{typed}", headers=OPS)
    assert api.status_code == 302


def test_the_resolved_page_shows_the_callers_real_buckets(ops_app: Flask) -> None:
    """``id=acct:1`` typed by hand shows acct:1's spent buckets."""
    http = ops_app.test_client()
    for _ in range(2):
        http.post("/infer", headers={"X-User": "acct:1"})
    info = http.get("/quota/api/identity/id=acct:1", headers=OPS, follow_redirects=True)
    assert info.status_code == 200
    remaining = {b["name"]: b["remaining"] for b in info.get_json()["buckets"]}
    assert remaining == {"user": 1, "ai (POST)": 0}, remaining


@pytest.mark.parametrize("tag", ["ip=not-an-address", "id=%h1234", "ip="])
def test_a_tag_naming_nobody_says_no_such_caller(ops_app: Flask, tag: str) -> None:
    """A tag that names no caller (an IP that is no address, a digest nobody wrote)
    answers 404 with a page saying "No such caller", on pages and forms alike."""
    http = ops_app.test_client()
    page = http.get(f"/quota/identity/{tag}", headers=OPS)
    assert page.status_code == 404
    text = page.get_data(as_text=True)
    assert "No such caller" in text and "<h1>" in text
    token = csrf_from(http, "/quota/identity/id=ada")
    for action in ("reset", "block"):
        form = {"csrf_token": token, "duration": "1h"}
        refused = http.post(f"/quota/identity/{tag}/{action}", headers=OPS, data=form)
        assert refused.status_code == 404 and b"No such caller" in refused.data


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (45, "45 s"), (60, "1 min"), (65, "1 min 5 s"), (600, "10 min"),
     (3600, "1 h"), (4158, "1 h 9 min"), (86400, "1 d"), (90000, "1 d 1 h"),
     (3 * 86400 + 5 * 3600 + 59, "3 d 5 h"), (0.5, "0.5 s")],
)  # fmt: skip
def test_durations_read_like_durations(seconds: float, text: str) -> None:
    """A span of time is said in its two largest units: "1 h 9 min", not "4158 s"."""
    assert duration_text(seconds) == text


def test_pages_show_durations_not_bare_seconds(ops_app: Flask) -> None:
    """A caller's "full in" and a block's time left read as durations on the pages."""
    http: FlaskClient = ops_app.test_client()
    http.post("/infer", headers={"X-User": "ada"})
    token = csrf_from(http, "/quota/identity/id=ada")
    http.post("/quota/identity/id=ada/block", headers=OPS,
              data={"csrf_token": token, "duration": "2d"})  # fmt: skip
    page = http.get("/quota/identity/id=ada", headers=OPS).get_data(as_text=True)
    cells = re.findall(r"<td>([^<]*)</td></tr>", page.split('id="buckets"')[1].split("</table>")[0])
    assert cells and all(re.fullmatch(r"\d+ (s|min)( \d+ s)?|full now", c) for c in cells), cells
    assert "for 2 d more" in page or "for 1 d 23 h more" in page
    listing = http.get("/quota/blocks", headers=OPS).get_data(as_text=True)
    assert re.search(r"<td>(2 d|1 d 23 h)</td>", listing), listing
    assert not re.search(r"<td>\d{3,} s</td>", listing + page)


def test_every_page_names_a_favicon_that_is_served(ops_app: Flask) -> None:
    """Each page links an icon of the dashboard's own, served as SVG (no 404 per page)."""
    http = ops_app.test_client()
    for url in ("/quota/", "/quota/plans", "/quota/blocks", "/quota/identity/id=ada"):
        page = http.get(url, headers=OPS).get_data(as_text=True)
        link = re.search(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)">', page)
        assert link is not None, url
    assert link is not None  # the last page's, as asserted in the loop (mypy needs it here)
    icon = http.get(link.group(1), headers=OPS)
    assert icon.status_code == 200 and icon.content_type.startswith("image/svg+xml")
    assert icon.data.startswith(b"<svg") and len(icon.data) < 2000


def test_the_audit_log_shows_what_changed(ops_app: Flask) -> None:
    """A plan edit's audit row shows the limit it replaced and the new one, not the
    plan's unchanged limits (the full before/after stay in the database)."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/plans")
    http.post("/quota/plans/free/limit", headers=OPS,
              data={"csrf_token": token, "tier": "user", "rate": "5/minute"})  # fmt: skip
    page = http.get("/quota/audit", headers=OPS).get_data(as_text=True)
    row = re.search(r"<td>plan\.limit\.set</td>.*?</tr>", page, re.S)
    assert row is not None
    assert "3/minute" in row.group(0) and "5/minute" in row.group(0)
    assert "2/minute" not in row.group(0)  # the ai limit did not change
