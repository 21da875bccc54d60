"""The dashboard blueprint: closed by default, Basic or callable auth, CSRF, escaping."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from flask import Flask, request

from flask_quota import Quota
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.dashboards import HASH, OPS, basic, csrf_from, dashboard_app, flush

XSS = "<script>alert(1)</script>"

URLS = ["/quota/", "/quota/api/overview", "/quota/chart.svg", "/quota/identity/ip=127.0.0.1",
        "/quota/api/identity/ip=127.0.0.1", "/quota/identity?q=1.2.3.4"]  # fmt: skip


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(1_700_000_010.0)  # 22:13:30 UTC: mid-minute, 3 minutes past a tick


@pytest.fixture
def frozen_ops_app(tmp_path: Path, clock: FrozenClock) -> Flask:
    """``ops_app`` on a clock that moves only when told: what a test reads back "for
    this minute" (usage, the chart, a bucket's refill) cannot change under it."""
    return dashboard_app(tmp_path, MemoryStorage(clock), QUOTA_DASHBOARD_USERS={"ops": HASH})


def test_closed_without_configuration(tmp_path: Path) -> None:
    """With no auth configured, every dashboard URL is 401 and shows no usage data."""
    app = dashboard_app(tmp_path)
    http = app.test_client()
    http.post("/infer", headers={"X-User": "secret-customer"})
    flush(app)
    for url in URLS:
        response = http.get(url, headers=OPS)
        assert response.status_code == 401, url
        assert b"secret-customer" not in response.data
    assert http.post("/quota/identity/ip=127.0.0.1/reset").status_code == 401


def test_basic_auth_wrong_and_right(ops_app: Flask) -> None:
    """Basic auth: no or wrong credentials get 401 with a challenge; the right ones get in."""
    http = ops_app.test_client()
    assert http.get("/quota/").status_code == 401
    wrong = http.get("/quota/api/overview", headers=basic("ops", "nope"))
    assert wrong.status_code == 401 and "Basic" in wrong.headers["WWW-Authenticate"]
    assert b"allowed" not in wrong.data
    assert http.get("/quota/api/overview", headers=OPS).status_code == 200


def test_login_brute_force_is_limited(frozen_ops_app: Flask) -> None:
    """After 10 failed logins from one IP, a client that never logged in waits (429) even
    with the right password (else it could test guesses); other IPs are unaffected."""
    http = frozen_ops_app.test_client()
    codes = [http.get("/quota/", headers=basic("ops", f"guess{i}")).status_code for i in range(10)]
    assert codes == [401] * 10
    blocked = http.get("/quota/", headers=basic("ops", "guess-again"))
    assert blocked.status_code == 429 and blocked.headers["Retry-After"] == "60"
    assert http.get("/quota/", headers=OPS).status_code == 429
    other_ip = http.get("/quota/", headers=OPS, environ_base={"REMOTE_ADDR": "10.9.9.9"})
    assert other_ip.status_code == 200


def test_callable_auth(tmp_path: Path) -> None:
    """QUOTA_DASHBOARD_AUTH decides with the host's own login; its name is the operator."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_AUTH=lambda: "alice" if _header("X-Op") else None)
    http = app.test_client()
    assert http.get("/quota/").status_code == 401
    page = http.get("/quota/", headers={"X-Op": "1"})
    assert page.status_code == 200 and b"alice" in page.data


def _header(name: str) -> str | None:
    return request.headers.get(name)


def test_bad_auth_config_is_refused(tmp_path: Path) -> None:
    """Plain-text passwords or a non-callable auth fail at start-up with the key's name."""
    with pytest.raises(ValueError, match="QUOTA_DASHBOARD_USERS"):
        dashboard_app(tmp_path / "a", QUOTA_DASHBOARD_USERS={"ops": "plaintext"})
    with pytest.raises(ValueError, match="QUOTA_DASHBOARD_AUTH"):
        dashboard_app(tmp_path / "b", QUOTA_DASHBOARD_AUTH="yes")


def test_needs_a_secret_key(tmp_path: Path) -> None:
    """Mounting without app.secret_key is refused: CSRF tokens need it."""
    app = Flask(__name__, instance_path=str(tmp_path / "i"))
    app.config["QUOTA_DASHBOARD_URL"] = "/quota"
    with pytest.raises(ValueError, match="secret_key"):
        Quota(app, storage=MemoryStorage())


def test_not_mounted_by_default(tmp_path: Path) -> None:
    """Without QUOTA_DASHBOARD_URL there is no dashboard."""
    app = Flask(__name__, instance_path=str(tmp_path / "i"))
    Quota(app, storage=MemoryStorage())
    assert app.test_client().get("/quota/").status_code == 404
    assert "quota_dashboard" not in app.blueprints


def test_security_headers(ops_app: Flask) -> None:
    """A CSP without inline script, no framing, no sniffing, no caching."""
    response = ops_app.test_client().get("/quota/", headers=OPS)
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "<script>" not in response.get_data(as_text=True).replace(
        '<script src="/quota/static/dashboard.js" defer></script>', ""
    )


def test_request_appears_on_the_overview(frozen_ops_app: Flask) -> None:
    """Usage of the API shows up in the overview JSON, with the top identity; the
    dashboard reads the minutes of the clock the counts were stamped with."""
    ops_app = frozen_ops_app
    http = ops_app.test_client()
    http.post("/infer", headers={"X-User": "ada"})
    http.post("/infer", headers={"X-User": "ada"})
    http.post("/infer", headers={"X-User": "ada"})  # endpoint tier (2/minute) denies
    flush(ops_app)
    data = http.get("/quota/api/overview", headers=OPS).get_json()
    assert (data["allowed"], data["denied"]) == (2, 1)  # requests, not tier checks
    assert data["tiers"]["ai"] == {"allowed": 2, "denied": 1, "shadow_denied": 0}
    top = data["top"][0]
    assert (top["tag"], top["name"], top["requests"]) == ("id=ada", "ada", 3)
    assert top["closest"] == {"name": "ai (POST)", "remaining": 0, "limit": 2, "unit": "requests"}
    assert data["storage"]["backend"] == "memory" and data["storage"]["up"]
    svg = http.get("/quota/chart.svg", headers=OPS)
    assert svg.content_type.startswith("image/svg+xml")
    assert b"allowed 2" in svg.data and b"denied 1" in svg.data


def test_dashboard_is_not_rate_limited(ops_app: Flask) -> None:
    """Dashboard requests neither count against nor get blocked by the app's quotas."""
    http = ops_app.test_client()
    for _ in range(3):
        http.post("/infer")  # spends the anonymous user tier (3/minute)
    for _ in range(10):
        response = http.get("/quota/api/overview", headers=OPS)
        assert response.status_code == 200
        assert "X-RateLimit-Limit" not in response.headers
    assert http.get("/quota/static/dashboard.css", headers=OPS).status_code == 200


def test_identity_page_reads_buckets_without_consuming(ops_app: Flask) -> None:
    """The identity page shows remaining per tier, and viewing it charges nothing."""
    http = ops_app.test_client()
    http.post("/infer", headers={"X-User": "ada"})
    for _ in range(3):
        info = http.get("/quota/api/identity/id=ada", headers=OPS).get_json()
    buckets = {b["name"]: b["remaining"] for b in info["buckets"]}
    assert buckets == {"user": 2, "ai (POST)": 1}
    assert b"ai (POST)" in http.get("/quota/identity/id=ada", headers=OPS).data


def test_post_without_csrf_changes_nothing(ops_app: Flask) -> None:
    """A reset POSTed without a CSRF token is refused and the buckets stay spent."""
    http = ops_app.test_client()
    for _ in range(3):
        http.post("/infer", headers={"X-User": "ada"})
    refused = http.post("/quota/identity/id=ada/reset", headers=OPS)
    assert refused.status_code == 400
    refused = http.post("/quota/identity/id=ada/reset", headers=OPS, data={"csrf_token": "forged"})
    assert refused.status_code == 400
    assert http.post("/infer", headers={"X-User": "ada"}).status_code == 429
    token = csrf_from(http, "/quota/identity/id=ada")
    done = http.post("/quota/identity/id=ada/reset", headers=OPS, data={"csrf_token": token})
    assert done.status_code == 302
    assert http.post("/infer", headers={"X-User": "ada"}).status_code == 200


def test_hostile_identity_renders_escaped(ops_app: Flask) -> None:
    """An identity made of markup is shown as text on every page, never as markup."""
    http = ops_app.test_client()
    http.post("/infer", headers={"X-User": XSS})
    flush(ops_app)
    overview = http.get("/quota/", headers=OPS).get_data(as_text=True)
    assert XSS not in overview and "&lt;script&gt;alert(1)&lt;/script&gt;" in overview
    tag = http.get("/quota/api/overview", headers=OPS).get_json()["top"][0]["tag"]
    page = http.get(f"/quota/identity/{tag}", headers=OPS, follow_redirects=True)
    assert page.status_code == 200
    assert XSS not in page.get_data(as_text=True)
    svg = http.get("/quota/chart.svg", headers=OPS, query_string={"identity": tag}).data
    assert XSS.encode() not in svg


def test_unknown_identity_tags_are_404(ops_app: Flask) -> None:
    """Only tags the extension builds are accepted in URLs."""
    http = ops_app.test_client()
    assert http.get("/quota/identity/whatever", headers=OPS).status_code == 404
    assert http.get("/quota/chart.svg?identity=../../x", headers=OPS).status_code == 404


def _top_rows(html: str) -> list[tuple[str, str]]:
    """(kind badge, name) of each top-identity row, as a reader sees them."""
    body = html.split('<tbody id="top">', 1)[1].split("</tbody>", 1)[0]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        kind = re.search(r'<span class="kind[^"]*">([^<]*)</span>', row)
        name = re.search(r"<a [^>]*>([^<]*)</a>", row)
        rows.append((kind.group(1) if kind else "", name.group(1) if name else ""))
    return rows


def test_identity_named_like_an_ip_is_not_shown_as_that_ip(ops_app: Flask) -> None:
    """An identity called "IP 6.6.6.6" and the anonymous caller at 6.6.6.6 are two rows
    that read differently: a kind badge (user / IP) apart from the verbatim name."""
    http = ops_app.test_client()
    http.post("/infer", headers={"X-User": "IP 6.6.6.6"})
    http.post("/infer", environ_base={"REMOTE_ADDR": "6.6.6.6"})
    flush(ops_app)
    rows = _top_rows(http.get("/quota/", headers=OPS).get_data(as_text=True))
    assert sorted(rows) == [("IP", "6.6.6.6"), ("user", "IP 6.6.6.6")], rows
    top = http.get("/quota/api/overview", headers=OPS).get_json()["top"]
    assert sorted((r["kind"], r["name"]) for r in top) == [
        ("ip", "6.6.6.6"),
        ("user", "IP 6.6.6.6"),
    ]
    for tag, kind in (("id=IP%206.6.6.6", "user"), ("ip=6.6.6.6", "IP")):
        page = http.get(f"/quota/identity/{tag}", headers=OPS, follow_redirects=True)
        heading = re.search(r"<h1>(.*?)</h1>", page.get_data(as_text=True), re.S)
        assert heading is not None
        assert f'">{kind}</span> <span class="identity">' in heading.group(1), heading.group(1)


def test_near_limit_lists_identities_above_80_percent_of_a_tier(ops_app: Flask) -> None:
    """Identities with a bucket at least 80% used (QUOTA_NEAR_LIMIT) are listed with the tier and
    remaining/limit (JSON and page); one at 67% or less is not."""
    http = ops_app.test_client()
    for _ in range(2):
        http.post("/infer", headers={"X-User": "ada"})  # ai 2/minute: 0 left (100%)
    http.post("/infer", headers={"X-User": "bob"})  # ai 1/2 left, user 2/3 left
    http.get("/items", headers={"X-User": "cy"})
    http.get("/items", headers={"X-User": "cy"})  # user 1/3 left: 67%, not above 80%
    flush(ops_app)
    near = http.get("/quota/api/overview", headers=OPS).get_json()["near_limit"]
    assert [(r["tag"], r["tier"], r["bucket"], r["remaining"], r["limit"], r["used_percent"])
            for r in near] == [("id=ada", "endpoint", "ai (POST)", 0, 2, 100)]  # fmt: skip
    page = http.get("/quota/", headers=OPS).get_data(as_text=True)
    body = page.split('<tbody id="near-limit"', 1)[1].split("</tbody>", 1)[0]
    assert ">ada</a>" in body and "endpoint: ai (POST)" in body and "0/2" in body
    assert "bob" not in body and "cy" not in body


def test_near_limit_list_follows_quota_near_limit(tmp_path: Path) -> None:
    """The list's line is QUOTA_NEAR_LIMIT's (the signal's rule): at 0.5, a bucket half
    used is listed, and the page says 50%."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH}, QUOTA_NEAR_LIMIT=0.5)
    http = app.test_client()
    http.post("/infer", headers={"X-User": "bob"})  # ai 1 of 2 used: 50%
    flush(app)
    near = http.get("/quota/api/overview", headers=OPS).get_json()["near_limit"]
    assert [(r["tag"], r["bucket"], r["used_percent"]) for r in near] == [
        ("id=bob", "ai (POST)", 50)
    ]
    assert "at least 50% used" in http.get("/quota/", headers=OPS).get_data(as_text=True)


def _svg_texts(svg: bytes) -> list[tuple[str, float, float]]:
    """(text, x, y) of every <text> of an SVG."""
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    return [
        ("".join(node.itertext()), float(node.get("x", 0)), float(node.get("y", 0)))
        for node in ET.fromstring(svg).iter(f"{ns}text")
    ]


def test_chart_has_a_time_axis_and_a_value_axis(frozen_ops_app: Flask, clock: FrozenClock) -> None:
    """The last-hour chart labels time every 10 minutes (HH:MM UTC, the current minute's
    hour among them) and values from 0 up to a round maximum at or above the peak."""
    import time

    http = frozen_ops_app.test_client()
    for _ in range(3):
        http.post("/infer", headers={"X-User": "ada"})
    flush(frozen_ops_app)
    texts = _svg_texts(http.get("/quota/chart.svg", headers=OPS).data)
    times = [(t, x) for t, x, _ in texts if re.fullmatch(r"\d\d:\d\d", t)]
    assert len(times) == 6, texts  # an hour holds six whole 10 minutes
    minutes = [int(t[:2]) * 60 + int(t[3:]) for t, _ in times]
    assert all(m % 10 == 0 for m in minutes)
    assert all((b - a) % 1440 == 10 for a, b in itertools.pairwise(minutes))
    now = time.gmtime(clock.seconds)  # 22:13
    assert times[-1][0] == f"{now.tm_hour:02d}:{now.tm_min // 10 * 10:02d}", times
    xs = [x for _, x in times]
    assert all(b - a > 60 for a, b in itertools.pairwise(xs))  # labels never overlap
    assert "UTC" in [t for t, _, _ in texts]
    # The "ai" panel (peak 2 allowed, 1 denied this minute): values 0, 1, 2.
    values = [t for t, x, _ in texts if x < 60 and re.fullmatch(r"\d+k?", t)]
    assert values[:3] == ["0", "1", "2"], texts


def test_value_axis_rounds_up_and_labels_stay_apart() -> None:
    """The value axis ends on 1, 2 or 5 times a power of ten at or above the peak; its
    labels, and the two end labels, are at least a text line apart."""
    from dashboard import chart

    for peak, top in ((0, 1), (1, 1), (3, 5), (7, 10), (11, 20), (480, 500), (12_000, 20_000)):
        built = chart.build({"t": {"allowed": [0, peak], "denied": [peak, peak]}}, [0, 1])
        [panel] = built.panels
        assert panel.y_ticks[-1].label == (f"{top // 1000}k" if top >= 10_000 else str(top))
        ys = sorted(t.pos for t in panel.y_ticks)
        assert all(b - a >= 13 for a, b in itertools.pairwise(ys)), ys
        assert abs(panel.allowed_y - panel.denied_y) >= chart.LABEL_GAP - 0.01


def test_end_labels_stay_inside_their_panel() -> None:
    """An end label is kept between its panel's title and the time axis, whichever line
    ends at the top of the axis: clamping one label never pushes the other out."""
    from dashboard import chart

    for last in ((5, 0), (0, 5), (5, 5), (0, 0), (5, 4), (1, 5)):
        built = chart.build({"t": {"allowed": [0, last[0]], "denied": [5, last[1]]}}, [0, 1])
        [panel] = built.panels
        for y in (panel.allowed_y, panel.denied_y):
            assert panel.plot_top + 8 <= y <= panel.plot_bottom + 4, (last, panel)
        assert abs(panel.allowed_y - panel.denied_y) >= chart.LABEL_GAP - 0.01, (last, panel)


def test_closest_to_limit_says_nothing_when_every_bucket_is_full(
    frozen_ops_app: Flask, clock: FrozenClock
) -> None:
    """A caller of the last minutes whose buckets have all refilled is not "closest to"
    any limit: the overview shows no bucket for it (a dash), not "user: 3/3 left"."""
    http = frozen_ops_app.test_client()
    http.post("/infer", headers={"X-User": "ada"})
    flush(frozen_ops_app)
    top = http.get("/quota/api/overview", headers=OPS).get_json()["top"][0]
    assert top["closest"] is not None and top["closest"]["remaining"] < top["closest"]["limit"]
    clock.advance(90)  # every bucket (3/minute, 2/minute) is full again
    flush(frozen_ops_app)
    data = http.get("/quota/api/overview", headers=OPS).get_json()
    (top,) = [row for row in data["top"] if row["tag"] == "id=ada"]
    assert top["closest"] is None
    page = http.get("/quota/", headers=OPS).get_data(as_text=True)
    row = re.search(r'<tbody id="top">(.*?)</tbody>', page, re.S)
    assert row is not None and "ada" in row.group(1)
    assert " left" not in row.group(1) and "\u2013" in row.group(1)  # an en dash: no bucket


def test_each_chart_panel_says_its_end_labels_are_this_minutes(frozen_ops_app: Flask) -> None:
    """The counts at a panel's right end are the current minute's, not the hour's: every
    panel of the chart says "this minute" above them, on the overview and a caller's page."""
    http = frozen_ops_app.test_client()
    for _ in range(3):
        http.post("/infer", headers={"X-User": "ada"})
    flush(frozen_ops_app)
    for url in ("/quota/chart.svg", "/quota/chart.svg?identity=id=ada"):
        svg = http.get(url, headers=OPS).get_data(as_text=True)
        panels = svg.split('<g class="panel">')[1:]
        assert len(panels) >= 2, svg
        for panel in panels:
            texts = re.findall(r"<text[^>]*>([^<]*)</text>", panel)
            assert "this minute" in texts, texts
            assert any(re.fullmatch(r"allowed \d+", t) for t in texts), texts


def test_a_token_resources_minute_chart_counts_tokens(tmp_path: Path, clock: FrozenClock) -> None:
    """A resource that counts tokens (``unit="tokens"``, a cost per request): its panel on
    the per-minute chart is titled in tokens and counts the 3 x 40 tokens admitted (and
    the 40 refused), not 3 requests; the caller's own tier still counts requests."""
    app = dashboard_app(
        tmp_path,
        MemoryStorage(clock),
        QUOTA_DASHBOARD_USERS={"ops": HASH},
        QUOTA_PLANS={"free": {"user": "100/minute", "resources": {"llm": "120/minute"}}},
    )

    @app.post("/llm")
    @Quota().limit(resource="llm", cost=40, unit="tokens")  # a decorator marks the view
    def llm() -> str:
        return "ok"

    http = app.test_client()
    statuses = [http.post("/llm", headers={"X-User": "ada"}).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    flush(app)
    svg = http.get("/quota/chart.svg", headers=OPS).get_data(as_text=True)
    panels = {
        re.findall(r'<text class="name"[^>]*>([^<]*)</text>', p)[0]: p
        for p in svg.split('<g class="panel">')[1:]
    }
    assert "llm (tokens)" in panels, list(panels)
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", panels["llm (tokens)"])
    assert "allowed 120" in texts and "denied 40" in texts, texts
    user = re.findall(r"<text[^>]*>([^<]*)</text>", panels["user"])
    assert "allowed 3" in user, user
