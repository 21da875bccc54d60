"""Dashboard resets, blocks and unblocks are audited once, with their real outcome.

Against a redis-server of the test's own: stopped (connection refused) or paused
(every call times out) after a login while it was up. A change that fails is
recorded as ``<action>.failed`` (the CLI's naming) and the operator is told; one
that succeeds is recorded once, never twice.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota.sql.admin import QuotaAdmin
from tests.outage import OPS, redis_app, traffic_then_login
from tests.servers import RedisServer


def entries(app: Flask, action: str) -> list[str]:
    """The actions of the audit entries about ``action`` (it or ``<action>.failed``),
    oldest first."""
    log = QuotaAdmin(app.extensions["quota"].sql, actor="test").audit_log(limit=100)
    return [e.action for e in reversed(log) if e.action in (action, f"{action}.failed")]


def failed_once(app: Flask, action: str) -> bool:
    """One ``.failed`` entry, after at most the attempt itself (the entry written before
    the change, as ``QuotaAdmin.audited`` does): never "done" alone, never twice."""
    return entries(app, action) in ([f"{action}.failed"], [action, f"{action}.failed"])


def csrf(http: FlaskClient, url: str) -> str:
    page = http.get(url, headers=OPS).get_data(as_text=True)
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match is not None
    return match.group(1)


def post(http: FlaskClient, url: str, token: str, **form: str) -> tuple[int, str]:
    response = http.post(url, headers=OPS, data={"csrf_token": token, **form})
    if response.status_code == 302:
        response = http.get(response.headers["Location"], headers=OPS)
    return response.status_code, response.get_data(as_text=True)


ACTIONS = [  # (audit action, form URL, page with the form, form fields)
    ("usage.reset", "/quota/identity/id=ada/reset", "/quota/identity/id=ada", {}),
    ("block", "/quota/identity/id=ada/block", "/quota/identity/id=ada", {"duration": "1h"}),
    ("unblock", "/quota/blocks/id=ada/unblock", "/quota/identity/id=ada", {}),
]


@pytest.mark.parametrize(("action", "url", "page", "form"), ACTIONS)
def test_each_action_is_audited_once_when_it_succeeds(
    tmp_path: Path, own_redis: RedisServer, action: str, url: str, page: str, form: dict[str, str]
) -> None:
    """With Redis up, a reset, block or unblock from the dashboard leaves exactly one
    audit entry under its name, by the logged-in operator."""
    app = redis_app(tmp_path, own_redis.url)
    http = traffic_then_login(app)
    status, body = post(http, url, csrf(http, page), **form)
    assert status == 200 and "failed" not in body, body[:500]
    assert entries(app, action) == [action]
    log = QuotaAdmin(app.extensions["quota"].sql, actor="test").audit_log(limit=100)
    assert {e.actor for e in log if e.action == action} == {"dashboard:ops"}


@pytest.mark.parametrize("outage", ["stopped", "paused"])
@pytest.mark.parametrize(("action", "url", "page", "form"), ACTIONS)
def test_an_action_that_redis_fails_is_audited_as_failed_and_said(
    tmp_path: Path,
    own_redis: RedisServer,
    outage: str,
    action: str,
    url: str,
    page: str,
    form: dict[str, str],
) -> None:
    """With Redis stopped or paused, the dashboard's reset, block or unblock tells the
    operator it failed, and the audit log records it as ``<action>.failed``, not done."""
    app = redis_app(tmp_path, own_redis.url)
    http = traffic_then_login(app)
    token = csrf(http, page)  # the form was loaded while Redis was up
    if outage == "stopped":
        own_redis.stop()
    else:
        own_redis.pause(60_000)  # ends with the server, killed at teardown
    status, body = post(http, url, token, **form)
    assert status == 200, body[:500]
    message = re.search(r'<p class="flash error" role="status">([^<]*)</p>', body)
    assert message is not None and "failed: storage unavailable" in message.group(1), body[:2000]
    assert failed_once(app, action), entries(app, action)
