"""The flask-quota demo API: ``gunicorn wsgi:app``.

Every ``QUOTA_*`` setting is read from the environment variable of the same
name. With nothing set it runs on the embedded defaults: memory storage, the
seed's free/pro/enterprise plans, no services needed.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from flask import Flask, jsonify, request

from flask_quota import Identity, Quota

PLANS = ("free", "pro", "enterprise")


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__, instance_relative_config=True)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    app.config.update(config or {})
    quota = Quota(app)
    keys = _demo_keys(Path(app.instance_path))

    @quota.api_key_loader
    def lookup(key: str) -> Identity | None:
        plan = keys.get(key)
        return Identity(f"demo-{plan}", plan) if plan else None

    @app.get("/")
    def index() -> Any:
        return jsonify(
            service="flask-quota demo",
            endpoints=["GET /v1/items", "GET /v1/search?q=", "POST /v1/ai/infer", "GET /healthz"],
            api_key_header=app.config["QUOTA_API_KEY_HEADER"],
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


def _demo_keys(instance: Path) -> dict[str, str]:
    """One demo API key per plan, made at first start and kept in the instance folder.

    Several gunicorn workers start at once: the first creates the file
    exclusively, the others wait for it.
    """
    instance.mkdir(parents=True, exist_ok=True)
    path = instance / "demo_api_keys.json"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):
            try:
                return dict(json.loads(path.read_text()))
            except (json.JSONDecodeError, OSError):
                time.sleep(0.1)
        raise
    keys = {f"demo_{plan}_{secrets.token_urlsafe(18)}": plan for plan in PLANS}
    with os.fdopen(fd, "w") as file:
        json.dump(keys, file)
    lines = "\n".join(f"  {plan:<10} {key}" for key, plan in keys.items())
    print(f"flask-quota demo API keys (send as X-API-Key; see {path}):\n{lines}", file=sys.stderr)
    return keys


app = create_app()
