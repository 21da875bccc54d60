"""The ledger's fleet app: ``gunicorn tests.apps.ledger:app``, configured by ``QUOTA_*``.

The caller names itself in ``X-Client`` (its tenant in ``X-Tenant``): fine for a test,
never for an app. ``/work`` charges ``cost`` units of ``tokens``, settles ``actual`` when
given, answers ``status`` (a ``charge_when`` refunds any status from 400); ``/tight``
has a rate of its own that denies, ``/alerted`` a monthly quota of 200. Every response
names its worker in ``X-Worker``. With ``ALERT_LOG``, each ``quota_alert`` this worker
sends appends a line (pid, resource, share) to that file.
"""

from __future__ import annotations

import os

from flask import Flask, request

from flask_quota import Identity, Quota, signals
from tests.apps import name_the_worker

__all__ = ["app", "create_app"]


def create_app() -> Flask:
    app = Flask(__name__)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    quota = Quota(app)

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client, tenant=request.headers.get("X-Tenant")) if client else None

    @app.get("/work")
    @quota.limit(
        resource="tokens",
        cost=lambda: int(request.args.get("cost", 1)),
        charge_when=lambda response: response.status_code < 400,
    )
    def work() -> tuple[str, int]:
        if "actual" in request.args:
            quota.settle(int(request.args["actual"]))
        return "done", int(request.args.get("status", 200))

    @app.get("/tight")
    @quota.limit("3/minute", resource="tight")
    def tight() -> str:
        return "done"

    @app.get("/alerted")
    @quota.limit("200/month", resource="alerted")
    def alerted() -> str:
        return "done"

    log = os.environ.get("ALERT_LOG")
    if log:

        def told(sender: Flask, **alert: object) -> None:
            with open(log, "a") as out:  # one short write per line: O_APPEND keeps it whole
                out.write(f"{os.getpid()} {alert['resource']} {alert['share']}\n")

        signals.quota_alert.connect(told, app, weak=False)

    name_the_worker(app, quota)

    return app


app = create_app()
