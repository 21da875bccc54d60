"""An app with a tenant tier, and its callers: for the tenant tests on every backend."""

from __future__ import annotations

from typing import Any

from flask import Flask, request
from flask.testing import FlaskClient

from flask_quota import Identity, Quota
from flask_quota.storage import Storage

__all__ = ["PLANS", "alternate", "get", "tenant_app"]

# Who is calling: X-Client names the identity, X-Tenant its tenant (none when absent).
PLANS: dict[str, Any] = {
    "pro": {"global": "1000/minute", "tenant": "5/minute", "user": "100/minute"},
}


def tenant_app(app: Flask, storage: Storage | None, **config: Any) -> tuple[Quota, FlaskClient]:
    app.config.update(
        {"QUOTA_PLANS": PLANS, "QUOTA_DEFAULT_PLAN": "pro", "QUOTA_ANONYMOUS_PLAN": "pro", **config}
    )
    quota = Quota(app, storage=storage)

    @quota.identity_loader
    def from_headers() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client, "pro", request.headers.get("X-Tenant")) if client else None

    @app.get("/work")
    def work() -> str:
        return "ok"

    return quota, app.test_client()


def get(http: FlaskClient, client: str, tenant: str | None = None) -> Any:
    headers = {"X-Client": client}
    if tenant is not None:
        headers["X-Tenant"] = tenant
    return http.get("/work", headers=headers)


def alternate(http: FlaskClient) -> list[int]:
    """alice and bob of tenant acme, in turn, seven requests."""
    return [get(http, ("alice", "bob")[i % 2], "acme").status_code for i in range(7)]
