"""A small API with the dashboard mounted, for browser tests and the screenshot script.

Configured from the environment (or a mapping given to ``create_app``):

- ``DASHBOARD_DEMO_PASSWORD`` (required) and ``DASHBOARD_DEMO_USER`` (default ``ops``):
  the dashboard's one Basic-auth operator;
- ``DASHBOARD_DEMO_INSTANCE``: a writable instance folder (the SQLite file of
  plans and clients lives there); Flask's default otherwise;
- ``DASHBOARD_DEMO_SECRET``: the secret key (random per process otherwise);
- every ``QUOTA_*`` variable, as for the extension (``QUOTA_PLANS`` as JSON).

The caller names itself in ``X-User`` (and may pick a plan with ``X-Plan``).
Trusting headers for the identity is fine for a demo, never for a real app.
Served as ``gunicorn tests.apps.dashboard_demo:app`` or through ``create_app``.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from flask import Flask, request
from werkzeug.security import generate_password_hash
from werkzeug.serving import make_server

from flask_quota import Identity, Quota

__all__ = ["DEMO_PLANS", "create_app", "serving"]

DEMO_PLANS = {
    "free": {"user": "30/minute", "resources": {"ai": "5/minute"}},
    "pro": {"user": "300/minute", "resources": {"ai": "30/minute"}},
}


def create_app(env: Mapping[str, str] | None = None) -> Flask:
    env = os.environ if env is None else env
    password = env.get("DASHBOARD_DEMO_PASSWORD")
    if not password:
        raise RuntimeError("set DASHBOARD_DEMO_PASSWORD: the dashboard's Basic-auth password")
    instance = env.get("DASHBOARD_DEMO_INSTANCE") or None
    if instance is not None:
        os.makedirs(instance, exist_ok=True)
    app = Flask(__name__, instance_path=instance)
    app.secret_key = env.get("DASHBOARD_DEMO_SECRET") or secrets.token_hex(32)
    app.config.update(
        {
            "QUOTA_DASHBOARD_URL": "/quota",
            "QUOTA_PLANS": json.dumps(DEMO_PLANS),
            "QUOTA_LEDGER": "true",  # the usage pages chart what it records
            **{k: v for k, v in env.items() if k.startswith("QUOTA_")},
            "QUOTA_DASHBOARD_USERS": {
                env.get("DASHBOARD_DEMO_USER", "ops"): generate_password_hash(password)
            },
        }
    )
    quota = Quota(app)

    @quota.identity_loader
    def from_header() -> Identity | None:
        user = request.headers.get("X-User")
        return Identity(user, request.headers.get("X-Plan")) if user else None

    @app.post("/infer")
    @quota.limit(resource="ai")
    def infer() -> str:
        return "ok"

    @app.get("/items")
    def items() -> str:
        return "items"

    return app


@contextmanager
def serving(env: Mapping[str, str] | None = None) -> Iterator[tuple[Flask, str]]:
    """The demo app served by Werkzeug on a free loopback port: ``(app, base URL)``.

    Stops the server and closes the app's SQL store on exit.
    """
    app = create_app(env)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="dashboard-demo"
    )
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
        app.extensions["quota"].sql.close()


def __getattr__(name: str) -> Flask:
    # ``app`` is built on first use, so importing create_app needs no environment.
    if name == "app":
        app = create_app()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
