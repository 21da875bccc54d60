"""X-Forwarded-For arriving at an app without ProxyFix is said once, with the fix.

Without ProxyFix, ``remote_addr`` is the proxy's address, so every caller behind
the proxy shares one global-tier bucket: a misconfiguration worth one warning,
never one per request, and never when ProxyFix is applied.
"""

from __future__ import annotations

import logging

import pytest
from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix

from flask_quota import Quota


def proxied_app(app: Flask) -> Flask:
    app.config.update(QUOTA_PLANS={"test": {"global": "100/minute"}}, QUOTA_DEFAULT_PLAN="test")
    app.config["QUOTA_ANONYMOUS_PLAN"] = "test"
    Quota(app)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    return app


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ProxyFix" in r.getMessage()]


def test_forwarded_requests_without_proxyfix_warn_once(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """Three requests through a proxy: one warning naming ProxyFix and the proxy's
    address; the spoofable header still changes no key (one shared bucket)."""
    client = proxied_app(app).test_client()
    with caplog.at_level(logging.WARNING, logger="flask_quota"):
        responses = [
            client.get("/ping", headers={"X-Forwarded-For": f"198.51.100.{i}"}) for i in range(3)
        ]
    [warning] = warnings_of(caplog)
    assert "x_for=1" in warning and "127.0.0.1" in warning
    remaining = [int(r.headers["X-RateLimit-Remaining"]) for r in responses]
    assert remaining == [99, 98, 97]  # one bucket: the proxy's address


def test_no_warning_with_proxyfix_or_without_the_header(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """ProxyFix applied: the forwarded address keys the bucket and nothing is logged;
    a request without the header logs nothing either."""
    flask_app = proxied_app(app)
    flask_app.wsgi_app = ProxyFix(flask_app.wsgi_app, x_for=1)  # type: ignore[method-assign]
    client = flask_app.test_client()
    with caplog.at_level(logging.WARNING, logger="flask_quota"):
        client.get("/ping")
        first = client.get("/ping", headers={"X-Forwarded-For": "198.51.100.1"})
        second = client.get("/ping", headers={"X-Forwarded-For": "198.51.100.2"})
    assert warnings_of(caplog) == []
    assert first.headers["X-RateLimit-Remaining"] == second.headers["X-RateLimit-Remaining"]
