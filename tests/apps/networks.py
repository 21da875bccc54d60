"""The networks fleet app: ``gunicorn tests.apps.networks:app``, configured by ``QUOTA_*``.

Behind Werkzeug's ``ProxyFix`` (one trusted proxy): gunicorn binds 127.0.0.1, so a test
names the client's address in ``X-Forwarded-For``, as a load balancer would. Every
response names its worker in ``X-Worker``; ``/healthz`` (exempt) answers its pid.
"""

from __future__ import annotations

import os

from flask import Flask, Response, jsonify
from werkzeug.middleware.proxy_fix import ProxyFix

from flask_quota import Quota
from tests.apps import name_the_worker

__all__ = ["app", "create_app"]


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1)  # type: ignore[method-assign]
    quota = Quota(app)

    @app.get("/v1/items")
    def items() -> Response:
        return jsonify(items=[1, 2, 3])

    name_the_worker(app, quota)

    return app


app = create_app()
