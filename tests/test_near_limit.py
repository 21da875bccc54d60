"""QUOTA_NEAR_LIMIT: a request that takes a bucket across the line is told once, on
every backend, whichever server decided it; the metric and the dashboard agree."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request

from flask_quota import Identity, Quota, signals
from flask_quota.core.near import is_near, room
from flask_quota.testing import FrozenClock
from tests.redis_probes import CountingConnection, counting_client
from tests.servers import RedisServer

pytestmark = pytest.mark.also_valkey

PLANS = {"pro": {"global": "1000/minute", "user": "10/minute"}}


def near_app(tmp_path: Path, name: str, **config: Any) -> tuple[Flask, Quota]:
    app = Flask(name, instance_path=str(tmp_path / name))
    app.config.update(QUOTA_PLANS=PLANS, QUOTA_DEFAULT_PLAN="pro", QUOTA_ANONYMOUS_PLAN="pro")
    storage = config.pop("storage", None)
    app.config.update(config)
    quota = Quota(app, storage=storage)

    @quota.identity_loader
    def alice() -> Identity:
        return Identity("alice", plan="pro")

    @app.get("/items")
    def items() -> str:
        return "ok"

    return app, quota


@pytest.fixture
def heard() -> Iterator[list[tuple[Any, Any, Any]]]:
    """Every quota_near_limit sent while the test runs: (sender, decision, check)."""
    got: list[tuple[Any, Any, Any]] = []

    def receiver(sender: Any, decision: Any, check: Any, **extra: Any) -> None:
        got.append((sender, decision, check))

    signals.quota_near_limit.connect(receiver)
    yield got
    signals.quota_near_limit.disconnect(receiver)


def test_two_apps_on_one_redis_hear_the_crossing_once(
    own_redis: RedisServer,
    tmp_path: Path,
    heard: list[tuple[Any, Any, Any]],
    close_sql: Callable[[Flask], Flask],
) -> None:
    """Two apps (two servers' worth of workers) share one Redis; twelve requests of one
    caller alternate between them on a 10/minute bucket: 200 x10, 429, 429, and
    quota_near_limit fires exactly once, for the user tier, at the 8th request."""
    apps = [
        close_sql(near_app(tmp_path, name, QUOTA_STORAGE_URL=own_redis.url)[0])
        for name in ("one", "two")
    ]
    statuses, at = [], []
    for i in range(12):
        before = len(heard)
        statuses.append(apps[i % 2].test_client().get("/items").status_code)
        if len(heard) > before:
            at.append(i + 1)
    assert statuses == [200] * 10 + [429, 429]
    assert at == [8]
    sender, decision, check = heard[0]
    assert sender is apps[1]  # the app whose request crossed
    assert (check.tier.value, check.name, check.outcome.remaining) == ("user", "user", 2)
    assert decision.plan == "pro"


def test_memory_fires_once_per_crossing_and_again_after_a_refill(
    tmp_path: Path, heard: list[tuple[Any, Any, Any]], close_sql: Callable[[Flask], Flask]
) -> None:
    """On memory too: once at the crossing, not for the requests above the line; after
    the window refills below it, the next climb crosses again."""
    clock = FrozenClock()
    from flask_quota.storage import MemoryStorage

    app, _ = near_app(
        tmp_path, "mem", storage=MemoryStorage(clock=clock), QUOTA_ALGORITHM="fixed_window"
    )
    close_sql(app)
    http = app.test_client()
    assert [http.get("/items").status_code for _ in range(11)] == [200] * 10 + [429]
    assert [c.name for _, _, c in heard] == ["user"]
    clock.advance(60)
    assert [http.get("/items").status_code for _ in range(9)] == [200] * 9
    assert [c.name for _, _, c in heard] == ["user", "user"]


def test_none_turns_the_warning_off(
    tmp_path: Path, heard: list[tuple[Any, Any, Any]], close_sql: Callable[[Flask], Flask]
) -> None:
    """QUOTA_NEAR_LIMIT=None: the same climb sends nothing."""
    app, _ = near_app(tmp_path, "off", QUOTA_NEAR_LIMIT=None)
    close_sql(app)
    http = app.test_client()
    assert [http.get("/items").status_code for _ in range(10)] == [200] * 10
    assert heard == []


def test_the_metric_counts_crossings_in_one_round_trip(
    own_redis: RedisServer, tmp_path: Path, close_sql: Callable[[Flask], Flask]
) -> None:
    """flask_quota_near_limit_total{tier,resource,plan} counts the one crossing, and a
    request (the crossing one included) still costs one round trip with metrics on."""
    from flask_quota.storage.redis import RedisStorage

    client = counting_client(own_redis)
    app, _ = near_app(
        tmp_path, "metrics", storage=RedisStorage(client, clock=FrozenClock()),
        QUOTA_METRICS_URL="/metrics",
    )  # fmt: skip
    close_sql(app)
    http = app.test_client()
    http.get("/items")  # warm the connection and the script cache
    for _ in range(8):
        before = CountingConnection.sent
        assert http.get("/items").status_code == 200
        assert CountingConnection.sent - before == 1
    text = http.get("/metrics").get_data(as_text=True)
    line = 'flask_quota_near_limit_total{plan="pro",resource="user",tier="user"} 1.0'
    assert line in text, text


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.1, "high", True, "nan"])
def test_a_share_outside_0_to_1_is_refused(tmp_path: Path, value: object) -> None:
    """A bad QUOTA_NEAR_LIMIT fails at init_app with the key and the fix."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_NEAR_LIMIT"] = value
    with pytest.raises(ValueError, match=r"QUOTA_NEAR_LIMIT=.*between 0 and 1"):
        Quota(app)


def test_the_line_is_exact_for_decimal_shares() -> None:
    """0.8 of 10 is 8 units used, not 9 (float rounding); at least one unit is used."""
    assert room(10, 0.8) == 2
    assert room(10, 0.7) == 3  # 0.7 * 10 is 7.000000000000001 as a float
    assert room(3, 0.1) == 2
    assert is_near(10, 2, 0.8) and not is_near(10, 3, 0.8)
    assert not is_near(0, 0, 0.8)


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory, server_kind: str) -> Iterator[Any]:
    from tests.conftest import need_server
    from tests.sentinel import SentinelGroup

    need_server(server_kind)
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel"), kind=server_kind)
    yield group
    group.stop()


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("backend", ["cluster", "sentinels"])
def test_cluster_and_sentinel_hear_the_crossing_once(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    heard: list[tuple[Any, Any, Any]],
    close_sql: Callable[[Flask], Flask],
) -> None:
    """The same on a Redis Cluster (global and user keys in different slots, decided per
    slot) and behind Sentinel: two apps, twelve alternating requests, one crossing."""
    url = request.getfixturevalue(backend).url
    prefix = f"near{backend}{id(heard)}"
    config = {"QUOTA_STORAGE_URL": url, "QUOTA_KEY_PREFIX": prefix, "QUOTA_STORAGE_TIMEOUT": 0.5}
    apps = [close_sql(near_app(tmp_path, name, **config)[0]) for name in ("one", "two")]
    statuses = [apps[i % 2].test_client().get("/items").status_code for i in range(12)]
    assert statuses == [200] * 10 + [429, 429]
    assert [(c.name, c.outcome.remaining) for _, _, c in heard] == [("user", 2)]


@pytest.mark.parametrize(
    ("estimate", "actual", "told"),
    [(900, 50, None), (1, 850, 150), (900, 900, 100), (1, 1, None), (1, 0, None)],
)
def test_a_settled_request_is_judged_on_what_it_was_charged(
    tmp_path: Path,
    heard: list[tuple[Any, Any, Any]],
    close_sql: Callable[[Flask], Flask],
    estimate: int,
    actual: int,
    told: int | None,
) -> None:
    """Found in review: an estimate of 900 settled at 50 fired "100 left" while 950 were
    left; settling 850 of 1,000 fired nothing. A request's endpoint tier crosses the
    line by what it was finally charged: ``quota.settle``'s actual cost."""
    app, quota = near_app(tmp_path, "settle")
    close_sql(app)

    @app.post("/infer/<int:estimate>/<int:actual>")
    @quota.limit(
        "1000/hour", resource="tokens", unit="tokens",
        cost=lambda: int(request.view_args["estimate"]),  # type: ignore[index]
    )  # fmt: skip
    def infer(estimate: int, actual: int) -> str:
        quota.settle(actual)
        return "ok"

    response = app.test_client().post(f"/infer/{estimate}/{actual}")
    assert response.status_code == 200
    endpoint = [(d, c) for _, d, c in heard if c.tier.value == "endpoint"]
    if told is None:
        assert endpoint == []
    else:
        ((decision, check),) = endpoint
        assert check.outcome.remaining == told
        assert decision.results[-1].outcome.remaining == told


def test_a_charge_after_the_response_may_cross_the_line(
    tmp_path: Path, heard: list[tuple[Any, Any, Any]], close_sql: Callable[[Flask], Flask]
) -> None:
    """``quota.charge(n)`` after the response is charged too: taking the bucket across
    the line, it is told then (once)."""
    app, quota = near_app(tmp_path, "charge")
    close_sql(app)

    @app.post("/work")
    @quota.limit("100/hour", resource="work")
    def work() -> str:
        quota.charge(84)
        return "ok"

    http = app.test_client()
    assert http.post("/work").status_code == 200  # 85 used: across 80
    assert http.post("/work").status_code == 200  # 170: in debt, above the line already
    assert [c.outcome.remaining for _, _, c in heard if c.tier.value == "endpoint"] == [15]
