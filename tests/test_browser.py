"""The dashboard in a real browser: headless Chromium (Playwright) against a real HTTP server.

Every test gets a fresh demo app (tests/apps/dashboard_demo.py: memory storage, its
own SQLite instance folder) served by Werkzeug on a free loopback port; one browser
is shared by the module, with a new context (cookies, credentials) per test.

Needs Debian's /usr/bin/chromium (Playwright's own browser download is not used).
Without it the tests are skipped, loudly; with CI=true they fail instead.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, render_template
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Dialog,
    Locator,
    Page,
    Playwright,
    expect,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError

from tests.apps.dashboard_demo import serving
from tests.browsers import CHROMIUM, CHROMIUM_ARGS, require_chromium
from tests.servers import RedisServer

pytestmark = pytest.mark.browser

USER, PASSWORD = "ops", "browser-test-password"
XSS = "<script>alert(1)</script>"
LIVE_DEADLINE_MS = 3000  # a request must show on the overview this soon, without a reload


@dataclass
class Demo:
    app: Flask
    base: str

    def api(self, method: str, path: str, user: str | None = None) -> tuple[int, dict[str, str]]:
        """One API request (no proxy); returns the status and the response headers."""
        headers = {"X-User": user} if user is not None else {}
        request = urllib.request.Request(self.base + path, method=method, headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=5) as response:
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers)

    def url(self, path: str) -> str:
        return self.base + "/quota" + path


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    require_chromium()
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    env = {
        "DASHBOARD_DEMO_USER": USER,
        "DASHBOARD_DEMO_PASSWORD": PASSWORD,
        "DASHBOARD_DEMO_INSTANCE": str(tmp_path / "instance"),
        "DASHBOARD_DEMO_SECRET": "browser-test-secret",
    }
    with serving(env) as (app, base):
        yield Demo(app, base)


def _context(browser: Browser, width: int = 1280, height: int = 900, **kw: Any) -> BrowserContext:
    context = browser.new_context(viewport={"width": width, "height": height}, **kw)
    context.set_default_timeout(5000)
    # Loading a page is the server's work, slower on a loaded machine (CI runs four test
    # processes on two cores: a 5 s load timed out once); waits for an element keep 5 s.
    context.set_default_navigation_timeout(20_000)
    # The pages link their own icon; a stray /favicon.ico request would be API traffic
    # (an anonymous 404): keep it out of the counters the tests read, if one is made.
    context.route("**/favicon.ico", lambda route: route.abort())
    return context


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = _context(browser, http_credentials={"username": USER, "password": PASSWORD})
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def wait_for_top(demo: Demo, page: Page, name: str) -> None:
    """Until the usage flush has put ``name`` among the top identities (bounded)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        top = page.request.get(demo.url("/api/overview")).json()["top"]
        if any(row["name"] == name for row in top):
            return
        time.sleep(0.1)
    raise AssertionError(f"{name!r} never reached the top identities")


def plan_cell(page: Page, plan: str, row: str) -> Locator:
    """A cell of the plans matrix: ``row`` is a tier, or ``endpoint:<resource>``."""
    return page.locator(f'#plans td[data-plan="{plan}"][data-row="{row}"]')


def plan_rate(page: Page, plan: str, tier: str) -> str:
    return plan_cell(page, plan, tier).locator(".rate").inner_text()


def open_cell(page: Page, plan: str, row: str) -> Locator:
    """Unfold a matrix cell's edit forms; returns the cell."""
    cell = plan_cell(page, plan, row)
    cell.locator("summary").click()
    return cell


def _refused(browser: Browser, demo: Demo, credentials: dict[str, str] | None) -> None:
    """Opening the overview with these credentials gets a 401 and shows nothing."""
    anonymous = _context(browser, http_credentials=credentials)
    try:
        page = anonymous.new_page()
        statuses: list[int] = []
        page.on("response", lambda response: statuses.append(response.status))
        try:  # Chromium answers a 401 challenge it cannot meet with a network error
            response = page.goto(demo.url("/"))
            assert response is not None and response.status == 401
        except PlaywrightError as exc:
            assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc)
        assert statuses and set(statuses) == {401}, statuses
        expect(page.get_by_role("heading", name="Overview")).to_have_count(0)
        direct = anonymous.request.get(demo.url("/api/overview"))
        assert direct.status == 401 and "Basic" in direct.headers["www-authenticate"]
        assert "allowed" not in direct.text()
    finally:
        anonymous.close()


def test_login(browser: Browser, demo: Demo) -> None:
    """The operator's credentials open the dashboard; none or wrong ones get a 401."""
    _refused(browser, demo, None)
    _refused(browser, demo, {"username": USER, "password": "wrong"})
    ops = _context(browser, http_credentials={"username": USER, "password": PASSWORD})
    try:
        page = ops.new_page()
        response = page.goto(demo.url("/"))
        assert response is not None and response.status == 200
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        expect(page.locator(".operator")).to_have_text(USER)
    finally:
        ops.close()


def test_request_appears_live_on_overview(demo: Demo, page: Page) -> None:
    """A request sent to the API shows on the overview within 3 s, with no reload."""
    navigations: list[str] = []
    page.goto(demo.url("/"))
    expect(page.locator("#allowed")).to_have_text("0")
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    page.evaluate("window.__marker = 1")
    assert demo.api("GET", "/items", user="grace")[0] == 200
    expect(page.locator("#allowed")).to_have_text("1", timeout=LIVE_DEADLINE_MS)
    for _ in range(6):  # 5 admitted, then the ai endpoint (5/minute) denies
        demo.api("POST", "/infer", user="grace")
    # Whole requests: 1 + 5 admitted, 1 denied.
    expect(page.locator("#allowed")).to_have_text("6", timeout=LIVE_DEADLINE_MS)
    expect(page.locator("#denied")).to_have_text("1", timeout=LIVE_DEADLINE_MS)
    expect(page.locator("#top").get_by_role("link", name="grace")).to_be_visible()
    assert page.evaluate("window.__marker") == 1, "the page was reloaded"
    assert navigations == []


def test_open_identity_from_top_list(demo: Demo, page: Page) -> None:
    """Clicking a top identity opens its page with its current buckets."""
    for _ in range(3):
        assert demo.api("POST", "/infer", user="ada")[0] == 200
    page.goto(demo.url("/"))
    link = page.locator("#top").get_by_role("link", name="ada", exact=True)
    expect(link).to_be_visible(timeout=LIVE_DEADLINE_MS)
    link.click()
    # dashboard.js percent-encodes the tag ("id%3Dada"); the server renders "id=ada".
    expect(page).to_have_url(re.compile(re.escape(demo.url("/identity/id")) + "(=|%3D)ada$"))
    expect(page.locator("h1 .identity")).to_have_text("ada")
    expect(page.locator("#plan")).to_have_text("free")
    rows = page.locator("#buckets tbody tr")
    expect(rows).to_have_count(2)
    buckets = {
        cells[1]: (cells[2], int(cells[3]), int(cells[4]))
        for cells in (row.locator("td").all_inner_texts() for row in rows.all())
    }
    assert buckets.keys() == {"user", "ai (POST)"}
    # Token buckets refill while we look (user: one token per 2 s, ai: one per 12 s).
    rate, remaining, limit = buckets["user"]
    assert (rate, limit) == ("30/minute", 30) and 27 <= remaining < 30
    rate, remaining, limit = buckets["ai (POST)"]
    assert (rate, limit) == ("5/minute", 5) and 2 <= remaining <= 3


def test_plan_change_is_enforced(demo: Demo, page: Page) -> None:
    """Setting the free user rate to 2/minute in the Plans page makes the API deny the 3rd call."""
    page.goto(demo.url("/plans"))
    assert plan_rate(page, "free", "user") == "30/minute"
    open_cell(page, "free", "user")
    page.get_by_label("New rate for free user").fill("2/minute")
    with page.expect_navigation():
        page.get_by_role("button", name="Save free user").click()
    expect(page.locator(".flash.ok")).to_contain_text("is now 2/minute")
    assert plan_rate(page, "free", "user") == "2/minute"
    # The change reaches the limiter within 2 s (spec); wait for it, boundedly.
    deadline = time.monotonic() + 2.5
    probe = 0
    while demo.api("GET", "/items", user=f"probe-{probe}")[1].get("X-RateLimit-Limit") != "2":
        assert time.monotonic() < deadline, "the new rate was not enforced within 2.5 s"
        probe += 1
        time.sleep(0.1)
    statuses = [demo.api("GET", "/items", user="fresh-identity")[0] for _ in range(3)]
    assert statuses == [200, 200, 429]


def test_malformed_rate_shows_error_and_saves_nothing(demo: Demo, page: Page) -> None:
    """A malformed rate re-renders the form with the message (400) and changes nothing."""
    page.goto(demo.url("/plans"))
    open_cell(page, "free", "user")
    page.get_by_label("New rate for free user").fill("five per minute")
    with page.expect_navigation() as navigation:
        page.get_by_role("button", name="Save free user").click()
    response = navigation.value
    assert response is not None and response.status == 400
    expect(page.locator("#form-error")).to_be_visible()
    expect(page.locator("#form-error")).to_contain_text("five per minute")
    page.goto(demo.url("/plans"))
    assert plan_rate(page, "free", "user") == "30/minute"
    page.goto(demo.url("/audit"))
    expect(page.locator("#audit")).not_to_contain_text("plan.limit.set")
    assert demo.api("GET", "/items", user="nobody")[1]["X-RateLimit-Limit"] == "30"


def test_post_without_csrf_token_is_refused(demo: Demo, page: Page) -> None:
    """POSTs with no or a forged CSRF token get a 400 and change nothing."""
    page.goto(demo.url("/plans"))
    forged = page.request.post(
        demo.url("/plans/free/limit"), form={"tier": "user", "rate": "1000/minute"}
    )
    assert forged.status == 400 and "CSRF" in forged.text()
    # The page's own form with its token stripped, then with a forged one, submitted.
    for token in (None, "forged"):
        with page.expect_navigation() as navigation:
            page.evaluate(
                """(token) => {
                    const input = document.querySelector(
                        '#plans td[data-plan="free"][data-row="user"] input[name=rate]');
                    const form = input.form;
                    const csrf = form.querySelector("input[name=csrf_token]");
                    if (token === null) { csrf.remove(); } else { csrf.value = token; }
                    input.value = "999/minute";
                    form.submit();
                }""",
                token,
            )
        response = navigation.value
        assert response is not None and response.status == 400
        expect(page.locator("body")).to_contain_text("CSRF token missing or invalid")
        page.goto(demo.url("/plans"))
        assert plan_rate(page, "free", "user") == "30/minute"
    page.goto(demo.url("/audit"))
    expect(page.locator("#audit")).not_to_contain_text("plan.limit.set")
    assert demo.api("GET", "/items", user="nobody")[1]["X-RateLimit-Limit"] == "30"


def test_hostile_identity_is_text_and_csp_blocks_inline_script(demo: Demo, page: Page) -> None:
    """An identity made of <script> shows as text, no dialog fires, and CSP blocks inline code."""
    dialogs: list[str] = []
    csp_errors: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on(
        "console",
        lambda msg: csp_errors.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    assert demo.api("POST", "/infer", user=XSS)[0] == 200
    wait_for_top(demo, page, XSS)
    response = page.goto(demo.url("/"))  # rendered by the server (Jinja)
    assert response is not None
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    link = page.locator("#top").get_by_role("link", name=XSS, exact=True)
    expect(link).to_be_visible()
    expect(page.locator("#updated")).to_contain_text("Last update", timeout=LIVE_DEADLINE_MS)
    expect(link).to_be_visible()  # and again as rendered by dashboard.js
    link.click()
    expect(page.locator("h1 .identity")).to_have_text(XSS)
    for url in (demo.url("/"), page.url):
        page.goto(url)
        assert page.evaluate("document.scripts.length") == 1  # dashboard.js only
    # Inline script and inline event handlers do not run under the CSP.
    with pytest.raises(PlaywrightError, match="violates the following Content Security Policy"):
        page.add_script_tag(content="window.__injected = 1;")
    page.evaluate(
        """() => document.body.insertAdjacentHTML(
            "beforeend", '<img src="/quota/nothing.png" onerror="window.__handler = 1">')"""
    )
    page.wait_for_timeout(300)
    assert page.evaluate("typeof window.__injected") == "undefined"
    assert page.evaluate("typeof window.__handler") == "undefined"
    assert csp_errors, "Chromium reported no CSP violation"
    assert dialogs == []


LONG_TENANT = "a-tenant-organisation-with-a-name-of-sixty-four-characters-tot"


def test_no_horizontal_scroll_on_narrow_screens(browser: Browser, demo: Demo) -> None:
    """At 1280 and 390 px, the overview, plans, clients, tenants, blocks and identity pages never
    scroll sideways (wide tables scroll inside their own box)."""
    long_name = "customer-with-a-really-long-identifier-" * 3
    for _ in range(6):
        demo.api("POST", "/infer", user=long_name)
    for width, height in ((1280, 900), (390, 844)):
        ctx = _context(
            browser, width, height, http_credentials={"username": USER, "password": PASSWORD}
        )
        try:
            page = ctx.new_page()
            if width == 1280:
                wait_for_top(demo, page, long_name)
                page.goto(demo.url("/clients"))
                page.get_by_label("Name").fill("A client with a fairly long name, Inc.")
                page.get_by_label("Tenant (optional)").fill(LONG_TENANT)
                page.get_by_role("button", name="Create and show its key").click()
                expect(page.locator("#new-key")).to_be_visible()
            paths = ("/", "/plans", "/clients", "/blocks", "/identity/id=" + long_name,
                     "/identity/id=1", "/tenants", "/tenant/" + LONG_TENANT)  # fmt: skip
            for path in paths:
                page.goto(demo.url(path))
                if path == "/":
                    expect(page.locator("#top")).to_contain_text(long_name)
                    expect(page.locator("#updated")).to_contain_text("Last update")
                if path == "/plans":  # an unfolded cell form must not widen the page either
                    open_cell(page, "free", "user")
                overflow = page.evaluate(
                    "[document.documentElement.scrollWidth, window.innerWidth]"
                )
                assert overflow[0] <= overflow[1] == width, f"{path} at {width} px: {overflow}"
        finally:
            ctx.close()


def test_chart_series_are_labelled_with_text(demo: Demo, page: Page) -> None:
    """The chart names its series in text (allowed/denied), not by colour alone."""
    for _ in range(6):
        demo.api("POST", "/infer", user="lin")
    wait_for_top(demo, page, "lin")
    page.goto(demo.url("/"))
    legend = page.locator(".legend")
    expect(legend).to_contain_text("allowed")
    expect(legend).to_contain_text("denied")
    chart = page.locator("#chart")
    expect(chart).to_have_attribute("alt", re.compile("allowed and denied", re.I))
    assert page.evaluate("document.getElementById('chart').naturalWidth") > 0  # it loaded
    svg = page.request.get(demo.url("/chart.svg"))
    assert svg.ok and svg.headers["content-type"].startswith("image/svg+xml")
    texts = [
        "".join(node.itertext())
        for node in ET.fromstring(svg.text()).iter("{http://www.w3.org/2000/svg}text")
    ]
    assert "ai" in texts and "user" in texts, texts  # one panel per tier, named
    # Each panel labels both lines at their ends (this minute's counts).
    assert sum(bool(re.fullmatch(r"allowed \d+", t)) for t in texts) == 2, texts
    assert sum(bool(re.fullmatch(r"denied \d+", t)) for t in texts) == 2, texts


def test_outage_banner_appears_live_when_redis_stops(
    browser: Browser, tmp_path: Path, own_redis: RedisServer
) -> None:
    """With Redis storage, the open overview shows no banner; once redis-server stops, a
    banner saying the storage is down and which fail mode is active appears, no reload."""
    env = {
        "DASHBOARD_DEMO_USER": USER,
        "DASHBOARD_DEMO_PASSWORD": PASSWORD,
        "DASHBOARD_DEMO_INSTANCE": str(tmp_path / "instance"),
        "DASHBOARD_DEMO_SECRET": "browser-test-secret",
        "QUOTA_STORAGE_URL": own_redis.url,
        "QUOTA_STORAGE_TIMEOUT": "0.2",
        "QUOTA_FAIL_MODE": "closed",
    }
    ctx = _context(browser, http_credentials={"username": USER, "password": PASSWORD})
    with serving(env) as (app, base):
        try:
            demo = Demo(app, base)
            assert demo.api("POST", "/infer", user="ada")[0] == 200
            page = ctx.new_page()
            page.goto(demo.url("/"))
            expect(page.locator("#storage")).to_contain_text("redis · up")
            expect(page.locator("#outage")).to_be_hidden()
            page.evaluate("window.__marker = 1")
            own_redis.stop()
            banner = page.locator("#outage")
            expect(banner).to_be_visible(timeout=LIVE_DEADLINE_MS)
            expect(banner).to_contain_text("Storage redis is down")
            expect(banner).to_contain_text("Fail mode closed is active")
            expect(page.locator("#storage")).to_contain_text("redis · down")
            expect(page.locator("#allowed")).to_have_text("\u2013")  # unknown, not zero
            # An API request meets the dead storage (503): the breaker opens, on the page too.
            deadline = time.monotonic() + 5
            while not page.locator("#outage-breaker").is_visible():
                assert time.monotonic() < deadline, "the breaker never showed as open"
                assert demo.api("POST", "/infer", user="ada")[0] == 503
                page.wait_for_timeout(300)
            assert page.evaluate("window.__marker") == 1, "the page was reloaded"
            # Every other page says so as well, server-rendered.
            for path in ("/identity/id=ada", "/plans"):
                response = page.goto(demo.url(path))
                assert response is not None and response.status == 200
                expect(page.locator("#outage")).to_contain_text("is down")
        finally:
            ctx.close()


def test_identity_named_like_an_ip_reads_differently_live(demo: Demo, page: Page) -> None:
    """Rows rendered by dashboard.js keep the kind badge apart from the name: the identity
    "IP 127.0.0.1" and the anonymous caller at 127.0.0.1 read differently."""
    assert demo.api("GET", "/items", user="IP 127.0.0.1")[0] == 200
    assert demo.api("GET", "/items")[0] == 200
    wait_for_top(demo, page, "IP 127.0.0.1")
    page.goto(demo.url("/"))
    expect(page.locator("#updated")).to_contain_text("Last update", timeout=LIVE_DEADLINE_MS)
    rows = page.locator("#top tr")
    expect(rows).to_have_count(2)
    seen = sorted(
        (row.locator(".kind").inner_text(), row.get_by_role("link").inner_text())
        for row in rows.all()
    )
    assert seen == [("IP", "127.0.0.1"), ("user", "IP 127.0.0.1")], seen


def test_plans_matrix_create_set_remove_and_delete(demo: Demo, page: Page) -> None:
    """In the plans matrix: create a plan (a new last column), give it a rate with an
    algorithm and shadow (shown in the cell), remove that rate, delete the plan; each
    step is in the audit log, and deleting the default plan is not offered."""
    page.goto(demo.url("/plans"))
    head = page.locator("#plans thead th[data-plan]")
    expect(head).to_have_count(2)
    expect(page.get_by_role("button", name="Delete plan free")).to_have_count(0)  # the default
    page.get_by_label("Name", exact=True).fill("team")
    page.get_by_label("Description").fill("Small teams")
    with page.expect_navigation():
        page.get_by_role("button", name="Create plan").click()
    expect(page.locator(".flash.ok")).to_contain_text("Plan team created")
    expect(head).to_have_count(3)
    expect(head.last).to_contain_text("team")
    expect(head.last).to_contain_text("Small teams")
    expect(plan_cell(page, "team", "user").locator(".rate")).to_have_text("\u2013")
    open_cell(page, "team", "user")
    page.get_by_label("New rate for team user").fill("7/minute")
    page.get_by_label("Algorithm for team user").select_option("fixed_window")
    page.get_by_label("Shadow for team user").check()
    with page.expect_navigation():
        page.get_by_role("button", name="Save team user").click()
    expect(page.locator(".flash.ok")).to_contain_text("team: user is now 7/minute")
    cell = plan_cell(page, "team", "user")
    expect(cell.locator(".rate")).to_have_text("7/minute")
    expect(cell.locator(".badge.algorithm")).to_have_text("fixed_window")
    expect(cell.locator(".badge.shadow")).to_have_text("shadow")
    open_cell(page, "team", "user")
    with page.expect_navigation():
        page.get_by_role("button", name="Remove team user").click()
    expect(page.locator(".flash.ok")).to_contain_text("team: user has no rate now")
    expect(plan_cell(page, "team", "user").locator(".rate")).to_have_text("\u2013")
    with page.expect_navigation():
        page.get_by_role("button", name="Delete plan team").click()
    expect(page.locator(".flash.ok")).to_contain_text("Plan team deleted")
    expect(head).to_have_count(2)
    page.goto(demo.url("/audit"))
    for action in ("plan.create", "plan.limit.set", "plan.limit.delete", "plan.delete"):
        expect(page.locator("#audit")).to_contain_text(action)


def text_boxes(page: Page) -> list[tuple[str, float, float, float, float]]:
    """Every text of the open SVG with its box as Chromium lays it out."""
    boxes: list[tuple[str, float, float, float, float]] = page.evaluate(
        """() => Array.from(document.querySelectorAll("text")).map((t) => {
            const b = t.getBBox();
            return [t.textContent, b.x, b.y, b.width, b.height];
        })"""
    )
    return boxes


def assert_labels_apart(boxes: list[tuple[str, float, float, float, float]]) -> None:
    for i, (a, ax, ay, aw, ah) in enumerate(boxes):
        for b, bx, by, bw, bh in boxes[i + 1 :]:
            apart = ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay
            assert apart, f"{a!r} overlaps {b!r}"


@pytest.mark.parametrize("phase", range(10))
def test_chart_labels_stay_apart_whatever_the_minute(demo: Demo, page: Page, phase: int) -> None:
    """The last hour ends on the current minute, so a tick can fall on the plot's right
    edge (at 18:20, say), beside the end labels; no label may overlap another at any
    minute of the ten-minute cycle, whatever the counts."""
    from dashboard import chart

    end = 29_000_000 + phase  # an epoch minute that is a multiple of 10, plus the phase
    minutes = list(range(end - 59, end + 1))
    flat = [0] * 60
    series = {  # the last panel's allowed count is its axis's top: its label is clamped
        "endpoint": {"allowed": [*flat[:-1], 5], "denied": [*flat[:-1], 2]},
        "ip": {"allowed": flat, "denied": flat},
        "user": {"allowed": [*flat[:-1], 5], "denied": flat},
    }
    with demo.app.test_request_context():
        svg = render_template(
            "quota/chart.svg", chart=chart.build(series, minutes), title="t", unavailable=None
        )
    page.set_content(svg)
    boxes = text_boxes(page)
    times = [box[0] for box in boxes if re.fullmatch(r"\d\d:\d\d", box[0])]
    assert len(times) == 6, times
    assert_labels_apart(boxes)


def test_chart_has_a_time_axis_with_labels_that_do_not_overlap(demo: Demo, page: Page) -> None:
    """The last-hour chart labels its time axis (HH:MM every 10 minutes, UTC) and its
    value axes; as Chromium lays it out, no two labels of the chart overlap."""
    for _ in range(7):
        demo.api("POST", "/infer", user="tess")
    wait_for_top(demo, page, "tess")
    page.goto(demo.url("/chart.svg"))
    boxes = text_boxes(page)
    labels = [box[0] for box in boxes]
    times = [label for label in labels if re.fullmatch(r"\d\d:\d\d", label)]
    assert len(times) == 6 and all(t.endswith("0") for t in times), labels
    assert "UTC" in labels and labels.count("0") == 2, labels  # each panel's value axis
    assert_labels_apart(boxes)
    page.goto(demo.url("/"))
    assert page.evaluate("document.getElementById('chart').naturalWidth") > 0


def test_near_limit_list_shows_an_identity_live(demo: Demo, page: Page) -> None:
    """An identity that spends more than 80% of a tier appears in "about to hit the
    limit" on the open overview, with the tier and remaining/limit, without a reload."""
    page.goto(demo.url("/"))
    near = page.locator("#near-limit")
    expect(near).to_contain_text("Nobody is at 80% of a limit or above")
    for _ in range(5):  # the free plan's ai resource: 5/minute
        assert demo.api("POST", "/infer", user="nina")[0] == 200
    row = near.locator("tr").filter(has=page.get_by_role("link", name="nina", exact=True))
    expect(row).to_be_visible(timeout=LIVE_DEADLINE_MS)
    expect(row).to_contain_text("endpoint: ai (POST)")
    expect(row).to_contain_text("0/5")


def test_block_and_unblock_from_a_callers_page(demo: Demo, page: Page) -> None:
    """On a caller's page, a bad duration is refused in place (400, nobody blocked); a
    good one blocks the caller at once (429 "blocked"), the page says for how long, and
    its Unblock button serves the caller again."""
    assert demo.api("GET", "/items", user="mallory")[0] == 200
    page.goto(demo.url("/identity/id=mallory"))
    form = page.locator("form.block-form")
    form.get_by_label("For", exact=True).fill("forever")
    with page.expect_navigation() as navigation:
        form.get_by_role("button", name="Block").click()
    assert navigation.value is not None and navigation.value.status == 400
    expect(page.locator("#block-error")).to_contain_text("malformed duration 'forever'")
    assert demo.api("GET", "/items", user="mallory")[0] == 200
    form = page.locator("form.block-form")
    form.get_by_label("For", exact=True).fill("90m")
    form.get_by_label("Reason", exact=True).fill("card testing")
    with page.expect_navigation():
        form.get_by_role("button", name="Block").click()
    expect(page.locator(".flash.ok")).to_contain_text("Blocked user mallory for 1 h 30 min.")
    expect(page.locator("#block-status")).to_contain_text("Blocked for 1 h")
    assert demo.api("GET", "/items", user="mallory")[0] == 429
    with page.expect_navigation():
        page.locator("#block-status").get_by_role("button", name="Unblock").click()
    expect(page.locator(".flash.ok")).to_contain_text("Unblocked user mallory.")
    expect(page.locator("#block-status")).to_have_text("Not blocked.")
    deadline = time.monotonic() + 2.5  # every worker's deny cache within 2 s
    while demo.api("GET", "/items", user="mallory")[0] != 200:
        assert time.monotonic() < deadline, "still refused 2.5 s after the unblock"
        time.sleep(0.1)


def test_pages_load_their_icon_and_nothing_is_missing(demo: Demo, page: Page) -> None:
    """Opening each page fetches the dashboard's own icon (200) and no request of the
    page answers 404: the browser no longer asks the app for /favicon.ico."""
    responses: list[tuple[str, int]] = []
    page.on("response", lambda r: responses.append((r.url, r.status)))
    for path in ("/", "/plans", "/clients", "/blocks", "/audit", "/identity/id=ada"):
        page.goto(demo.url(path))
        page.wait_for_load_state("networkidle")
    icons = [status for url, status in responses if url.endswith("/static/favicon.svg")]
    assert icons and set(icons) == {200}, responses
    assert [r for r in responses if r[1] == 404] == []


def test_a_clients_usage_page_charts_its_days_and_downloads_them(demo: Demo, page: Page) -> None:
    """A client made on the Clients page calls the API with its key; its Usage link opens
    a page whose chart has a bar for today, whose totals count the calls, and whose CSV
    link downloads those days; at 390 px it does not scroll sideways."""
    page.goto(demo.url("/clients"))
    page.get_by_label("Name").fill("usage-probe")
    page.get_by_role("button", name="Create and show its key").click()
    key = page.locator("#new-key").inner_text().strip()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for _ in range(3):
        request = urllib.request.Request(
            demo.base + "/infer", method="POST", headers={"X-API-Key": key}
        )
        with opener.open(request, timeout=5) as response:
            assert response.status == 200
    page.goto(demo.url("/clients"))
    page.locator("tr", has_text="usage-probe").get_by_role("link", name="Usage", exact=True).click()
    expect(page.locator("#usage-caller")).to_have_text("usage-probe")
    # The ledger's writer flushes every QUOTA_SYNC_INTERVAL: reload until the calls show.
    for _ in range(50):
        if "3" in page.locator("#usage-totals").inner_text():
            break
        page.wait_for_timeout(200)
        page.reload()
    totals = page.locator("#usage-totals").inner_text()
    assert "ai" in totals and "3" in totals, totals
    assert page.locator("svg rect").count() > 0  # the chart's bars, drawn on the server
    with page.expect_download() as download:
        page.locator("#usage-csv").click()
    csv_text = Path(download.value.path()).read_text()
    assert csv_text.splitlines()[0] == "day,resource,units,requests,denied"
    assert any(line.endswith(",ai,3,3,0") for line in csv_text.splitlines()), csv_text
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
