"""Async views (``async def`` with ``flask[async]``) are limited like any other view.

Flask runs an async view in an event loop inside the request; the quota hooks
are ordinary before/after-request hooks around it, so the endpoint tier and
``quota.charge`` behave as for a sync view.
"""

from __future__ import annotations

import asyncio

from flask import Flask

from flask_quota import Quota


def async_app(app: Flask) -> Quota:
    app.config.update(QUOTA_PLANS={"test": {}}, QUOTA_DEFAULT_PLAN="test")
    app.config["QUOTA_ANONYMOUS_PLAN"] = "test"
    return Quota(app)


def test_an_async_view_is_limited(app: Flask) -> None:
    """`async def` behind @quota.limit("2/minute"): 200 200 429, with the headers."""
    quota = async_app(app)

    @app.get("/slow")
    @quota.limit("2/minute", resource="slow")
    async def slow() -> str:
        await asyncio.sleep(0)
        return "done"

    client = app.test_client()
    responses = [client.get("/slow") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0].get_data(as_text=True) == "done"
    assert responses[1].headers["X-RateLimit-Remaining"] == "0"
    assert responses[2].get_json()["resource"] == "slow"


def test_quota_charge_works_in_an_async_view(app: Flask) -> None:
    """quota.charge() inside an async view charges the endpoint tier after the response."""
    quota = async_app(app)

    @app.post("/tokens")
    @quota.limit("10/minute", resource="tokens")
    async def tokens() -> str:
        await asyncio.sleep(0)
        quota.charge(6)
        return "ok"

    client = app.test_client()
    assert client.post("/tokens").status_code == 200  # 1 + 6 charged
    assert client.post("/tokens").status_code == 200  # 7 + 1 admitted, then 6 more: debt
    assert client.post("/tokens").status_code == 429
