"""The dashboard's usage pages: a client's and a tenant's billing period from the ledger,
as a bar chart, totals against the quotas and a CSV, linked from the clients, identity and
tenant pages; a page that says how to turn the ledger on; no 500 when the database fails."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import Session

from flask_quota.reports import current_period, usage_report
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.models import UsageRow
from tests.dashboards import OPS

PLANS = {
    "free": {
        "user": "100/minute, 3000/month",
        "tenant": "10000/month",
        "resources": {"ai": "1000/month"},
    }
}


@pytest.fixture
def ops_app_config() -> dict[str, Any]:
    """The ledger on, and plans with calendar quotas."""
    return {"QUOTA_LEDGER": True, "QUOTA_PLANS": PLANS}


def new_client(app: Flask, name: str, **fields: Any) -> str:
    """A client's id (made as the CLI makes it), as the ledger's caller column holds it."""
    store = app.extensions["quota"].sql
    info, _ = QuotaAdmin(store, actor="test").create_client(name, "free", **fields)
    store.refresh()
    return str(info.id)


def insert(app: Flask, *rows: tuple[str, str, str, str, int, int, int]) -> None:
    """Ledger rows (day, caller, tenant, resource, units, requests, denied)."""
    with Session(app.extensions["quota"].sql.engine) as session, session.begin():
        for day, caller, tenant, resource, units, requests, denied in rows:
            session.add(
                UsageRow(
                    day=date.fromisoformat(day), caller=caller, tenant=tenant,
                    resource=resource, units=units, requests=requests, denied=denied,
                )
            )  # fmt: skip


def get(http: FlaskClient, url: str) -> tuple[int, str]:
    response = http.get(url, headers=OPS)
    return response.status_code, response.get_data(as_text=True)


def totals(page: str) -> dict[str, list[str]]:
    """The totals table: resource -> its cells."""
    table = re.search(r'<table id="usage-totals">.*?</table>', page, re.S)
    assert table is not None, page[:2000]
    rows = re.findall(r'<tr data-resource="([^"]*)">(.*?)</tr>', table.group(0), re.S)
    return {resource: re.findall(r"<td>(.*?)</td>", cells, re.S) for resource, cells in rows}


@pytest.fixture
def acme(ops_app: Flask) -> str:
    """Client acme (billing day 15, tenant org) with use in period 2025-11 and around it."""
    client = new_client(ops_app, "acme", billing_day=15, tenant="org")
    insert(
        ops_app,
        ("2025-11-14", client, "org", "", 900, 900, 0),  # the period before
        ("2025-11-15", client, "org", "", 100, 100, 4),
        ("2025-11-20", client, "org", "ai", 250, 3, 0),
        ("2025-12-14", client, "org", "", 50, 50, 0),
        ("2025-12-15", client, "org", "", 700, 700, 0),  # the period after
        ("2025-11-20", "u7", "org", "", 5, 5, 0),  # another caller of the tenant
    )
    return client


def test_a_clients_usage_page_shows_the_chart_and_the_totals(ops_app: Flask, acme: str) -> None:
    """200; an inline SVG with a bar per day with use (and a denied one stacked), the
    period's 31 days on its axis; totals against 3000/month and ai's 1000/month."""
    status, page = get(ops_app.test_client(), f"/quota/usage/client/{acme}?period=2025-11")
    assert status == 200
    svg = re.search(r'<svg [^>]*id="usage-chart".*?</svg>', page, re.S)
    assert svg is not None
    assert len(re.findall(r'<rect class="used"', svg.group(0))) == 3
    assert len(re.findall(r'<rect class="denied"', svg.group(0))) == 1
    assert "<title>2025-11-15: 100 admitted, 4 denied</title>" in svg.group(0)
    assert ">Nov</text>" in svg.group(0) and ">Dec</text>" in svg.group(0)
    assert '<strong id="period">2025-11-15 to 2025-12-14</strong>' in page
    assert totals(page) == {
        "": ["requests", "150", "150", "4", "3000 per month", "5.0%"],
        "ai": ["ai", "250", "3", "0", "1000 per month", "25.0%"],
    }
    assert 'id="ledger-off"' not in page


def test_the_csv_download_is_the_reports_csv(ops_app: Flask, acme: str) -> None:
    """The page's CSV link answers the CLI's CSV of the same period, as an attachment."""
    http = ops_app.test_client()
    _, page = get(http, f"/quota/usage/client/{acme}?period=2025-11")
    link = re.search(r'<a id="usage-csv" href="([^"]+)"', page)
    assert link is not None
    response = http.get(link.group(1).replace("&amp;", "&"), headers=OPS)
    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    assert response.headers["Content-Disposition"].startswith("attachment; filename=")
    expected = usage_report(ops_app.extensions["quota"], client=acme, period="2025-11")
    assert response.get_data(as_text=True) == expected.csv_text()
    assert response.get_data(as_text=True).splitlines() == [
        "day,resource,units,requests,denied",
        "2025-11-15,,100,100,4",
        "2025-11-20,ai,250,3,0",
        "2025-12-14,,50,50,0",
    ]


def test_previous_and_next_periods_are_linked(ops_app: Flask, acme: str) -> None:
    """A past period links to the one before and the one after; the current one has no
    "next" (it has not begun)."""
    http = ops_app.test_client()
    _, page = get(http, f"/quota/usage/client/{acme}?period=2025-11")
    assert f'href="/quota/usage/client/{acme}?period=2025-10"' in page
    assert f'href="/quota/usage/client/{acme}?period=2025-12"' in page
    today = datetime.now(UTC).date()
    status, current = get(http, f"/quota/usage/client/{acme}")
    assert status == 200
    first, last = current_period(today, 15)
    assert f'<strong id="period">{first} to {last}</strong>' in current
    assert 'id="period-previous"' in current and 'id="period-next"' not in current


def test_a_tenants_usage_page_sums_its_callers(ops_app: Flask, acme: str) -> None:
    """The tenant's page adds every caller of it; requests count against the tenant
    tier's 10000/month."""
    status, page = get(ops_app.test_client(), "/quota/usage/tenant/org?period=2025-11")
    assert status == 200 and 'id="usage-chart"' in page
    assert totals(page)[""] == ["requests", "155", "155", "4", "10000 per month", "1.6%"]


def test_pages_link_to_the_usage_pages(ops_app: Flask, acme: str) -> None:
    """Every client row of the clients page (a revoked one too), a client's identity
    page, the tenants list and a tenant's page link to their usage page."""
    revoked = new_client(ops_app, "gone")
    QuotaAdmin(ops_app.extensions["quota"].sql, actor="test").revoke_client(revoked)
    http = ops_app.test_client()
    _, clients = get(http, "/quota/clients")
    for client in (acme, revoked):
        assert f'<a class="usage-link" href="/quota/usage/client/{client}">Usage</a>' in clients
    _, identity = get(http, f"/quota/identity/id={acme}")
    assert f'<a id="client-usage" href="/quota/usage/client/{acme}">' in identity
    _, tenants = get(http, "/quota/tenants")
    assert '<a class="usage-link" href="/quota/usage/tenant/org">Usage</a>' in tenants
    _, tenant = get(http, "/quota/tenant/org")
    assert '<a id="tenant-usage" href="/quota/usage/tenant/org">' in tenant


def test_an_unknown_client_or_tenant_name_is_404_and_a_bad_period_400(
    ops_app: Flask, acme: str
) -> None:
    """No such client, a name no tenant can have: 404; a malformed period: 400 with the
    fix; the last period a date can hold: 200 without a next link. None is a 500."""
    http = ops_app.test_client()
    for url in ("/quota/usage/client/999", "/quota/usage/client/abc",
                f"/quota/usage/tenant/{'x' * 80}"):  # fmt: skip
        status, page = get(http, url)
        assert status == 404 and 'id="usage-error"' in page, url
    status, page = get(http, f"/quota/usage/client/{acme}?period=2026-13")
    assert status == 400
    assert "no month 13" in page and f'href="/quota/usage/client/{acme}"' in page
    status, page = get(http, f"/quota/usage/client/{acme}?period=9998-12")  # no next period
    assert status == 200 and 'id="period-next"' not in page


def test_the_pages_need_a_login(ops_app: Flask, acme: str) -> None:
    """Without credentials the usage page and its CSV are refused."""
    http = ops_app.test_client()
    for url in (f"/quota/usage/client/{acme}", f"/quota/usage/client/{acme}?format=csv"):
        assert http.get(url).status_code == 401


@pytest.mark.parametrize("ops_app_config", [{"QUOTA_PLANS": PLANS}])
def test_with_the_ledger_off_the_page_says_how_to_turn_it_on(ops_app: Flask) -> None:
    """QUOTA_LEDGER off and nothing recorded: the page says to set QUOTA_LEDGER = True,
    and shows no empty chart."""
    client = new_client(ops_app, "acme")
    status, page = get(ops_app.test_client(), f"/quota/usage/client/{client}")
    assert status == 200
    notice = re.search(r'<p [^>]*id="ledger-off">(.*?)</p>', page, re.S)
    assert notice is not None and "<code>QUOTA_LEDGER = True</code>" in notice.group(1)
    assert "<svg" not in page


def test_a_database_that_fails_gives_a_page_that_says_so(ops_app: Flask, acme: str) -> None:
    """The ledger table gone (one way to make the read fail): 503 with the "database did
    not answer" page, for the page and the CSV alike, never a 500."""
    with ops_app.extensions["quota"].sql.engine.begin() as db:
        db.exec_driver_sql("DROP TABLE quota_usage")
    http = ops_app.test_client()
    for url in (f"/quota/usage/client/{acme}", "/quota/usage/tenant/org?format=csv"):
        status, page = get(http, url)
        assert status == 503, url
        assert "The quota database did not answer" in page


@pytest.mark.parametrize("ops_app_config", [{
    "QUOTA_LEDGER": True,
    "QUOTA_PLANS": {"free": {"user": "100/minute",
                             "resources": {"ai": {"rate": "1000/month", "unit": "tokens"}}}},
}])  # fmt: skip
def test_a_token_resources_chart_counts_tokens_and_says_so(ops_app: Flask, acme: str) -> None:
    """A resource whose plan counts tokens: its panel is titled in tokens and its bars
    count the 250 tokens of the day (not the 3 requests); the requests panel says
    requests; the totals' units cell names the unit."""
    _, page = get(ops_app.test_client(), f"/quota/usage/client/{acme}?period=2025-11")
    svg = re.search(r'<svg [^>]*id="usage-chart".*?</svg>', page, re.S)
    assert svg is not None
    names = re.findall(r'<text class="name"[^>]*>([^<]*)</text>', svg.group(0))
    assert names == ["requests per day", "ai (tokens) per day"], names
    assert "<title>2025-11-20: 250 tokens</title>" in svg.group(0)
    assert totals(page)["ai"][:3] == ["ai", "250 tokens", "3"]
