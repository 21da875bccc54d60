"""``quota.settle(actual)``: the endpoint charge becomes exactly ``actual`` after the response."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, request

from flask_quota import Quota
from flask_quota.core.algorithms import Algorithm
from flask_quota.storage import MemoryStorage, Storage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock
from tests.backends import backend  # noqa: F401  (the fixture)
from tests.helpers import left
from tests.redis_probes import CountingConnection, counting_client
from tests.servers import RedisServer

Backend = tuple[Storage, FrozenClock]


def metered(app: Flask, storage: Storage, algorithm: Algorithm = Algorithm.TOKEN_BUCKET) -> Quota:
    app.config.update(
        QUOTA_PLANS={"free": {"user": "1000/minute"}}, QUOTA_ALGORITHM=algorithm.value
    )
    quota = Quota(app, storage=storage)

    @app.post("/complete")
    @quota.limit("1000/hour", resource="tokens", cost=lambda: int(request.args.get("max", 100)))
    def complete() -> str:
        if "actual" in request.args:
            quota.settle(int(request.args["actual"]))
        for units in request.args.getlist("charge"):
            quota.charge(int(units))
        return "ok"

    @app.post("/judged")
    @quota.limit(
        "1000/hour", resource="judged", cost=100,
        charge_when=lambda response: response.status_code < 400,
    )  # fmt: skip
    def judged() -> tuple[str, int]:
        quota.settle(int(request.args["actual"]))
        return "ok", int(request.args.get("status", 200))

    return quota


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_settle_makes_the_charge_exact(app: Flask, backend: Backend, algorithm: Algorithm) -> None:  # noqa: F811
    """cost=100 then settle(10) leaves 990 of 1000; a request settling 300 leaves 690,
    on every algorithm, memory and Redis; the settled response's headers say so."""
    storage, _ = backend
    quota = metered(app, storage, algorithm)
    http = app.test_client()
    first = http.post("/complete?actual=10")
    assert first.status_code == 200
    assert first.headers["X-RateLimit-Remaining"] == "990"
    assert left(app, quota) == 990
    second = http.post("/complete?actual=300")
    assert second.headers["X-RateLimit-Remaining"] == "690"
    assert left(app, quota) == 690


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_settle_with_charge_and_charge_when(
    app: Flask,
    backend: Backend,  # noqa: F811
    algorithm: Algorithm,
) -> None:
    """settle sets the total, quota.charge(n) adds on top (called before or after
    settle); charge_when False refunds everything, settle included."""
    storage, _ = backend
    quota = metered(app, storage, algorithm)
    http = app.test_client()
    http.post("/complete?charge=5&actual=10")  # charge before settle: 10 + 5
    assert left(app, quota) == 985
    http.post("/complete?actual=10&charge=5&charge=1")  # after: 10 + 6
    assert left(app, quota) == 969
    http.post("/judged?actual=30")
    assert left(app, quota, "judged") == 970
    http.post("/judged?actual=30&status=500")  # not counted: nothing at all
    assert left(app, quota, "judged") == 970
    http.post("/judged?actual=300&status=404")  # even settled above the estimate
    assert left(app, quota, "judged") == 970


def test_settle_above_the_limit_is_debt(app: Flask, clock: FrozenClock) -> None:
    quota = metered(app, MemoryStorage(clock))
    http = app.test_client()
    assert http.post("/complete?max=1&actual=1500").status_code == 200
    assert left(app, quota) == -500  # owed
    denied = http.post("/complete?max=1")
    assert denied.status_code == 429


def test_settle_applies_to_every_limit_of_a_stack(app: Flask, clock: FrozenClock) -> None:
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.post("/s")
    @quota.limit("1000/hour", resource="a", cost=100)
    @quota.limit("500/hour", resource="b", cost=50)
    def s() -> str:
        quota.settle(7)
        return "ok"

    http = app.test_client()
    assert http.post("/s").status_code == 200
    assert left(app, quota, "a") == 993
    assert left(app, quota, "b") == 493


@pytest.mark.parametrize("actual", [-1, 1.5, "3", True])
def test_settle_refuses_what_is_not_a_count(app: Flask, actual: Any) -> None:
    quota = metered(app, MemoryStorage())
    with (
        app.test_request_context("/complete", method="POST"),
        pytest.raises(ValueError, match="settle"),
    ):
        quota.settle(actual)


def test_settle_needs_a_limited_view(app: Flask) -> None:
    quota = Quota(app, storage=MemoryStorage())

    @app.get("/free")
    def free() -> str:
        quota.settle(3)
        return "ok"

    app.config["TESTING"] = True
    with pytest.raises(RuntimeError, match="settle"):
        app.test_client().get("/free")


def test_the_last_settle_counts(app: Flask, clock: FrozenClock) -> None:
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.post("/twice")
    @quota.limit("1000/hour", resource="tokens", cost=100)
    def twice() -> str:
        quota.settle(50)
        quota.settle(20)
        return "ok"

    app.test_client().post("/twice")
    assert left(app, quota) == 980


def test_settling_costs_one_round_trip_after_the_response(
    redis_server: RedisServer, app: Flask
) -> None:
    """Admission stays one round trip; settling to another total adds one, settling to
    the admitted cost none."""
    client = counting_client(redis_server)
    client.flushall()
    metered(app, RedisStorage(client, clock=FrozenClock()))
    http = app.test_client()
    http.post("/complete?actual=100")  # warm the connection and the scripts
    http.post("/complete?actual=1")
    http.post("/complete?actual=101")  # the charge script too
    for actual, trips in [(100, 1), (10, 2), (300, 2)]:
        before = CountingConnection.sent
        assert http.post(f"/complete?actual={actual}").status_code == 200
        assert CountingConnection.sent - before == trips, actual
