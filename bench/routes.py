"""Per-request cost when a view's cost varies: ``python -m bench.routes``.

A cost from a callable (``@quota.limit(cost=...)``: tokens, rows, bytes) can
take thousands of values, and each (plan, endpoint, method, cost) has a route
of its own (``flask_quota/route.py``). The route cache holds two generations of
4,096; this measures what a request costs when its app sees 1, 100, 5,000 or
20,000 distinct costs, cycled in order (the hardest order for a bounded cache),
each app with its own cache. Memory storage, three tiers, straight to WSGI,
interleaved rounds (``bench.timing``); the ratio is to the one-cost app.
"""

from __future__ import annotations

import argparse
from typing import Any

from flask import Flask, request
from werkzeug.test import EnvironBuilder

from .timing import Case, median, run

COSTS = (1, 100, 5_000, 20_000)
USERS = 1_000


def cost_app() -> Flask:
    from flask_quota import Identity, Quota

    app = Flask("bench_routes")
    app.config.update(
        QUOTA_STORAGE_URL="memory://",
        QUOTA_DATABASE_URL="sqlite://",
        QUOTA_DEFAULT_PLAN="b",
        QUOTA_ANONYMOUS_PLAN="b",
        # Never denies: every request takes the admitted path.
        QUOTA_PLANS={
            "b": {
                "global": "100000/second",
                "user": "100000/second",
                "resources": {"res": "100000000/day"},
            }
        },
    )
    quota = Quota(app)

    @quota.identity_loader
    def identity() -> Identity:
        return Identity(request.headers.get("X-User", "anonymous"), "b")

    @app.get("/res")
    @quota.limit(resource="res", cost=lambda: int(request.headers.get("X-Cost", "1")))
    def res() -> str:
        return "ok"

    return app


def driver(costs: int) -> Case:
    """One app whose requests cycle through ``costs`` distinct costs."""
    wsgi = cost_app().wsgi_app
    template = EnvironBuilder(path="/res", method="GET").get_environ()
    turn = [0]
    statuses: dict[str, int] = {}

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
        statuses[status[:3]] = statuses.get(status[:3], 0) + 1
        return lambda _: None

    def call() -> None:
        i = turn[0] = turn[0] + 1
        environ = dict(template)
        environ["HTTP_X_USER"] = f"u{i % USERS}"
        environ["HTTP_X_COST"] = str(1 + i % costs)
        for _ in wsgi(environ, start_response):
            pass

    def check() -> None:
        if set(statuses) != {"200"}:
            raise AssertionError(f"{costs} costs: expected only 200s, got {statuses}")

    return Case(f"{costs} costs", call, check)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.routes", description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=1000)
    ns = parser.parse_args()
    cases = [driver(n) for n in COSTS]
    # Warm-up: every app first sees each of its costs (run() warms one batch more).
    for case, n in zip(cases, COSTS, strict=True):
        for _ in range(min(n, 2 * 4096) + ns.batch):
            case.call()
    run(cases, ns.rounds, ns.batch)
    base = median(cases[0])
    print(f"{'distinct costs':>14}  {'us/request':>10}  {'ratio to 1 cost':>15}")
    for case, n in zip(cases, COSTS, strict=True):
        print(f"{n:>14,}  {median(case):>10.1f}  {median(case) / base:>14.2f}x")


if __name__ == "__main__":
    main()
