"""Several ``@quota.limit`` on one view: all checked, all-or-nothing, in one storage call."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from flask import Flask, Response, g, request
from redis.crc import key_slot

from flask_quota import Identity, Quota
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.keys import KeyBuilder, remote_ip_tag
from flask_quota.storage import MemoryStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock, assert_limited
from tests.redis_probes import CountingConnection, counting_client
from tests.servers import RedisServer

USER = {"free": {"user": "1000/minute"}}  # the user tier stays out of the way


def export_app(app: Flask, storage: Any) -> tuple[Flask, Quota]:
    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=storage)

    @app.get("/export")
    @quota.limit("2/second")
    @quota.limit("3/day", resource="export_daily")
    def export() -> str:
        return "ok"

    return app, quota


def test_two_second_stacked_on_three_a_day(app: Flask, clock: FrozenClock) -> None:
    """2/second on 3/day: 200 200 429 (the second's), then after a second 200 429, and
    that 429 names the daily resource, in its body and its headers."""
    http = export_app(app, MemoryStorage(clock))[0].test_client()
    first = [http.get("/export") for _ in range(3)]
    assert [r.status_code for r in first] == [200, 200, 429]
    assert first[2].get_json()["resource"] == "export"  # the 2/second limit, automatic name
    clock.advance(1)
    later = [http.get("/export") for _ in range(2)]
    assert [r.status_code for r in later] == [200, 429]
    body = later[1].get_json()
    assert body["resource"] == "export_daily"
    assert body["violated-policies"] == ["export_daily"]
    assert later[1].headers["X-RateLimit-Resource"] == "export_daily"
    assert later[1].headers["X-RateLimit-Limit"] == "3"


def test_a_denial_charges_no_limit_of_the_stack(app: Flask, clock: FrozenClock) -> None:
    """All-or-nothing: requests the daily limit denies take nothing from the per-second one."""
    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/x")
    @quota.limit("1/day", resource="daily")
    @quota.limit("5/minute", resource="minutely")
    def x() -> str:
        return "ok"

    http = app.test_client()
    assert http.get("/x").status_code == 200
    for _ in range(10):
        assert http.get("/x").get_json()["resource"] == "daily"
    buckets = {b.name: b.remaining for b in _peek(app, quota) if b.tier == "endpoint"}
    assert buckets == {"daily (GET)": 0, "minutely (GET)": 4}


def _peek(app: Flask, quota: Quota) -> list[Any]:
    with app.app_context():
        return quota.peek(ip="127.0.0.1")


def test_automatic_resources_are_distinct(app: Flask, clock: FrozenClock) -> None:
    """The limit nearest the function keeps the endpoint's name (as a single limit does);
    a further one without a resource gets ``ENDPOINT.2``: their own buckets."""
    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/a")
    @quota.limit("10/minute")
    @quota.limit("2/minute")
    def a() -> str:
        return "ok"

    http = app.test_client()
    answers = [http.get("/a") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert answers[2].get_json()["resource"] == "a"
    buckets = {b.name: b.remaining for b in _peek(app, quota) if b.tier == "endpoint"}
    assert buckets == {"a (GET)": 0, "a.2 (GET)": 8}


def test_each_limit_keeps_its_own_options(app: Flask, clock: FrozenClock) -> None:
    """cost, key and exempt_when are each limit's own."""
    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/org")
    @quota.limit("10/minute", resource="per_org", key=lambda: request.args["org"], cost=5)
    @quota.limit("3/minute", resource="mine", exempt_when=lambda: "free" in request.args)
    def org() -> str:
        return "ok"

    http = app.test_client()
    assert http.get("/org?org=a").status_code == 200
    assert http.get("/org?org=a").status_code == 200
    denied = http.get("/org?org=a")  # per_org: 10 used of 10
    assert denied.get_json()["resource"] == "per_org"
    assert http.get("/org?org=b&free=1").status_code == 200  # org b's bucket; mine exempt
    assert http.get("/org?org=c").status_code == 200  # mine: 3rd unit
    assert http.get("/org?org=d").get_json()["resource"] == "mine"


def test_two_limits_with_one_resource_are_refused(app: Flask) -> None:
    quota = Quota(app, storage=MemoryStorage())
    with pytest.raises(ValueError, match="search"):

        @quota.limit("1/second", resource="search")
        @quota.limit("1/day", resource="search")
        def view() -> str:
            return "ok"


def test_stacked_limits_cost_one_round_trip(redis_server: RedisServer, app: Flask) -> None:
    """Three limits on a view and the user tier: one round trip, allowed or denied."""
    client = counting_client(redis_server)
    client.flushall()
    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=RedisStorage(client, clock=FrozenClock()))

    @quota.identity_loader
    def who() -> Identity:
        return Identity(id="alice", plan="free")

    @app.get("/x")
    @quota.limit("2/minute")
    @quota.limit("5/minute, 100/day", resource="b")
    @quota.limit("3/minute", resource="c", key=lambda: g.get("org", "o"))
    def x() -> str:
        return "ok"

    http = app.test_client()
    http.get("/x")  # warm the connection and the script cache
    statuses = []
    for _ in range(3):
        before = CountingConnection.sent
        statuses.append(http.get("/x").status_code)
        assert CountingConnection.sent - before == 1
    assert statuses == [200, 429, 429]


def test_a_blueprint_takes_stacked_limits(app: Flask, clock: FrozenClock) -> None:
    from flask import Blueprint

    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=MemoryStorage(clock))
    bp = Blueprint("api", __name__)

    @bp.get("/y")
    def y() -> str:
        return "ok"

    quota.limit("1/day", resource="api_daily")(quota.limit("5/second")(bp))
    app.register_blueprint(bp)
    http = app.test_client()
    assert http.get("/y").status_code == 200
    assert http.get("/y").get_json()["resource"] == "api_daily"


def test_charge_when_refunds_only_its_own_limit(app: Flask, clock: FrozenClock) -> None:
    """A failed response is refunded on the limit whose charge_when says so (wherever it
    sits in the stack), and still counted on the other."""
    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/login")
    @quota.limit("5/minute", resource="failures", charge_when=lambda r: r.status_code >= 400)
    @quota.limit("10/minute", resource="attempts")
    def login() -> tuple[str, int]:
        return "no", 401 if "bad" in request.args else 200

    http = app.test_client()
    http.get("/login")
    http.get("/login?bad=1")
    buckets = {b.name: b.remaining for b in _peek(app, quota) if b.tier == "endpoint"}
    assert buckets == {"failures (GET)": 4, "attempts (GET)": 8}


def test_stacked_limits_in_two_slots_of_a_cluster(cluster: Any, app: Flask) -> None:
    """On Redis Cluster a stack whose key= limit lives in another slot is still
    all-or-nothing (the team's denial leaves the caller's own limit as it was), and
    quota.settle corrects both slots."""
    cluster.wait_healthy()
    client = cluster.client()
    try:
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    finally:
        client.close()
    app.config.update(
        QUOTA_STORAGE_URL=cluster.url,
        QUOTA_STORAGE_TIMEOUT=0.5,
        QUOTA_PLANS=USER,
        QUOTA_ALGORITHM="fixed_window",
        QUOTA_DENY_CACHE=False,
    )
    quota = Quota(app)

    @app.get("/team")
    @quota.limit("30/day", resource="team", key=lambda: "blue", cost=10)
    @quota.limit("100/day", resource="mine", cost=10)
    def team() -> str:
        if "actual" in request.args:
            quota.settle(int(request.args["actual"]))
        return "ok"

    http = app.test_client()
    assert http.get("/team?actual=5").status_code == 200  # team 5, mine 5
    assert [http.get("/team").status_code for _ in range(3)] == [200, 200, 429]
    with app.app_context():
        mine = [b.remaining for b in quota.peek(ip="127.0.0.1") if b.name == "mine (GET)"]
    assert mine == [75]  # 5 + 10 + 10: the denied request took nothing here
    keys, fw = KeyBuilder("quota"), Algorithm.FIXED_WINDOW
    team_key = keys.endpoint_key(keys.key_tag("blue"), "GET", "team", fw)
    mine_key = keys.endpoint_key(remote_ip_tag("127.0.0.1"), "GET", "mine", fw)
    assert key_slot(team_key.encode()) != key_slot(mine_key.encode())


def test_one_limit_left_of_a_stack_is_that_limit(app: Flask, clock: FrozenClock) -> None:
    """When key= or exempt_when leaves one limit of a stack, the request is decided on
    that one: whichever it is (their routes are not confused)."""
    app.config.update(QUOTA_PLANS=USER)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/s")
    @quota.limit(
        "1/minute",
        resource="per_org",
        # docs/usage.md: ``key() -> str | None``; Quota.limit's annotation says ``str``.
        key=lambda: request.args.get("org"),
    )
    @quota.limit("3/minute", resource="mine", exempt_when=lambda: "org" in request.args)
    def s() -> str:
        return "ok"

    http = app.test_client()
    assert [http.get("/s").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert http.get("/s").get_json()["resource"] == "mine"
    assert [http.get("/s?org=a").status_code for _ in range(2)] == [200, 429]
    assert http.get("/s?org=a").get_json()["resource"] == "per_org"


def test_a_stacked_limits_concurrent_takes_a_lease_of_its_own(
    app: Flask, clock: FrozenClock
) -> None:
    """Stacked with a rate, a limit's ``concurrent=`` holds its slot while a stream is open;
    the denial names its resource, and the stream's end frees the slot."""
    app.config.update(QUOTA_PLANS={"free": {}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/stream")
    @quota.limit("2/minute", resource="per_minute")
    @quota.limit(concurrent=1, resource="in_flight")
    def stream() -> Response:
        return app.response_class(iter(["a", "b"]))

    http = app.test_client()
    open_stream = http.get("/stream", buffered=False)
    assert open_stream.status_code == 200
    assert open_stream.headers["X-Concurrency-Remaining"] == "0"
    denied = http.get("/stream")
    body = assert_limited(denied, tier="concurrent", resource="in_flight")
    assert body["detail"].startswith("1 request in flight at once")
    open_stream.close()
    again = http.get("/stream")  # the slot is back; the denial above charged no minute
    assert again.status_code == 200
    assert again.headers["X-RateLimit-Remaining"] == "0"


def test_an_automatic_name_never_takes_another_limits_resource(
    app: Flask, clock: FrozenClock
) -> None:
    """A limit without a resource on a view named like another limit's resource gets a
    name of its own: both limits apply, each to its own bucket (before, the literal
    limit was named ``ai_inference`` too, and the plan's 5/minute ruled both)."""
    app.config.update(QUOTA_PLANS={"free": {"resources": {"ai_inference": "5/minute"}}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.post("/v1/ai")
    @quota.limit(resource="ai_inference")
    @quota.limit("2/second")
    def ai_inference() -> str:
        return "ok"

    http = app.test_client()
    assert [http.post("/v1/ai").status_code for _ in range(3)] == [200, 200, 429]
    denied = http.post("/v1/ai")
    assert denied.get_json()["resource"] == "ai_inference.2"
    policy = denied.headers["RateLimit-Policy"]
    assert '"ai_inference";q=5;w=60' in policy and '"ai_inference.2";q=2;w=1' in policy
