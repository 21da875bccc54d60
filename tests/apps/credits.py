"""The prepaid credits' fleet app: ``gunicorn tests.apps.credits:app``, configured by
``QUOTA_*``. The caller names itself in ``X-Client`` (fine for a test, never for an app);
``POST /spend?cost=N`` spends N units of the plan's credits resource ``ai_tokens``."""

from __future__ import annotations

import os

from flask import Flask, request

from flask_quota import Identity, Quota
from tests.apps import name_the_worker

__all__ = ["app", "create_app"]


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    quota = Quota(app)

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client) if client else None

    @app.post("/spend")
    @quota.limit(resource="ai_tokens", cost=lambda: int(request.args.get("cost", 1)))
    def spend() -> str:
        return "spent"

    name_the_worker(app, quota)
    return app


app = create_app()
