"""Many identities for load tests: the caller names itself in ``X-Client``.

Served as ``gunicorn tests.apps.many:app``; every ``QUOTA_*`` setting comes
from the environment (``QUOTA_PLANS`` as JSON). Trusting a header for the
identity is fine for a test that needs thousands of callers, never for an app.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask, Response, request

from flask_quota import Identity, Quota

__all__ = ["app", "create_app", "header_quota"]


def header_quota(app: Flask) -> Quota:
    """Quota on ``app`` as configured, with the test routes; callers are named by headers.

    ``X-Client`` names the caller (none: anonymous) and ``X-Plan`` may pick its plan.
    ``/ping`` meets the global and user tiers, ``/work`` the endpoint tier "work" as
    well (its rate comes from the plan), ``/delayed`` a ``10/second`` limit that holds a
    request for up to 0.5 s (``delay=``), and ``/healthz`` none. Every answer says in
    ``X-Served-At`` when the worker answered (``time.monotonic()``: one clock for every
    process on the machine), so a test can tell when the server decided, not only when
    the client sent.
    """
    quota = Quota(app)

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client, request.headers.get("X-Plan")) if client else None

    @app.after_request
    def served_at(response: Response) -> Response:
        response.headers["X-Served-At"] = repr(time.monotonic())
        return response

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    @app.get("/work")
    @quota.limit(resource="work")
    def work() -> str:
        return "done"

    @app.get("/delayed")
    @quota.limit("10/second", resource="delayed", delay=0.5)
    def delayed() -> str:
        return "done"

    @app.get("/healthz")
    @quota.exempt
    def healthz() -> str:
        return "ok"

    return quota


def create_app(**defaults: Any) -> Flask:
    """The app, configured by ``defaults`` and then by the environment's ``QUOTA_*``."""
    app = Flask(__name__)
    app.config.update(defaults)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    header_quota(app)
    return app


app = create_app()
