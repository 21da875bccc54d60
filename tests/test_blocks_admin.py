"""Blocks from the shell and the dashboard: `flask quota block|unblock|blocks list`
and the Blocks page, each change audited before it is made."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask

from flask_quota.sql.admin import QuotaAdmin
from flask_quota.state import get_state
from flask_quota.storage import storage_from_url
from flask_quota.tools.blocks import block, list_blocks
from flask_quota.tools.inspection import Caller
from tests.dashboards import HASH, OPS, csrf_from, dashboard_app
from tests.servers import RedisServer


def audit(app: Flask) -> list[tuple[str, str, str]]:
    entries = QuotaAdmin(app.extensions["quota"].sql, actor="test").audit_log()
    return [(e.actor, e.action, e.target) for e in reversed(entries)]


def cli(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(args=["quota", *args])
    return result.exit_code, result.output


@pytest.mark.redis
def test_cli_block_list_and_unblock(tmp_path: Path, redis_server: RedisServer) -> None:
    """On a Redis the server shares, `block --for 10m` refuses the caller, `blocks list`
    shows it, `unblock` lifts it; each change is in the audit log under --actor."""
    redis_server.client().flushall()
    storage = storage_from_url(redis_server.url, timeout=2)
    app = dashboard_app(tmp_path, storage, QUOTA_DASHBOARD_USERS={"ops": HASH})
    http = app.test_client()
    code, out = cli(app, "block", "mallory", "--for", "10m", "--reason", "abuse", "--actor", "kim")
    assert code == 0, out
    assert "blocked id=mallory for 600 s" in out
    response = http.get("/items", headers={"X-User": "mallory"})
    assert response.status_code == 429 and response.get_json()["tier"] == "blocked"
    assert 590 <= int(response.headers["Retry-After"]) <= 600

    code, out = cli(app, "blocks", "list")
    assert code == 0 and re.search(r"id=mallory .* (59\d|600) s\s+kim\s+abuse", out), out

    code, out = cli(app, "unblock", "mallory", "--actor", "kim")
    assert code == 0 and "unblocked id=mallory" in out, out
    assert http.get("/items", headers={"X-User": "mallory"}).status_code == 200
    assert audit(app) == [("kim", "block", "id=mallory"), ("kim", "unblock", "id=mallory")]


def test_cli_block_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    """No caller, or a malformed --for: exit 1 with one line, nothing blocked or audited."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH})
    for args in (["block", "--for", "10m"], ["block", "x", "--for", "soon"], ["block", "x"]):
        code, out = cli(app, *args, "--actor", "kim")
        assert code != 0 and "Traceback" not in out, out
    assert audit(app) == []
    with app.app_context():
        assert list_blocks(get_state(app)) == []


def test_cli_block_refuses_a_network_and_names_the_networks_command(tmp_path: Path) -> None:
    """`flask quota block --ip 203.0.113.0/24` exits 1 naming `networks deny`, nothing
    blocked or audited; `--ip 203.0.113.9/32` is that one address (taken as one: only
    the memory storage's own refusal stops it here)."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH})
    code, out = cli(app, "block", "--ip", "203.0.113.0/24", "--for", "10m", "--actor", "kim")
    assert code == 1 and "flask quota networks deny 203.0.113.0/24" in out, out
    assert audit(app) == []
    code, out = cli(app, "block", "--ip", "203.0.113.9/32", "--for", "10m", "--actor", "kim")
    assert code == 1 and "networks deny" not in out and "memory://" in out, out


def test_dashboard_blocks_page_lists_and_unblocks_with_csrf(tmp_path: Path) -> None:
    """The Blocks page (linked in the nav) lists blocks; its Unblock button needs the CSRF
    token, is audited under the operator, and serves the caller again."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH})
    http = app.test_client()
    with app.app_context():
        block(get_state(app), Caller.of(ip="10.0.0.7"), 300, "<b>scraper</b>", "api")
    page = http.get("/quota/blocks", headers=OPS)
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and "ip=10.0.0.7" in text
    assert "&lt;b&gt;scraper&lt;/b&gt;" in text  # escaped
    assert 'href="/quota/blocks"' in http.get("/quota/", headers=OPS).get_data(as_text=True)
    blocked = http.get("/items", environ_base={"REMOTE_ADDR": "10.0.0.7"})
    assert blocked.status_code == 429

    url = "/quota/blocks/ip=10.0.0.7/unblock"
    assert http.post(url, headers=OPS).status_code == 400  # no CSRF token: nothing changes
    assert http.get("/items", environ_base={"REMOTE_ADDR": "10.0.0.7"}).status_code == 429
    token = csrf_from(http, "/quota/blocks")
    done = http.post(url, headers=OPS, data={"csrf_token": token}, follow_redirects=True)
    assert done.status_code == 200 and "Unblocked IP 10.0.0.7" in done.get_data(as_text=True)
    assert "No caller is blocked" in done.get_data(as_text=True)
    assert http.get("/items", environ_base={"REMOTE_ADDR": "10.0.0.7"}).status_code == 200
    assert audit(app)[-1] == ("dashboard:ops", "unblock", "ip=10.0.0.7")


# Quiet: once, in a fresh-clone CI run under four test processes, the request after the
# reset was still refused; it has not failed alone. The reset's own answer is now
# checked, so a repeat says which step failed.
@pytest.mark.quiet
def test_dashboard_reset_is_audited_before_it_clears(tmp_path: Path) -> None:
    """The identity page's reset writes its audit entry and empties the buckets."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH})
    http = app.test_client()
    for _ in range(4):
        last = http.get("/items", headers={"X-User": "amy"})
    assert last.status_code == 429
    token = csrf_from(http, "/quota/identity/id=amy")
    done = http.post(
        "/quota/identity/id=amy/reset", headers=OPS, data={"csrf_token": token},
        follow_redirects=True,
    )  # fmt: skip
    assert done.status_code == 200 and "Reset " in done.get_data(as_text=True), done.status
    assert http.get("/items", headers={"X-User": "amy"}).status_code == 200
    assert ("dashboard:ops", "usage.reset", "id=amy") in audit(app)
