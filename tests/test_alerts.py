"""``QUOTA_ALERTS``: a calendar quota's shares are told once per bucket, share and period.

In-process on memory storage and on a real redis-server; the race of 4 gunicorn
workers is in tests/test_ledger_gunicorn.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request

from flask_quota import Identity, Quota, signals
from flask_quota.state import get_state
from tests.servers import RedisServer


def alert_app(app: Flask, **config: Any) -> Quota:
    app.config.update(
        QUOTA_PLANS={"free": {"user": "10/month", "resources": {"tokens": "100/month"}}},
        QUOTA_DATABASE_URL=f"sqlite:///{app.instance_path}/q.sqlite3",
    )
    app.config.update(config)
    quota = Quota(app)

    @quota.identity_loader
    def caller() -> Identity:
        return Identity(request.headers.get("X-User", "ada"))

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    @app.get("/tokens")
    @quota.limit(
        resource="tokens",
        cost=lambda: int(request.args.get("cost", 1)),
        charge_when=lambda r: r.status_code < 400,
    )
    def tokens() -> tuple[str, int]:
        return "ok", int(request.args.get("status", 200))

    return quota


@pytest.fixture
def told(app: Flask) -> Iterator[list[dict[str, Any]]]:
    found: list[dict[str, Any]] = []

    def receiver(sender: Flask, **kwargs: Any) -> None:
        found.append(kwargs)

    signals.quota_alert.connect(receiver, app)
    yield found
    signals.quota_alert.disconnect(receiver, app)


def drain(app: Flask) -> None:
    """What the writer thread does: claim the noted crossings and tell them."""
    alerts = get_state(app).alerts
    assert alerts is not None
    alerts.process()


def test_each_share_is_told_once_as_the_quota_fills(app: Flask, told: list[dict[str, Any]]) -> None:
    """10/month: the 5th request crosses 50%, the 8th 80%, the 10th 100%; each is told
    once, with who, which quota, which share and which period."""
    alert_app(app)
    http = app.test_client()
    shares = []
    for n in range(1, 12):
        status = http.get("/ping").status_code
        assert status == (200 if n <= 10 else 429)
        drain(app)
        shares.append([t["share"] for t in told])
    assert shares[3] == [] and shares[4] == [0.5] and shares[7] == [0.5, 0.8]
    assert [t["share"] for t in told] == [0.5, 0.8, 1.0]
    first = told[0]
    assert first["identity"] == "ada" and first["resource"] == "user"
    assert first["client"] is None and first["tenant"] is None
    assert first["period"]["start"] < first["period"]["end"]


def test_a_refund_below_the_line_does_not_tell_it_again(
    app: Flask, told: list[dict[str, Any]]
) -> None:
    """A request that crosses 50% and is refunded (charge_when) takes the bucket back
    under the line; the next one crosses it again, and nobody is told twice."""
    alert_app(app, QUOTA_ALERTS=(0.5,))
    http = app.test_client()
    assert http.get("/tokens?cost=49").status_code == 200
    assert http.get("/tokens?cost=1&status=500").status_code == 500  # crosses, refunded
    drain(app)
    assert http.get("/tokens?cost=1").status_code == 200  # crosses again
    drain(app)
    assert [(t["resource"], t["share"]) for t in told] == [("tokens", 0.5)]


def test_a_charge_after_the_response_is_judged_by_what_it_finally_cost(
    app: Flask, told: list[dict[str, Any]]
) -> None:
    """A request admitted at 1 unit whose view adds 39 more (``quota.charge``) takes
    the bucket from 50 to 90 of 100: across 80%, told; its admission alone was not."""
    quota = alert_app(
        app,
        QUOTA_ALERTS=(0.8,),
        QUOTA_PLANS={"free": {"user": "1000/month", "resources": {"tokens": "100/month"}}},
    )

    @app.get("/charged")
    @quota.limit(resource="tokens")
    def charged() -> str:
        quota.charge(int(request.args["extra"]))
        return "ok"

    http = app.test_client()
    for _ in range(50):
        assert http.get("/tokens?cost=1").status_code == 200
    drain(app)
    assert told == []
    assert http.get("/charged?extra=39").headers["X-RateLimit-Remaining"] == "10"
    drain(app)
    assert [(t["resource"], t["share"]) for t in told] == [("tokens", 0.8)]


def test_alerts_off_tells_nothing(app: Flask, told: list[dict[str, Any]]) -> None:
    """QUOTA_ALERTS=None: a quota filled to the end tells no alert."""
    alert_app(app, QUOTA_ALERTS=None)
    assert get_state(app).alerts is None
    http = app.test_client()
    for _ in range(11):
        http.get("/ping")
    assert told == []


def test_two_apps_on_one_redis_tell_each_crossing_once(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Two apps (two servers) sharing one redis-server, taking turns on one caller's
    monthly quota: each share is told by exactly one of them, once."""
    apps = [Flask(f"a{i}", instance_path=str(tmp_path / f"i{i}")) for i in range(2)]
    found: list[tuple[int, float]] = []
    for i, app in enumerate(apps):
        alert_app(app, QUOTA_STORAGE_URL=own_redis.url)

        def receiver(sender: Flask, i: int = i, **kwargs: Any) -> None:
            found.append((i, kwargs["share"]))

        signals.quota_alert.connect(receiver, app, weak=False)
    try:
        clients = [app.test_client() for app in apps]
        for n in range(10):
            assert clients[n % 2].get("/ping").status_code == 200
            # Both writers look at what they noted (only the crossing request's noted it).
            for app in apps:
                drain(app)
        assert sorted(share for _, share in found) == [0.5, 0.8, 1.0]
        # The 5th request (n=4) went to app 0 and crossed 50%: app 0 told it.
        assert (0, 0.5) in found
    finally:
        for app in apps:
            signals.quota_alert.receivers.clear()
            get_state(app).sql.close()
