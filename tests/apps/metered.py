"""A metered app for multi-worker metrics tests: ``gunicorn tests.apps.metered:app``.

``tests.apps.many`` with metrics at ``/metrics``: every ``QUOTA_*`` setting comes
from the environment, and the caller names itself in ``X-Client`` (fine for a
test, never for an app). Every response says which worker answered in ``X-Worker``.
"""

from __future__ import annotations

import os

from flask import Flask, Response

from tests.apps import many

__all__ = ["app", "create_app"]


def create_app() -> Flask:
    app = many.create_app(QUOTA_METRICS_URL="/metrics")

    @app.after_request
    def worker(response: Response) -> Response:
        response.headers["X-Worker"] = str(os.getpid())
        return response

    return app


app = create_app()
