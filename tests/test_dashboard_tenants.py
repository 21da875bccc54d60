"""The dashboard's tenants: clients' tenant and billing day, tenant pages, the plan rows."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.dashboards import HASH, OPS, cell, dashboard_app, flush, post

PLANS = {"free": {"user": "3/minute", "tenant": "4/minute", "resources": {"ai": "2/minute"}}}


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    # A frozen clock: the tenant bucket read back cannot refill under the test.
    storage = MemoryStorage(FrozenClock(1_700_000_010.0))
    return dashboard_app(tmp_path, storage, QUOTA_DASHBOARD_USERS={"ops": HASH}, QUOTA_PLANS=PLANS)


def create(http: FlaskClient, name: str, **fields: str) -> tuple[int, str, str | None]:
    status, page = post(http, "/quota/clients/new", "/quota/clients", name=name, plan="free",
                        **fields)  # fmt: skip
    key = re.search(r'<div id="new-key">([^<]+)</div>', page)
    return status, page, key.group(1) if key else None


def row_of(page: str, name: str) -> str:
    found = re.search(rf"<tr><td>\d+</td>\s*<td><a [^>]*>{re.escape(name)}</a>.*?</tr>", page, re.S)
    assert found is not None, f"no row for {name}"
    return found.group(0)


def audit(http: FlaskClient) -> str:
    return http.get("/quota/audit", headers=OPS).get_data(as_text=True)


def remaining(http: FlaskClient, tenant: str) -> list[str]:
    page = http.get(f"/quota/tenant/{quote(tenant)}", headers=OPS).get_data(as_text=True)
    table = re.search(r'<table id="buckets">.*?</table>', page, re.S)
    assert table is not None, page
    return re.findall(r"<tr><td>[^<]*</td><td>[^<]*</td><td>(\d+)</td>", table.group(0))


def test_client_created_with_tenant_and_billing_day(app: Flask) -> None:
    """The create form takes a tenant and a billing day: shown as columns, audited."""
    http = app.test_client()
    status, _, key = create(http, "alice", tenant="acme", billing_day="15")
    assert status == 200 and key
    row = row_of(http.get("/quota/clients", headers=OPS).get_data(as_text=True), "alice")
    assert '<td class="tenant"><a href="/quota/tenant/acme">acme</a></td>' in row
    assert '<td class="billing-day">15</td>' in row
    log = audit(http)
    assert "client.create" in log and "acme" in log


@pytest.mark.parametrize(
    "fields",
    [{"billing_day": "32"}, {"billing_day": "0"}, {"billing_day": "x"},
     {"tenant": "a" * 65}, {"tenant": "bad\x07name"}],
)  # fmt: skip
def test_bad_tenant_or_billing_day_is_refused(app: Flask, fields: dict[str, str]) -> None:
    """Bad input gets a clear message (400) and no client is created."""
    http = app.test_client()
    status, page, key = create(http, "bob", **fields)
    assert status == 400 and key is None
    assert 'id="form-error"' in page
    assert re.search(r"billing day|tenant", page.split('id="form-error">')[1].split("<")[0])
    assert "No clients yet." in http.get("/quota/clients", headers=OPS).get_data(as_text=True)


def test_client_tenant_and_billing_day_edits_are_audited(app: Flask) -> None:
    http = app.test_client()
    create(http, "alice")
    status, page = post(http, "/quota/clients/1/tenant", "/quota/clients", tenant="globex")
    assert status == 200 and "now in tenant globex" in page
    status, page = post(http, "/quota/clients/1/billing-day", "/quota/clients", billing_day="31")
    assert status == 200
    row = row_of(page, "alice")
    assert ">globex</a>" in row and '<td class="billing-day">31</td>' in row
    status, page = post(http, "/quota/clients/1/billing-day", "/quota/clients", billing_day="40")
    assert status == 400 and "Billing day change refused" in page
    status, page = post(http, "/quota/clients/1/tenant", "/quota/clients", tenant="")
    assert status == 200 and "now in no tenant" in page
    log = audit(http)
    assert "client.set_tenant" in log and "client.set_billing_day" in log


def test_tenant_page_shows_clients_and_bucket_and_resets_it(app: Flask) -> None:
    """Two clients of acme share its 4/minute bucket; the page reads it without charging,
    lists the clients, and its reset (audited) refills the bucket."""
    http = app.test_client()
    keys = [create(http, n, tenant="acme")[2] for n in ("alice", "bob")]
    create(http, "carol", tenant="globex")
    codes = [http.get("/items", headers={"X-API-Key": keys[i % 2] or ""}).status_code
             for i in range(5)]  # fmt: skip
    assert codes == [200, 200, 200, 200, 429]
    assert remaining(http, "acme") == ["0"]
    assert remaining(http, "acme") == ["0"]  # reading did not charge
    assert remaining(http, "globex") == ["4"]
    identity = http.get("/quota/identity/id=1", headers=OPS).get_data(as_text=True)
    assert '<a id="tenant" href="/quota/tenant/acme">acme</a>' in identity
    page = http.get("/quota/tenant/acme", headers=OPS).get_data(as_text=True)
    clients = re.search(r'<table id="tenant-clients">.*?</table>', page, re.S)
    assert clients and ">alice</a>" in clients.group(0) and ">bob</a>" in clients.group(0)
    assert "carol" not in clients.group(0)
    listing = http.get("/quota/tenants", headers=OPS).get_data(as_text=True)
    assert "alice, bob" in listing and ">globex</a>" in listing
    status, page = post(http, "/quota/tenant/acme/reset", "/quota/tenant/acme")
    assert status == 200 and "of tenant acme" in page
    assert remaining(http, "acme") == ["4"]
    assert http.get("/items", headers={"X-API-Key": keys[0] or ""}).status_code == 200
    log = audit(http)
    assert "usage.reset" in log and "t=acme" in log


def test_tenant_overrides_are_set_and_removed_from_its_page(app: Flask) -> None:
    http = app.test_client()
    key = create(http, "alice", tenant="acme")[2] or ""
    status, page = post(http, "/quota/tenant/acme/override", "/quota/tenant/acme",
                        tier="user", rate="1/minute")  # fmt: skip
    assert status == 200 and "Override of tenant acme saved" in page
    table = re.search(r'<table id="tenant-overrides">.*?</table>', page, re.S)
    assert table and "<td>user</td>" in table.group(0) and "1/minute" in table.group(0)
    codes = [http.get("/items", headers={"X-API-Key": key}).status_code for _ in range(2)]
    assert codes == [200, 429]  # the tenant's override, not the plan's 3/minute
    status, page = post(http, "/quota/tenant/acme/override", "/quota/tenant/acme",
                        tier="user", rate="often")  # fmt: skip
    assert status == 400 and 'id="form-error"' in page
    override_id = re.search(r"/quota/overrides/(\d+)/remove", page)
    assert override_id
    status, page = post(http, f"/quota/overrides/{override_id.group(1)}/remove",
                        "/quota/tenant/acme")  # fmt: skip
    assert status == 200 and "Override removed" in page
    assert "/quota/overrides/" not in page
    log = audit(http)
    assert "override.set" in log and "override.remove" in log and "tenant:acme" in log


def test_plan_matrix_has_the_tenant_row(app: Flask) -> None:
    http = app.test_client()
    assert cell(http, "free", "tenant") == "4/minute"
    status, _ = post(http, "/quota/plans/free/limit", "/quota/plans", tier="tenant",
                     rate="6/minute")  # fmt: skip
    assert status == 200
    assert cell(http, "free", "tenant") == "6/minute"


def test_tenant_names_are_escaped_and_bad_ones_are_not_found(app: Flask) -> None:
    http = app.test_client()
    name = "<b>a/b c?&"
    create(http, "alice", tenant=name)
    page = http.get("/quota/clients", headers=OPS).get_data(as_text=True)
    link = re.search(r'<td class="tenant"><a href="([^"]+)">([^<]+)</a>', page)
    assert link and link.group(2) == "&lt;b&gt;a/b c?&amp;"
    tenant_page = http.get(link.group(1).replace("&amp;", "&"), headers=OPS)
    assert tenant_page.status_code == 200
    text = tenant_page.get_data(as_text=True)
    assert "<b>a/b" not in text and ">alice</a>" in text
    missing = http.get("/quota/tenant/" + "x" * 65, headers=OPS)
    assert missing.status_code == 404 and b"No such tenant" in missing.data
    padded = http.get("/quota/tenant/%20acme%20", headers=OPS)
    assert padded.status_code == 302 and padded.headers["Location"].endswith("/quota/tenant/acme")


def test_tenant_changes_need_the_csrf_token(app: Flask) -> None:
    http = app.test_client()
    for url in ["/quota/tenant/acme/reset", "/quota/tenant/acme/override",
                "/quota/clients/1/tenant", "/quota/overrides/1/remove"]:  # fmt: skip
        response = http.post(url, headers=OPS, data={"tier": "user", "rate": "1/minute"})
        assert response.status_code == 400 and b"CSRF" in response.data


def test_overview_shows_usage_by_tenant(app: Flask) -> None:
    http = app.test_client()
    keys = [create(http, n, tenant=t)[2] or "" for n, t in [("a", "acme"), ("b", "acme"),
                                                             ("c", "globex")]]  # fmt: skip
    for key, times in zip(keys, [2, 3, 1], strict=True):
        for _ in range(times):
            http.get("/items", headers={"X-API-Key": key})
    flush(app)
    page = http.get("/quota/", headers=OPS).get_data(as_text=True)
    table = re.search(r'<tbody id="tenant-usage">(.*?)</tbody>', page, re.S)
    assert table is not None
    rows = re.findall(r">([^<]+)</a></td><td>(\d+)</td>", table.group(1))
    assert rows == [("acme", "5"), ("globex", "1")]
