"""The plans matrix: tiers x plans, create and delete plans, set and remove one rate.

Every change is validated (bad input: 400, the message on the page, nothing saved),
CSRF-protected and written to the audit log under the operator's name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota.settings import reference
from flask_quota.sql.admin import QuotaAdmin
from tests.dashboards import HASH, OPS, cell, csrf_from, dashboard_app, flush, post

PLANS = {
    "free": {"user": "3/minute", "resources": {"ai": "2/minute"}},
    "pro": {"global": "50/second", "user": "30/minute", "resources": {"pdf": "4/minute"}},
}


@pytest.fixture
def ops_app_config() -> dict[str, Any]:
    """Here ``ops_app`` serves ``PLANS``."""
    return {"QUOTA_PLANS": PLANS}


def page(http: FlaskClient) -> str:
    return http.get("/quota/plans", headers=OPS).get_data(as_text=True)


def columns(http: FlaskClient) -> list[str]:
    head = page(http).split("<thead>", 1)[1].split("</thead>", 1)[0]
    return re.findall(r'<th scope="col" data-plan="([^"]+)"', head)


def rows(http: FlaskClient) -> list[str]:
    return re.findall(r'<tr data-row="([^"]+)"', page(http))


def audit_actions(app: Flask) -> list[tuple[str, str, str]]:
    entries = QuotaAdmin(app.extensions["quota"].sql, actor="test").audit_log()
    return [(e.actor, e.action, e.target) for e in reversed(entries)]


def snapshot(app: Flask) -> tuple[Any, ...]:
    """Everything a refused change must leave as it was."""
    a = QuotaAdmin(app.extensions["quota"].sql, actor="test")
    return (a.plans(), [x.id for x in a.audit_log()], app.extensions["quota"].sql.version())


def test_matrix_has_tiers_as_rows_and_plans_as_columns(ops_app: Flask) -> None:
    """Rows: global, tenant, user, then each resource; columns: plans in upgrade order; a tier a
    plan has no rate for shows an empty cell."""
    http = ops_app.test_client()
    assert columns(http) == ["free", "pro"]
    assert rows(http) == ["global", "tenant", "user", "endpoint:ai", "endpoint:pdf", "concurrent"]
    assert cell(http, "free", "global") is None
    assert cell(http, "pro", "global") == "50/second"
    assert cell(http, "free", "endpoint:ai") == "2/minute"
    assert cell(http, "free", "endpoint:pdf") is None
    assert cell(http, "pro", "endpoint:pdf") == "4/minute"


def test_cell_shows_algorithm_and_shadow(ops_app: Flask) -> None:
    """A limit's own algorithm and its shadow flag are set from the cell's form and shown
    in the cell; "app default" clears the algorithm again."""
    http = ops_app.test_client()
    form = {"tier": "user", "rate": "5/minute", "algorithm": "fixed_window", "shadow": "on"}
    status, html = post(http, "/quota/plans/free/limit", "/quota/plans", **form)
    assert status == 200 and "is now 5/minute (fixed_window, shadow)" in html
    td = re.search(r'<td data-plan="free" data-row="user"[^>]*>(.*?)</td>', page(http), re.S)
    assert td is not None
    assert '<span class="badge algorithm"' in td.group(1) and ">fixed_window<" in td.group(1)
    assert '<span class="badge shadow"' in td.group(1)
    status, _ = post(http, "/quota/plans/free/limit", "/quota/plans", tier="user", rate="5/minute",
                     algorithm="")  # fmt: skip
    assert status == 200
    [free] = [p for p in QuotaAdmin(ops_app.extensions["quota"].sql, actor="t").plans()
              if p.name == "free"]  # fmt: skip
    user = next(x for x in free.limits if x.tier == "user")
    assert (user.algorithm, user.shadow) == (None, False)


def test_a_resource_set_to_credits_is_spent_from_a_balance(ops_app: Flask) -> None:
    """The editor takes ``credits`` where it takes a rate: the cell says so, and the
    resource's view answers 402 (nothing granted yet) where it counted a rate."""
    http = ops_app.test_client()
    assert http.post("/infer", headers={"X-User": "bo"}).status_code == 200
    status, html = post(http, "/quota/plans/free/limit", "/quota/plans", tier="endpoint",
                        resource="ai", rate="credits", algorithm="")  # fmt: skip
    assert status == 200 and "is now credits" in html
    assert cell(http, "free", "endpoint:ai") == "credits"
    reply = http.post("/infer", headers={"X-User": "bo"})
    assert reply.status_code == 402 and reply.get_json()["tier"] == "credits"


def test_unknown_algorithm_is_refused(ops_app: Flask) -> None:
    """An algorithm that is not one of QUOTA_ALGORITHM's choices: 400, named, nothing saved."""
    http = ops_app.test_client()
    before = snapshot(ops_app)
    status, html = post(http, "/quota/plans/free/limit", "/quota/plans", tier="user",
                        rate="5/minute", algorithm="leaky_bucket")  # fmt: skip
    assert status == 400 and "unknown algorithm &#39;leaky_bucket&#39;" in html
    assert snapshot(ops_app) == before


def test_add_rate_form_names_the_plan_in_a_field(ops_app: Flask) -> None:
    """The "add a rate" form picks the plan in a select; a new resource becomes a new row."""
    http = ops_app.test_client()
    status, _ = post(http, "/quota/plans/limit", "/quota/plans", plan="pro", tier="endpoint",
                     resource="bulk_search", rate="60/minute", algorithm="")  # fmt: skip
    assert status == 200
    endpoints = ["endpoint:ai", "endpoint:bulk_search", "endpoint:pdf"]
    assert rows(http) == ["global", "tenant", "user", *endpoints, "concurrent"]
    assert cell(http, "pro", "endpoint:bulk_search") == "60/minute"
    assert cell(http, "free", "endpoint:bulk_search") is None


def test_create_plan_comes_last_and_is_audited(ops_app: Flask) -> None:
    """A new plan is the last column, without rates, with its description; audited."""
    http = ops_app.test_client()
    status, html = post(http, "/quota/plans/new", "/quota/plans", name="team",
                        description="Small teams")  # fmt: skip
    assert status == 200 and "Plan team created" in html
    assert columns(http) == ["free", "pro", "team"]
    assert "Small teams" in page(http)
    assert all(cell(http, "team", row) is None for row in rows(http))
    assert audit_actions(ops_app)[-1] == ("dashboard:ops", "plan.create", "plan:team")
    status, _ = post(http, "/quota/plans/team/limit", "/quota/plans", tier="user", rate="9/minute")
    assert status == 200 and cell(http, "team", "user") == "9/minute"


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"name": ""}, "plan name &#39;&#39; must be"),
        ({"name": "tab\there"}, "plan name &#39;tab\\there&#39;"),
        ({"name": "x" * 65}, "must be 1-64 printable"),
        ({"name": "free"}, "a plan named &#39;free&#39; exists already"),
        ({"name": "ok", "description": "line\nbreak"}, "description must be"),
    ],
)
def test_bad_plan_is_refused_and_nothing_changes(
    ops_app: Flask, form: dict[str, str], message: str
) -> None:
    """An invalid or duplicate name, or a bad description: 400 with the reason, no change."""
    http = ops_app.test_client()
    before = snapshot(ops_app)
    status, html = post(http, "/quota/plans/new", "/quota/plans", **form)
    assert status == 400 and 'id="form-error"' in html and message in html
    assert snapshot(ops_app) == before


def test_delete_plan_is_refused_while_clients_use_it(ops_app: Flask) -> None:
    """A plan with clients (revoked ones too) is not deleted: the page says why; once no
    client is on it, it goes, audited with what it was."""
    http = ops_app.test_client()
    post(http, "/quota/plans/new", "/quota/plans", name="team")
    status, html = post(http, "/quota/clients/new", "/quota/clients", name="acme", plan="team")
    client_id = re.search(r"<td>(\d+)</td>\s*<td><a [^>]*>acme</a>", html)
    assert status == 200 and client_id is not None
    post(http, f"/quota/clients/{client_id.group(1)}/revoke", "/quota/clients")
    before = snapshot(ops_app)
    status, html = post(http, "/quota/plans/team/delete", "/quota/plans")
    assert status == 400
    assert "plan &#39;team&#39; is used by 1 client(s) (1 of them revoked)" in html
    assert snapshot(ops_app) == before
    post(http, f"/quota/clients/{client_id.group(1)}/plan", "/quota/clients", plan="pro")
    status, html = post(http, "/quota/plans/team/delete", "/quota/plans")
    assert status == 200 and "Plan team deleted" in html
    assert columns(http) == ["free", "pro"]
    assert audit_actions(ops_app)[-1] == ("dashboard:ops", "plan.delete", "plan:team")


def test_default_and_anonymous_plans_cannot_be_deleted(tmp_path: Path) -> None:
    """QUOTA_DEFAULT_PLAN and QUOTA_ANONYMOUS_PLAN are refused by name, and show no
    delete button; an unknown plan is refused too."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH}, QUOTA_PLANS=PLANS,
                        QUOTA_ANONYMOUS_PLAN="pro")  # fmt: skip
    http = app.test_client()
    assert "Delete plan" not in page(http)
    before = snapshot(app)
    for plan, message in (("free", "QUOTA_DEFAULT_PLAN"), ("pro", "QUOTA_ANONYMOUS_PLAN"),
                          ("gold", "unknown plan &#39;gold&#39;")):  # fmt: skip
        status, html = post(http, f"/quota/plans/{plan}/delete", "/quota/plans")
        assert status == 400 and message in html, plan
    assert snapshot(app) == before


def test_remove_one_rate(ops_app: Flask) -> None:
    """Removing a cell's rate empties it, audited, and that tier no longer limits the plan."""
    http = ops_app.test_client()
    status, html = post(http, "/quota/plans/free/unset", "/quota/plans", tier="endpoint",
                        resource="ai")  # fmt: skip
    assert status == 200 and "Plan free: endpoint ai has no rate now" in html
    assert "endpoint:ai" not in rows(http)  # no plan has it any more: the row goes
    assert audit_actions(ops_app)[-1] == ("dashboard:ops", "plan.limit.delete", "plan:free")
    # ai was 2/minute; the user tier (3/minute) is what limits /infer now.
    statuses = [http.post("/infer", headers={"X-User": "bo"}).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"tier": "endpoint", "resource": "pdf"}, "no endpoint pdf rate to remove"),
        ({"tier": "global"}, "no global rate to remove"),
        ({"tier": "sideways"}, "unknown tier &#39;sideways&#39;"),
        ({"tier": "endpoint"}, "needs a resource, e.g. ai_inference"),
    ],
)
def test_bad_remove_is_refused_and_nothing_changes(
    ops_app: Flask, form: dict[str, str], message: str
) -> None:
    """Removing a rate the plan does not have, or naming a bad tier: 400, no change."""
    http = ops_app.test_client()
    before = snapshot(ops_app)
    status, html = post(http, "/quota/plans/free/unset", "/quota/plans", **form)
    assert status == 400 and message in html
    assert "--resource" not in html  # the CLI's hint, not the dashboard's
    assert snapshot(ops_app) == before


@pytest.mark.parametrize(
    ("url", "form"),
    [
        ("/quota/plans/new", {"name": "team"}),
        ("/quota/plans/pro/delete", {}),
        ("/quota/plans/free/unset", {"tier": "user"}),
        ("/quota/plans/free/concurrent", {"concurrent": "3"}),
        ("/quota/plans/limit", {"plan": "free", "tier": "user", "rate": "99/minute"}),
    ],
)
def test_plan_changes_without_csrf_are_refused(
    ops_app: Flask, url: str, form: dict[str, str]
) -> None:
    """Each plan-changing POST without (or with a forged) CSRF token: 400, nothing changed."""
    http = ops_app.test_client()
    before = snapshot(ops_app)
    for data in (form, {**form, "csrf_token": "forged"}):
        response = http.post(url, headers=OPS, data=data)
        assert response.status_code == 400 and b"CSRF" in response.data
    assert snapshot(ops_app) == before


@pytest.mark.skipif(
    "QUOTA_PLANS_SOURCE" not in {key for key, _, _ in reference()},
    reason="QUOTA_PLANS_SOURCE is not a setting of this version",
)
def test_config_owned_plans_are_read_only(tmp_path: Path) -> None:
    """With QUOTA_PLANS_SOURCE=config the page says why it is read-only, offers no
    forms, and changes POSTed anyway are refused (403) with nothing saved."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH}, QUOTA_PLANS=PLANS,
                        QUOTA_PLANS_SOURCE="config")  # fmt: skip
    http = app.test_client()
    html = page(http)
    assert 'id="plans-read-only"' in html and "QUOTA_PLANS_SOURCE" in html
    assert 'id="new-plan"' not in html and "Delete plan" not in html
    token = csrf_from(http, "/quota/clients")
    before = snapshot(app)
    response = http.post("/quota/plans/new", headers=OPS, data={"name": "x", "csrf_token": token})
    assert response.status_code == 403
    assert snapshot(app) == before


def test_an_edit_from_a_stale_page_is_refused_and_says_reload(ops_app: Flask) -> None:
    """Two operators load the plans page; one saves free's user rate, then the other
    saves from the page loaded before: refused with 409 and "reload", the first change
    kept. Saving again from a freshly loaded page works."""
    first, second = ops_app.test_client(), ops_app.test_client()
    stale = page(second)
    token = re.search(
        r'action="/quota/plans/free/limit">.*?name="based_on" value="([0-9a-f]+)"', stale, re.S
    )
    assert token is not None, "the cell form carries the plan's state"
    status, _ = post(
        first, "/quota/plans/free/limit", "/quota/plans",
        tier="user", resource="", rate="7/minute", based_on=token.group(1),
    )  # fmt: skip
    assert status == 200 and cell(first, "free", "user") == "7/minute"
    status, body = post(
        second, "/quota/plans/free/limit", "/quota/plans",
        tier="user", resource="", rate="9/minute", based_on=token.group(1),
    )  # fmt: skip
    assert status == 409 and "reload" in body
    assert cell(second, "free", "user") == "7/minute"
    fresh = re.search(
        r'action="/quota/plans/free/limit">.*?name="based_on" value="([0-9a-f]+)"',
        page(second),
        re.S,
    )
    assert fresh is not None and fresh.group(1) != token.group(1)
    status, _ = post(
        second, "/quota/plans/free/limit", "/quota/plans",
        tier="user", resource="", rate="9/minute", based_on=fresh.group(1),
    )  # fmt: skip
    assert status == 200 and cell(second, "free", "user") == "9/minute"


# -- concurrency and units -----------------------------------------------------------


def test_concurrent_row_sets_and_clears_a_plans_bound(ops_app: Flask) -> None:
    """The matrix's concurrent row: a plan's bound is set from its cell (shown, audited,
    in the snapshot requests read), then cleared with an empty field."""
    http = ops_app.test_client()
    assert cell(http, "free", "concurrent") is None
    status, html = post(http, "/quota/plans/free/concurrent", "/quota/plans", concurrent="4")
    assert status == 200 and "at most 4 requests of one caller in flight" in html
    assert cell(http, "free", "concurrent") == "4"
    assert cell(http, "pro", "concurrent") is None
    assert audit_actions(ops_app)[-1] == ("dashboard:ops", "plan.concurrent.set", "plan:free")
    sql = ops_app.extensions["quota"].sql
    assert sql.load()["free"].concurrent == 4
    status, html = post(http, "/quota/plans/free/concurrent", "/quota/plans", concurrent="")
    assert status == 200 and "no bound on requests in flight" in html
    assert cell(http, "free", "concurrent") is None
    assert sql.load()["free"].concurrent is None


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "9999999999"])
def test_bad_concurrency_is_refused_and_nothing_changes(ops_app: Flask, value: str) -> None:
    """A bound that is not a whole number of at least 1: 400 with the reason, no change."""
    http = ops_app.test_client()
    before = snapshot(ops_app)
    status, html = post(http, "/quota/plans/free/concurrent", "/quota/plans", concurrent=value)
    assert status == 400 and 'id="form-error"' in html and "at least 1" in html
    assert snapshot(ops_app) == before


def test_a_resources_unit_is_edited_in_its_cell(ops_app: Flask) -> None:
    """An endpoint cell's form sets the resource's unit: shown as a badge, audited, and
    counted by the identity page's buckets; an empty unit goes back to requests."""
    http = ops_app.test_client()
    status, html = post(http, "/quota/plans/free/limit", "/quota/plans", tier="endpoint",
                        resource="ai", rate="2000/hour", unit="tokens")  # fmt: skip
    assert status == 200 and "is now 2000/hour (in tokens)" in html
    td = re.search(r'<td data-plan="free" data-row="endpoint:ai"[^>]*>(.*?)</td>', page(http), re.S)
    assert (
        td is not None and '<span class="badge unit"' in td.group(1) and ">tokens<" in td.group(1)
    )
    assert audit_actions(ops_app)[-1] == ("dashboard:ops", "plan.limit.set", "plan:free")
    ops_app.extensions["quota"].sql.refresh()
    http.post("/infer", headers={"X-User": "bo"})
    info = http.get("/quota/api/identity/id=bo", headers=OPS).get_json()
    units = {b["name"]: b["unit"] for b in info["buckets"]}
    assert units == {"user": "requests", "ai (POST)": "tokens"}
    assert "<td>tokens</td>" in http.get("/quota/identity/id=bo", headers=OPS).get_data(
        as_text=True
    )
    status, _ = post(http, "/quota/plans/free/limit", "/quota/plans", tier="endpoint",
                     resource="ai", rate="2000/hour", unit="")  # fmt: skip
    assert status == 200
    [free] = [p for p in QuotaAdmin(ops_app.extensions["quota"].sql, actor="t").plans()
              if p.name == "free"]  # fmt: skip
    assert next(x for x in free.limits if x.resource == "ai").unit is None


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"tier": "endpoint", "resource": "ai", "unit": "Tokens!"}, "lowercase words"),
        ({"tier": "user", "unit": "tokens"}, "the user tier counts requests"),
    ],
)
def test_bad_unit_is_refused_and_nothing_changes(
    ops_app: Flask, form: dict[str, str], message: str
) -> None:
    """A malformed unit, or one on a tier that counts requests: 400, named, nothing saved."""
    http = ops_app.test_client()
    before = snapshot(ops_app)
    status, html = post(http, "/quota/plans/free/limit", "/quota/plans", rate="5/minute", **form)
    assert status == 400 and 'id="form-error"' in html and message in html
    assert snapshot(ops_app) == before


def test_the_overview_counts_a_resources_unit(ops_app: Flask) -> None:
    """Once ai counts tokens, the overview's top identities and near-limit list say so,
    in its JSON and on the page; the user tier still counts requests."""
    http = ops_app.test_client()
    post(http, "/quota/plans/free/limit", "/quota/plans", tier="endpoint", resource="ai",
         rate="2/minute", unit="tokens")  # fmt: skip
    ops_app.extensions["quota"].sql.refresh()
    for _ in range(2):
        http.post("/infer", headers={"X-User": "bo"})
    flush(ops_app)
    data = http.get("/quota/api/overview", headers=OPS).get_json()
    top = next(r for r in data["top"] if r["tag"] == "id=bo")
    assert top["closest"] == {"name": "ai (POST)", "remaining": 0, "limit": 2, "unit": "tokens"}
    near = {r["bucket"]: r["unit"] for r in data["near_limit"] if r["tag"] == "id=bo"}
    assert near["ai (POST)"] == "tokens"
    assert near.get("user", "requests") == "requests"
    assert "0/2 tokens left" in http.get("/quota/", headers=OPS).get_data(as_text=True)


@pytest.mark.parametrize(("source", "interval"), [("config", None), ("database", 1.2)])
def test_the_plans_page_names_the_sync_interval_it_runs_with(
    tmp_path: Path, source: str, interval: float | None
) -> None:
    """The page says how soon a change reaches every worker by the setting in force
    (QUOTA_SYNC_INTERVAL, 0.5 s unless set), never a fixed "two seconds"; read-only, it
    says a change to QUOTA_PLANS is applied at the next start."""
    config: dict[str, Any] = {"QUOTA_PLANS_SOURCE": source}
    if interval is not None:
        config["QUOTA_SYNC_INTERVAL"] = interval
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH}, QUOTA_PLANS=PLANS, **config)
    try:
        html = page(app.test_client())
        text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
        assert "two seconds" not in text and not re.search(r"(?<![\d.])2 s\b", text)
        expected = "1.2 s" if interval else "0.5 s"
        assert f"within the sync interval (QUOTA_SYNC_INTERVAL, {expected})" in text, text
        assert ("at the next start" in text) is (source == "config")
    finally:
        app.extensions["quota"].sql.close()


def test_the_networks_page_names_the_sync_interval(ops_app: Flask) -> None:
    html = ops_app.test_client().get("/quota/networks", headers=OPS).get_data(as_text=True)
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "within the sync interval (QUOTA_SYNC_INTERVAL, 0.5 s)" in text
    assert not re.search(r"(?<![\d.])2 s\b", text)
