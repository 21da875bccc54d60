"""The dashboard test app and its operator: shared by the dashboard tests.

``dashboard_app`` mounts the dashboard at ``/quota`` on memory storage (unless given
one); callers name themselves in ``X-User``. ``OPS`` logs in as the operator ``ops`` when
the app's ``QUOTA_DASHBOARD_USERS`` is ``{"ops": HASH}`` (conftest's ``ops_app``).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from flask import Flask, request
from flask.testing import FlaskClient
from werkzeug.security import generate_password_hash

from flask_quota import Identity, Quota
from flask_quota.storage import MemoryStorage, Storage

__all__ = [
    "HASH",
    "OPS",
    "PASSWORD",
    "basic",
    "cell",
    "csrf_from",
    "dashboard_app",
    "flush",
    "post",
    "x_user_routes",
]

PASSWORD = "correct horse battery staple"
# A cheap hash: every new app verifies its operator once, and Werkzeug's default (scrypt)
# took 0.11 s of CPU each time, in hundreds of tests and every session. The login test
# that times hashing uses the default.
HASH = generate_password_hash(PASSWORD, method="pbkdf2:sha256:1000")


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


OPS = basic("ops", PASSWORD)


def x_user_routes(app: Flask, quota: Quota) -> None:
    """Callers name themselves in ``X-User``; ``POST /infer`` is limited by resource "ai"."""

    @quota.identity_loader
    def load() -> Identity | None:
        user = request.headers.get("X-User")
        return Identity(user) if user else None

    @app.post("/infer")
    @quota.limit(resource="ai")
    def infer() -> str:
        return "ok"


def dashboard_app(tmp_path: Path, storage: Storage | None = None, **config: Any) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.secret_key = "test-secret"
    app.config.update(
        {
            "QUOTA_DASHBOARD_URL": "/quota",
            "QUOTA_PLANS": {"free": {"user": "3/minute", "resources": {"ai": "2/minute"}}},
            **config,
        }
    )
    quota = Quota(app, storage=storage if storage is not None else MemoryStorage())
    x_user_routes(app, quota)

    @app.get("/items")
    def items() -> str:
        return "items"

    return app


def flush(app: Flask) -> None:
    app.extensions["quota"].usage.flush()


def csrf_from(http: FlaskClient, url: str) -> str:
    page = http.get(url, headers=OPS).get_data(as_text=True)
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "the page carries a CSRF token"
    return match.group(1)


def post(http: FlaskClient, url: str, page: str, **form: str) -> tuple[int, str]:
    """POST ``form`` to ``url`` as ``ops``, with the CSRF token of ``page``; (status, body)
    after redirects."""
    form["csrf_token"] = csrf_from(http, page)
    response = http.post(url, headers=OPS, data=form, follow_redirects=True)
    return response.status_code, response.get_data(as_text=True)


def cell(http: FlaskClient, plan: str, row: str) -> str | None:
    """The rate shown in the plans matrix for ``plan`` and ``row`` (None: no rate)."""
    page = http.get("/quota/plans", headers=OPS).get_data(as_text=True)
    found = re.search(rf'<td data-plan="{plan}" data-row="{row}"[^>]*>(.*?)</td>', page, re.S)
    assert found is not None, f"no cell {plan} {row}"
    rate = re.search(r'<span class="rate">(.*?)</span>', found.group(1))
    return rate.group(1) if rate else None
