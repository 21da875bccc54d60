"""The app ``python -m bench.overload`` serves: ``GET /work`` holds a connection of a
small SQLAlchemy pool to a real PostgreSQL for ``pg_sleep(BENCH_SLEEP_MS)``, so the pool
is the service's bottleneck, as a database is in production.

Served as ``gunicorn bench.overload_app:app``, configured by the environment:
``BENCH_DATABASE_URL``, ``BENCH_POOL`` (connections per worker), ``BENCH_POOL_TIMEOUT``
(seconds a request waits for one before SQLAlchemy's ``TimeoutError``, a 500),
``BENCH_SLEEP_MS``, ``BENCH_USER_RATE`` (each caller's limit), and every ``QUOTA_*``
setting (``QUOTA_RESERVE`` as JSON). A caller is its ``X-User`` (each has the plan's
per-user rate), a request's class its ``X-Priority`` (``QUOTA_PRIORITY``).
"""

from __future__ import annotations

import os

from flask import Flask, request
from sqlalchemy import create_engine, text

from flask_quota import Identity, Quota

SLEEP = float(os.environ.get("BENCH_SLEEP_MS", "100")) / 1000

engine = create_engine(
    os.environ["BENCH_DATABASE_URL"],
    pool_size=int(os.environ.get("BENCH_POOL", "3")),
    max_overflow=0,
    pool_timeout=float(os.environ.get("BENCH_POOL_TIMEOUT", "5")),
)

app = Flask("bench_overload")
app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
app.config.update(
    QUOTA_PRIORITY=lambda: request.headers.get("X-Priority"),
    QUOTA_PLANS={"caller": {"user": os.environ.get("BENCH_USER_RATE", "120/minute")}},
    QUOTA_DEFAULT_PLAN="caller",
    QUOTA_ANONYMOUS_PLAN="caller",
    QUOTA_DATABASE_URL="sqlite://",  # the plans above, in each worker
)
quota = Quota(app)


@quota.identity_loader
def identity() -> Identity | None:
    user = request.headers.get("X-User")
    return Identity(user, "caller") if user else None


@app.get("/work")
def work() -> str:
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_sleep(:s)"), {"s": SLEEP})
    return "ok"


@app.get("/healthz")
@quota.exempt
def healthz() -> str:
    return "ok"


@app.get("/adaptive")
@quota.exempt
def adaptive() -> dict[str, int | None]:
    """This worker's adaptive limit (None without ``QUOTA_ADAPTIVE``): the bench samples
    it to time how the limit settles."""
    shedder = app.extensions["quota"].shedder
    gradient = shedder.gradient if shedder is not None else None
    return {"pid": os.getpid(), "limit": gradient.limit if gradient is not None else None}
