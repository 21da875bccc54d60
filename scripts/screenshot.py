"""Regenerate docs/overview.png and docs/plans.png: the dashboard after real API traffic.

Run from anywhere with the repository's virtualenv:

    .venv/bin/python scripts/screenshot.py [--out docs/overview.png] [--plans-out docs/plans.png]
        [--all /tmp/flask-quota-screenshots]

Starts the demo app (tests/apps/dashboard_demo.py, memory storage, a throw-away
instance folder) on a free loopback port, sends traffic from a few identities
(some of it denied with 429), waits for the usage flush, and photographs the
whole overview at 1280 px wide in headless Chromium (Debian's /usr/bin/chromium).
Then it adds the seed's enterprise plan and a few per-limit settings through
``QuotaAdmin`` (audited like any change) and photographs the plans matrix.

With ``--all DIR`` it then blocks a caller through the dashboard's Block form and
photographs every page (overview, identities, plans, clients, blocks, audit log,
"no such caller") at 1280 and 390 px wide into DIR, for a look before a release.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import BrowserContext, sync_playwright  # noqa: E402

from flask_quota.sql.admin import QuotaAdmin  # noqa: E402
from tests.apps.dashboard_demo import serving  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
USER, PASSWORD = "ops", "screenshot-only"

WIDTHS = (1280, 390)
CLIENT = "acme-analytics"  # an API client in SQL: its requests carry its key
# (identity or None for anonymous, plan header, method, path, count); CLIENT sends its key
TRAFFIC: list[tuple[str | None, str | None, str, str, int]] = [
    (CLIENT, None, "GET", "/items", 45),
    (CLIENT, None, "POST", "/infer", 12),
    ("bob@example.com", None, "POST", "/infer", 9),  # free ai: 5/minute, then 429
    ("carol", None, "GET", "/items", 34),  # free user tier: 30/minute, then 429
    ("dave", None, "GET", "/items", 6),
    (None, None, "GET", "/items", 8),  # anonymous, keyed by IP
]


def send(
    base: str, method: str, path: str, user: str | None, plan: str | None, key: str = ""
) -> int:
    headers = {k: v for k, v in (("X-User", user), ("X-Plan", plan)) if v}
    if user == CLIENT:
        headers = {"X-API-Key": key}
    request = urllib.request.Request(base + path, method=method, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def edit_plans(admin: QuotaAdmin) -> None:
    """The seed's three plans, with a per-limit algorithm and a limit in shadow."""
    admin.set_plan_limit("free", "global", "50/second")
    admin.set_plan_limit("pro", "global", "50/second")
    admin.set_plan_limit("free", "endpoint", "10/minute", resource="bulk_search")
    admin.set_plan_limit("pro", "endpoint", "60/minute", resource="bulk_search")
    admin.set_plan_limit("pro", "endpoint", "30/minute", resource="ai", algorithm="fixed_window")
    admin.create_plan("enterprise", "Contracts; 99.9% SLA")
    for tier, rate, resource in (
        ("global", "200/second", None),
        ("user", "2000/minute, 100000/day", None),
        ("endpoint", "120/minute", "ai"),
        ("endpoint", "300/minute", "bulk_search"),
    ):
        admin.set_plan_limit("enterprise", tier, rate, resource=resource)
    admin.set_plan_limit("enterprise", "endpoint", "300/minute", resource="bulk_search",
                         shadow=True)  # fmt: skip


def every_page(context: BrowserContext, base: str, out: Path, client_id: int) -> None:
    """Block dave through the dashboard's form, then photograph every page at each width."""
    page = context.new_page()
    page.goto(base + "/quota/identity/id=dave")
    form = page.locator("form.block-form")
    form.locator("input[name=duration]").fill("1h")
    form.locator("input[name=reason]").fill("scraping the catalogue")
    form.locator("input[name=public]").check()
    form.get_by_role("button", name="Block").click()
    page.locator(".flash.ok").wait_for(timeout=5000)
    pages = {
        "overview": "/quota/",
        "identity-client": f"/quota/identity/id={client_id}",
        "identity-user": "/quota/identity/id=carol",
        "identity-blocked": "/quota/identity/id=dave",
        "identity-ip": "/quota/identity/ip=127.0.0.1",
        "plans": "/quota/plans",
        "clients": "/quota/clients",
        "blocks": "/quota/blocks",
        "audit": "/quota/audit",
        "no-such-caller": "/quota/identity/ip=nowhere",
    }
    out.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in pages.items():
            page.goto(base + path)
            if name == "overview":
                page.locator("#updated").filter(has_text="Last update").wait_for(timeout=5000)
            page.wait_for_load_state("networkidle")
            target = out / f"{name}-{width}.png"
            page.screenshot(path=str(target), full_page=True)
            print(f"wrote {target}")
    page.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "overview.png")
    parser.add_argument("--plans-out", type=Path, default=ROOT / "docs" / "plans.png")
    parser.add_argument("--all", type=Path, help="also every page at 1280 and 390 px, here")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} not found: apt-get install chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as instance:
        env = {
            "DASHBOARD_DEMO_USER": USER,
            "DASHBOARD_DEMO_PASSWORD": PASSWORD,
            "DASHBOARD_DEMO_INSTANCE": instance,
        }
        with serving(env) as (app, base), sync_playwright() as p:
            if time.time() % 60 > 48:  # the chart ends on this minute: don't let it roll over
                time.sleep(60.5 - time.time() % 60)
            state = app.extensions["quota"]
            client, key = QuotaAdmin(state.sql, actor="screenshot").create_client(CLIENT, "pro")
            state.sql.refresh()  # the request path knows the key at once
            statuses = [
                send(base, method, path, user, plan, key)
                for user, plan, method, path, count in TRAFFIC
                for _ in range(count)
            ]
            print(f"sent {len(statuses)} requests: {statuses.count(429)} got 429")
            app.extensions["quota"].usage.flush()  # don't wait for the background thread
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(
                    viewport={"width": 1280, "height": 900},
                    http_credentials={"username": USER, "password": PASSWORD},
                )
                page = context.new_page()
                page.goto(base + "/quota/")
                # One live refresh done (it also reloads the chart), and the chart drawn.
                page.locator("#updated").filter(has_text="Last update").wait_for(timeout=5000)
                page.wait_for_function(
                    "() => { const c = document.getElementById('chart');"
                    " return c.complete && c.naturalWidth > 0; }",
                    timeout=5000,
                )
                time.sleep(0.2)  # let the last paint settle
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=True)
                print(f"wrote {args.out}")
                edit_plans(QuotaAdmin(app.extensions["quota"].sql, actor="screenshot"))
                page.goto(base + "/quota/plans")
                page.locator("#plans").wait_for(timeout=5000)
                page.locator('td[data-plan="pro"][data-row="endpoint:ai"] summary').click()
                time.sleep(0.2)
                page.screenshot(path=str(args.plans_out), full_page=True)
                if args.all is not None:
                    every_page(context, base, args.all, client.id)
            finally:
                browser.close()
    print(f"wrote {args.plans_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
