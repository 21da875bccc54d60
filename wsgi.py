"""The flask-quota demo API: ``gunicorn wsgi:app``.

Every ``QUOTA_*`` setting is read from the environment variable of the same
name. With nothing set it runs on the embedded defaults: memory storage, the
seed's free/pro/enterprise plans in a SQLite file in ``instance/``, no services
needed. At first start it creates one demo client per plan and prints their API
keys (only hashes are stored: note them). Manage plans and clients with
``flask --app wsgi quota ...``; ``flask --app wsgi db upgrade`` applies the
migrations in ``migrations/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
from flask import Flask, jsonify, request
from flask_migrate import Migrate
from sqlalchemy.exc import IntegrityError

from flask_quota import Quota
from flask_quota.admin import AdminError, QuotaAdmin

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__, instance_relative_config=True)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    app.config.update(config or {})
    quota = Quota(app)  # API keys are looked up in the quota tables
    Migrate().init_app(app, directory=str(MIGRATIONS))
    if click.get_current_context(silent=True) is None:
        # Serving, not `flask db ...`: a migration command must find the database as is.
        with app.app_context():
            _demo_clients(app)

    @app.get("/")
    def index() -> Any:
        return jsonify(
            service="flask-quota demo",
            endpoints=["GET /v1/items", "GET /v1/search?q=", "POST /v1/ai/infer", "GET /healthz"],
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

    @app.get("/healthz")
    @quota.exempt
    def health() -> Any:
        return jsonify(status="ok")

    return app


def _demo_clients(app: Flask) -> None:
    """One demo client per plan, made at first start; their keys are printed once.

    Several gunicorn workers start at once: a client name is unique, so a worker
    that loses the race to create one simply skips it.
    """
    store = app.extensions["quota"].sql
    admin = QuotaAdmin(store, actor="wsgi demo")
    existing = {client.name for client in admin.clients()}
    made = []
    for plan in admin.plans():
        name = f"demo-{plan.name}"
        if name in existing:
            continue
        try:
            info, key = admin.create_client(name, plan.name)
        except (AdminError, IntegrityError):
            continue  # another worker made it
        made.append(f"  {info.plan:<12} client {info.id:<3} {key}")
    if made:
        lines = "\n".join(made)
        print(
            f"flask-quota demo API keys (send as X-API-Key; shown once):\n{lines}", file=sys.stderr
        )


app = create_app()
