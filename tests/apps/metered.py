"""A metered app for multi-worker metrics tests: ``gunicorn tests.apps.metered:app``.

Every ``QUOTA_*`` setting comes from the environment; metrics at ``/metrics``.
The caller names itself in ``X-Client`` (fine for a test, never for an app), and
every response says which worker answered in ``X-Worker``.
"""

from __future__ import annotations

import os

from flask import Flask, Response, request

from flask_quota import Identity, Quota

__all__ = ["app", "create_app"]


def create_app() -> Flask:
    app = Flask(__name__)
    app.config["QUOTA_METRICS_URL"] = "/metrics"
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    quota = Quota(app)

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client) if client else None

    @app.get("/work")
    @quota.limit(resource="work")
    def work() -> str:
        return "done"  # global, user and the endpoint tier "work" (rate from the plan)

    @app.get("/healthz")
    @quota.exempt
    def healthz() -> str:
        return "ok"

    @app.after_request
    def worker(response: Response) -> Response:
        response.headers["X-Worker"] = str(os.getpid())
        return response

    return app


app = create_app()
