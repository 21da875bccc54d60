"""Many identities for load tests: the caller names itself in ``X-Client``.

Served as ``gunicorn tests.apps.many:app``; every ``QUOTA_*`` setting comes
from the environment (``QUOTA_PLANS`` as JSON). Trusting a header for the
identity is fine for a test that needs thousands of callers, never for an app.
"""

from __future__ import annotations

import os

from flask import Flask, request

from flask_quota import Identity, Quota

__all__ = ["app", "create_app"]


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    quota = Quota(app)

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client, request.headers.get("X-Plan")) if client else None

    @app.get("/ping")
    def ping() -> str:
        return "pong"  # global and user tiers

    @app.get("/work")
    @quota.limit(resource="work")
    def work() -> str:
        return "done"  # global, user and the endpoint tier "work" (rate from the plan)

    @app.get("/healthz")
    @quota.exempt
    def healthz() -> str:
        return "ok"

    return app


app = create_app()
