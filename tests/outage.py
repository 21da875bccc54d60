"""The dashboard app on a redis-server of the test's own, for the outage tests: it logs in
the operator and sends some traffic while the server is up, before a test stops or
pauses it."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from werkzeug.security import generate_password_hash

from flask_quota import Quota
from tests.dashboards import x_user_routes

__all__ = ["OPS", "PASSWORD", "TIMEOUT", "redis_app", "traffic_then_login"]

PASSWORD = "outage-password"
HASH = generate_password_hash(PASSWORD, method="pbkdf2:sha256:1000")  # cheap, as dashboards.py
OPS = {"Authorization": "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()}
TIMEOUT = 0.2  # QUOTA_STORAGE_TIMEOUT of these apps


def redis_app(tmp_path: Path, redis_url: str, **config: Any) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.secret_key = "outage-secret"
    app.config.update(
        {
            "QUOTA_STORAGE_URL": redis_url,
            "QUOTA_STORAGE_TIMEOUT": TIMEOUT,
            "QUOTA_DASHBOARD_URL": "/quota",
            "QUOTA_DASHBOARD_USERS": {"ops": HASH},
            "QUOTA_PLANS": {"free": {"user": "30/minute", "resources": {"ai": "5/minute"}}},
            **config,
        }
    )
    quota = Quota(app)
    x_user_routes(app, quota)

    return app


def traffic_then_login(app: Flask) -> FlaskClient:
    """Some usage while Redis is up (flushed to it), and one login (cached by the app)."""
    http = app.test_client()
    for user in ("ada", "grace", None):
        headers = {"X-User": user} if user else {}
        assert http.post("/infer", headers=headers).status_code == 200
    app.extensions["quota"].usage.flush()
    overview = http.get("/quota/api/overview", headers=OPS).get_json()
    assert overview["storage"]["status"] == "up" and overview["top"], overview
    return http
