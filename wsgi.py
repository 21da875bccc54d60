"""The flask-quota demo API: ``gunicorn wsgi:app``.

Every ``QUOTA_*`` setting is read from the environment variable of the same
name. With nothing set it runs on the embedded defaults: memory storage, the
seed's free/pro/enterprise plans in a SQLite file in ``instance/``, no services
needed. At first start it creates one demo client per plan and prints their API
keys (only hashes are stored: note them). Manage plans and clients with
``flask --app wsgi quota ...``; ``flask --app wsgi db upgrade`` applies the
migrations in ``migrations/``. A database that is down at start does not stop
the demo: it says so and serves the plans (built-in, or ``QUOTA_PLANS``) until
the database answers.

The operator dashboard is mounted at ``/quota`` (``QUOTA_DASHBOARD_URL``). Its
login is user ``ops`` with ``DEMO_DASHBOARD_PASSWORD``, or ``QUOTA_DASHBOARD_USERS``
(JSON of Werkzeug hashes); with neither, a password is generated at first start,
printed, and kept in ``instance/dashboard-login.txt``. Never a fixed default.

A caller reads its own quota at ``GET /rate_limit`` (``QUOTA_STATUS_URL``): its
plan and every bucket of it, counted on the global tier only.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
from flask import Flask, jsonify, request
from flask_migrate import Migrate  # type: ignore[import-untyped]
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from werkzeug.security import generate_password_hash

from flask_quota import Quota
from flask_quota.sql.admin import AdminError, QuotaAdmin

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__, instance_relative_config=True)
    instance = Path(app.instance_path)
    app.config["QUOTA_DASHBOARD_URL"] = "/quota"
    app.config["QUOTA_STATUS_URL"] = "/rate_limit"  # the caller's own quota, as JSON
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    app.config.update(config or {})
    # Serving, not a `flask ...` command: only then announce logins and make demo clients.
    serving = click.get_current_context(silent=True) is None
    if app.config["QUOTA_DASHBOARD_URL"]:
        app.secret_key = os.environ.get("SECRET_KEY") or _kept(instance / "secret-key.txt")
        if not app.config.get("QUOTA_DASHBOARD_USERS"):
            password = os.environ.get("DEMO_DASHBOARD_PASSWORD") or _dashboard_password(
                instance, announce=serving
            )
            app.config["QUOTA_DASHBOARD_USERS"] = {"ops": generate_password_hash(password)}
    quota = Quota(app)  # API keys are looked up in the quota tables
    Migrate().init_app(app, directory=str(MIGRATIONS))
    if serving:  # a `flask db ...` command must find the database as it is
        # In the background: a database that is slow or down never holds up the boot.
        demo = threading.Thread(target=_demo_clients, args=(app,), name="demo", daemon=True)
        demo.start()

    @app.get("/")
    def index() -> Any:
        return jsonify(
            service="flask-quota demo",
            endpoints=[
                "GET /v1/items",
                "GET /v1/search?q=",
                "POST /v1/ai/infer",
                "POST /v1/ai/chat",
                "GET /healthz",
                "GET /rate_limit",
            ],
            api_key_header=app.config["QUOTA_API_KEY_HEADER"],
            worker=os.getpid(),  # which gunicorn worker answered
        )

    @app.get("/v1/items")
    def items() -> Any:
        return jsonify(items=[{"id": i, "name": f"item {i}"} for i in range(1, 4)])

    @app.get("/v1/search")
    @quota.limit(resource="bulk_search")
    def search() -> Any:
        query = request.args.get("q", "")[:100]
        return jsonify(query=query, results=[])

    @app.post("/v1/ai/infer")
    @quota.limit(resource="ai_inference")
    def infer() -> Any:
        return jsonify(output="a thoughtful answer", tokens=42)

    @app.post("/v1/ai/chat")
    @quota.limit(resource="ai_tokens")
    def chat() -> Any:
        # Metered by the tokens generated, known only once the answer exists:
        # charged after the response, so a long answer can overdraw the budget
        # and the caller's next chat waits until it is paid off.
        prompt = str((request.get_json(silent=True) or {}).get("prompt", ""))[:2000]
        answer = " ".join(["token"] * min(400, 20 + len(prompt.split()) * 3))
        tokens = len(answer.split())
        quota.charge(tokens)
        return jsonify(output=answer, tokens=tokens)

    @app.get("/healthz")
    @quota.exempt
    def health() -> Any:
        return jsonify(status="ok", worker=os.getpid())

    return app


def _kept(path: Path, announce: str | None = None) -> str:
    """A random secret made once and kept in ``path`` (0600); every worker reads the same.

    Several workers start at once: the first creates the file exclusively.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):
            value = path.read_text().strip()
            if value:
                return value
            time.sleep(0.1)
        raise RuntimeError(f"{path} is empty: delete it and start again") from None
    value = secrets.token_urlsafe(24)
    with os.fdopen(fd, "w") as file:
        file.write(value + "\n")
    if announce:
        print(announce.format(value=value, path=path), file=sys.stderr)
    return value


def _dashboard_password(instance: Path, *, announce: bool) -> str:
    path = instance / "dashboard-login.txt"
    if not announce:
        return _kept(path)
    if path.exists():
        print(f"flask-quota dashboard: /quota, user 'ops', password in {path}", file=sys.stderr)
    return _kept(
        path,
        "flask-quota dashboard: log in at /quota as 'ops' with password {value} "
        "(kept in {path}; set DEMO_DASHBOARD_PASSWORD to choose your own)",
    )


def _demo_clients(app: Flask) -> None:
    """One demo client per plan, made at first start; their keys are printed once.

    Several gunicorn workers start at once: a client name is unique, so a worker
    that loses the race to create one simply skips it. A database that does not
    answer is reported in one line; the demo serves on without its clients.
    """
    store = app.extensions["quota"].sql
    store.start()
    plans = "QUOTA_PLANS" if app.config.get("QUOTA_PLANS") else "the built-in plans"
    down = (
        f"flask-quota demo: the quota database at {store.display_url} does not answer; "
        f"serving {plans}, with API keys served as anonymous, until it does"
    )
    if not store.wait_loaded(timeout=60):
        print(f"{down} ({store.health().error or 'no reply'})", file=sys.stderr)
        return
    admin = QuotaAdmin(store, actor="wsgi demo")
    made = []
    try:
        existing = {client.name for client in admin.clients()}
        for plan in admin.plans():
            name = f"demo-{plan.name}"
            if name in existing:
                continue
            try:
                info, key = admin.create_client(name, plan.name)
            except (AdminError, IntegrityError):
                continue  # another worker made it
            made.append(f"  {info.plan:<12} client {info.id:<3} {key}")
    except SQLAlchemyError as exc:
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        print(f"{down} ({reason})", file=sys.stderr)
    if made:
        lines = "\n".join(made)
        print(
            f"flask-quota demo API keys (send as X-API-Key; shown once):\n{lines}", file=sys.stderr
        )


app = create_app()
