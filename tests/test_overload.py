"""Overload protection: priority classes, the fleet's capacity with reserves, adaptive
capacity and queue time; sheds are 503s that charge no caller budget, and are told.

A streamed response holds its slot until it is closed, so the test client keeps
requests in flight for as long as a test needs (as in tests/test_leases.py). The
gunicorn must-shows are tests/test_overload_gunicorn.py; the collapse and the rescue,
bench/overload.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Blueprint, Flask, Response, g, request
from flask.testing import FlaskClient
from flask.views import MethodView
from werkzeug.test import TestResponse

from flask_quota import Identity, Quota, signals
from flask_quota.core.adaptive import Gradient
from flask_quota.core.priority import (
    Priority,
    class_limits,
    parse_priority,
    parse_reserve,
    queued_us,
)
from flask_quota.settings import Settings
from flask_quota.storage import MemoryStorage, Storage
from flask_quota.testing import FrozenClock
from tests.backends import backend  # noqa: F401  (a fixture)
from tests.capacity import capacity_scenario
from tests.prom import Scrape

PLANS = {"free": {"user": "1000/minute"}}


def overload_app(app: Flask, **config: Any) -> tuple[Quota, FlaskClient]:
    """``/hold/<cls>`` streams (holds its slot until closed), with ``@quota.priority``;
    ``/work`` is limited to 3/minute, default class; the caller is ``X-Who``."""
    app.config.update(QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL="sqlite://", **config)
    quota = Quota(app, storage=config.pop("storage", None) or MemoryStorage(FrozenClock()))

    @quota.identity_loader
    def who() -> Identity:
        return Identity(request.headers.get("X-Who", "alice"), "free")

    for cls in ("critical", "default", "sheddable"):
        app.add_url_rule(
            f"/hold/{cls}", f"hold_{cls}",
            quota.priority(cls)(lambda: Response(iter(["held"]))),
        )  # fmt: skip

    @app.get("/work")
    @quota.limit("3/minute")
    def work() -> str:
        return "done"

    return quota, app.test_client()


def hold(client: FlaskClient, cls: str) -> TestResponse:
    return client.get(f"/hold/{cls}")


@pytest.fixture
def shed_signals() -> Iterator[list[dict[str, Any]]]:
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    signals.quota_shed.connect(receiver)
    yield heard
    signals.quota_shed.disconnect(receiver)


# -- classes and reserves -------------------------------------------------------------


def test_the_reserves_give_each_class_its_line() -> None:
    """Critical: the whole capacity; default: all but the critical reserve; sheddable:
    all but both. Never a lower class's line above a higher one's, each at least 1."""
    reserve = parse_reserve({"critical": 0.2, "default": 0.1})
    assert class_limits(10, reserve) == {
        Priority.CRITICAL: 10, Priority.DEFAULT: 8, Priority.SHEDDABLE: 7,
    }  # fmt: skip
    assert class_limits(64, reserve) == {
        Priority.CRITICAL: 64, Priority.DEFAULT: 51, Priority.SHEDDABLE: 44,
    }  # fmt: skip
    assert class_limits(1, reserve) == dict.fromkeys(Priority, 1)
    assert class_limits(10, parse_reserve({})) == dict.fromkeys(Priority, 10)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"critical": 0.6, "default": 0.4}, "sum to 1"),
        ({"sheddable": 0.1}, "sheddable"),
        ({"critical": 1.5}, "from 0 to below 1"),
        ({"vip": 0.1}, "not a priority"),
        ("not json", "not valid JSON"),
        (["critical"], "must be a dict"),
    ],
)
def test_bad_reserves_are_refused_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_config({"QUOTA_RESERVE": value})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"QUOTA_CAPACITY": 0}, "QUOTA_CAPACITY"),
        ({"QUOTA_CAPACITY": "lots"}, "QUOTA_CAPACITY"),
        ({"QUOTA_CAPACITY": True}, "QUOTA_CAPACITY"),
        ({"QUOTA_MAX_QUEUE_MS": -5}, "QUOTA_MAX_QUEUE_MS"),
        ({"QUOTA_PRIORITY": "critical"}, "QUOTA_PRIORITY"),
        ({"QUOTA_ADAPTIVE": "maybe"}, "QUOTA_ADAPTIVE"),
    ],
)
def test_bad_overload_settings_are_refused_naming_the_key(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_config(config)


def test_a_class_is_one_of_three(app: Flask) -> None:
    quota = Quota(app, storage=MemoryStorage())
    assert parse_priority(" Critical ") is Priority.CRITICAL
    with pytest.raises(ValueError, match="'critical', 'default' or 'sheddable'"):
        quota.priority("urgent")
    with pytest.raises(ValueError, match="not a priority"):
        quota.limit("1/minute", priority="low")


def test_each_class_is_shed_at_its_line_and_never_while_a_lower_one_is_admitted(
    app: Flask, shed_signals: list[dict[str, Any]]
) -> None:
    """Capacity 10, the default reserves: with 7 in flight a sheddable request is shed
    (503, "capacity", its class), a default one admitted; at 8 a default one is shed, a
    critical one admitted up to 10. Slots come back when the responses close."""
    _, client = overload_app(app, QUOTA_CAPACITY=10)
    held = [hold(client, "default") for _ in range(7)]
    assert all(r.status_code == 200 for r in held)
    shed = hold(client, "sheddable")
    assert shed.status_code == 503 and shed.headers["Retry-After"] == "1"
    body = shed.get_json()
    assert (body["tier"], body["priority"], body["limit"]) == ("capacity", "sheddable", 7)
    assert body["status"] == 503
    held.append(hold(client, "default"))  # the 8th: default's line is 8
    assert held[-1].status_code == 200
    assert hold(client, "default").status_code == 503
    held += [hold(client, "critical"), hold(client, "critical")]
    assert [r.status_code for r in held[-2:]] == [200, 200]
    assert hold(client, "critical").status_code == 503  # 10 in flight: all of it
    assert [(s["priority"], s["reason"], s["shadow"]) for s in shed_signals] == [
        ("sheddable", "capacity", False), ("default", "capacity", False),
        ("critical", "capacity", False),
    ]  # fmt: skip
    for response in held:
        response.close()
    assert hold(client, "sheddable").status_code == 200  # every slot came back


def test_the_capacity_is_exact_on_every_storage(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """Memory, a real redis-server and a real valkey-server (Sentinel and Cluster run the
    same scenario in their modules): see ``tests/capacity.py``."""
    capacity_scenario(app, backend[0])


def test_a_shed_request_charges_no_caller_budget(app: Flask) -> None:
    """All-or-nothing: the fleet's capacity is decided in the same storage call as the
    caller's tiers, so a shed request leaves its endpoint and user buckets as they were
    (read through ``quota.peek``)."""
    quota, client = overload_app(app, QUOTA_CAPACITY=1)
    blocker = hold(client, "critical")  # the one slot, another caller's
    assert client.get("/work", headers={"X-Who": "bob"}).status_code == 503
    with app.app_context():
        before = {b.name: b.remaining for b in quota.peek(identity="bob")}
    assert before["work (GET)"] == 3 and before["user"] == 1000
    blocker.close()
    assert client.get("/work", headers={"X-Who": "bob"}).status_code == 200
    with app.app_context():
        after = {b.name: b.remaining for b in quota.peek(identity="bob")}
    assert (after["work (GET)"], after["user"]) == (2, 999)


def test_a_callers_own_limit_wins_over_a_shed(app: Flask) -> None:
    """A request its caller's limit refuses gets that 429, even when the fleet is full:
    it must wait for its own budget either way."""
    _, client = overload_app(app, QUOTA_CAPACITY=1)
    for _ in range(3):
        assert client.get("/work").status_code == 200
    blocker = hold(client, "critical")
    denied = client.get("/work")
    assert denied.status_code == 429 and denied.get_json()["tier"] == "endpoint"
    blocker.close()


def test_the_class_comes_from_the_callable_the_route_or_the_blueprint(app: Flask) -> None:
    """``QUOTA_PRIORITY``'s answer wins; else ``@quota.priority`` on the view (a
    class-based view's method first), else the limit's ``priority=``, else the
    blueprint's, else ``default``. With capacity 2 and no reserve for default (0.5
    critical), a sheddable request is shed at 1 in flight."""
    wanted: dict[str, str | None] = {"answer": None}
    app.config["QUOTA_PRIORITY"] = lambda: wanted["answer"]
    quota, client = overload_app(
        app, QUOTA_CAPACITY=2, QUOTA_RESERVE={"critical": 0.5, "default": 0.0}
    )

    @app.get("/limited")
    @quota.limit("100/minute", priority="sheddable")
    def limited() -> Response:
        return Response(iter(["x"]))

    bp = Blueprint("bg", __name__)
    quota.priority("sheddable")(bp)

    @bp.get("/job")
    def job() -> Response:
        return Response(iter(["x"]))

    class Items(MethodView):
        @quota.priority("critical")
        def get(self) -> Response:
            return Response(iter(["x"]))

        def post(self) -> Response:
            return Response(iter(["x"]))

    quota.priority("sheddable")(Items)
    app.register_blueprint(bp)
    app.add_url_rule("/items", view_func=Items.as_view("items"))
    blocker = hold(client, "critical")  # 1 in flight: sheddable's line (1) is reached
    assert client.get("/limited").status_code == 503  # priority= says sheddable
    assert client.get("/job").status_code == 503  # the blueprint's
    assert client.post("/items").status_code == 503  # the class's
    admitted = client.get("/items")  # the method's: critical
    assert admitted.status_code == 200
    admitted.close()
    wanted["answer"] = "critical"  # the callable wins over every route
    other = client.get("/job")
    assert other.status_code == 200
    other.close()
    blocker.close()
    output = app.test_cli_runner().invoke(args=["quota", "routes"]).output
    assert "sheddable" in next(line for line in output.splitlines() if line.startswith("/job"))


def test_an_exempt_route_is_never_shed(app: Flask) -> None:
    quota, client = overload_app(app, QUOTA_CAPACITY=1)

    @app.get("/healthz")
    @quota.exempt
    def healthz() -> str:
        return "ok"

    blocker = hold(client, "critical")
    assert client.get("/healthz").status_code == 200
    blocker.close()


def test_shadow_mode_counts_a_shed_and_serves_the_request(
    app: Flask, shed_signals: list[dict[str, Any]]
) -> None:
    _, client = overload_app(app, QUOTA_CAPACITY=1, QUOTA_SHADOW=True)
    first, second = hold(client, "default"), hold(client, "default")
    assert (first.status_code, second.status_code) == (200, 200)
    assert [(s["reason"], s["shadow"]) for s in shed_signals] == [("capacity", True)]
    first.close()
    second.close()


def test_metrics_count_sheds_and_requests_in_flight_by_class(app: Flask) -> None:
    pytest.importorskip("prometheus_client")
    _, client = overload_app(app, QUOTA_CAPACITY=2, QUOTA_METRICS_URL="/metrics")
    held = [hold(client, "critical"), hold(client, "critical")]
    assert hold(client, "sheddable").status_code == 503
    scrape = Scrape.parse(client.get("/metrics").get_data(as_text=True))
    shed = scrape.value(
        "flask_quota_shed_total", priority="sheddable", reason="capacity", shadow="false"
    )
    assert shed == 1
    assert scrape.value("flask_quota_capacity") == 2
    for response in held:
        response.close()


def test_failing_local_each_worker_sheds_against_its_share(app: Flask, tmp_path: Any) -> None:
    """Storage down, fail mode local: the fleet's capacity of 4 over 2 workers is 2 per
    worker, decided by the worker's in-process fallback."""
    from flask_quota.storage.breaker import CircuitBreaker
    from flask_quota.storage.failover import FailMode, GuardedStorage

    class Down(MemoryStorage):
        def decide(self, checks: Any) -> Any:
            raise OSError("down")

    _, client = overload_app(app, QUOTA_CAPACITY=4, QUOTA_FAIL_MODE="local", storage=Down())
    state = app.extensions["quota"]
    breaker = CircuitBreaker("down", threshold=1, cooldown=60)
    guard = GuardedStorage(Down(), FailMode.LOCAL, breaker, workers=2)
    state.guard = state.enforcer.guard = guard
    client.get("/work").close()  # the storage fails: the breaker opens
    held = [hold(client, "critical"), hold(client, "critical")]
    assert [r.status_code for r in held] == [200, 200]
    assert hold(client, "critical").status_code == 503
    for response in held:
        response.close()
    assert hold(client, "critical").status_code == 200


# -- queue time -------------------------------------------------------------------------

NOW_US = 1_700_000_000_123_456


@pytest.mark.parametrize(
    ("header", "waited_us"),
    [
        ("t=1700000000.023456", 100_000),  # nginx: seconds.milliseconds (here, micro)
        ("t=1700000000.023", 100_456),
        ("t=1700000000023456", 100_000),  # microseconds
        ("1700000000023", 100_456),  # Heroku: milliseconds
        ("1700000000", 123_456),  # seconds
        ("t=1700000000123457", 0),  # from the future: no wait
    ],
)
def test_request_start_in_the_forms_proxies_write(header: str, waited_us: int) -> None:
    assert queued_us(header, NOW_US) == waited_us


@pytest.mark.parametrize("header", [None, "", "soon", "t=", "t=12", "1700000000.5.5"])
def test_a_request_start_in_no_known_form_is_no_wait(header: str | None) -> None:
    assert queued_us(header, NOW_US) is None


def test_a_request_queued_too_long_is_shed_unless_critical(
    app: Flask, shed_signals: list[dict[str, Any]]
) -> None:
    """QUOTA_MAX_QUEUE_MS=500: a default request whose X-Request-Start is 2 s old is
    shed at once (503, "queue"); a critical one is served; without the setting the
    header is never read."""
    import time

    _, client = overload_app(app, QUOTA_MAX_QUEUE_MS=500)
    old = {"X-Request-Start": f"t={time.time() - 2:.3f}"}
    shed = client.get("/work", headers=old)
    assert shed.status_code == 503 and shed.get_json()["tier"] == "queue"
    assert shed.get_json()["priority"] == "default"
    fresh = client.get("/work", headers={"X-Request-Start": f"t={time.time():.3f}"})
    assert fresh.status_code == 200
    critical = client.get("/hold/critical", headers=old)
    assert critical.status_code == 200
    critical.close()
    assert [s["reason"] for s in shed_signals] == ["queue"]
    other = Flask(__name__)
    _, plain = overload_app(other)
    assert plain.get("/work", headers=old).status_code == 200


# -- adaptive capacity ------------------------------------------------------------------


def run_gradient(
    gradient: Gradient, seconds: float, service: Any, *, start: float = 0.0, rate: float = 200
) -> float:
    """Requests arriving at ``rate`` a second for ``seconds``, each taking
    ``service(in_flight)`` in the app; in flight is the smaller of the limit and what
    the load offers (``rate`` x the time). Returns the clock at the end."""
    now = start
    step = 1 / rate
    while now < start + seconds:
        offered = int(rate * service(1)) + 50
        in_flight = min(gradient.limit, offered)
        gradient.sample(service(in_flight), in_flight, now)
        now += step
    return now


def pool(size: int, base: float = 0.05) -> Any:
    """A database pool of ``size``: past it, requests wait their turn."""
    return lambda in_flight: base * max(1.0, in_flight / size)


def test_the_adaptive_limit_settles_near_the_bottleneck_and_grows_back() -> None:
    """A pool of 4 behind a worker, 50 ms a query: from 10, the limit shrinks to near the
    pool (where requests start to wait) within seconds and stays there under steady
    overload; once the pool is 12, it grows back."""
    gradient = Gradient(initial=10)
    now = run_gradient(gradient, 2.0, pool(100))  # normal load: learns the no-load time
    now = run_gradient(gradient, 10.0, pool(4), start=now)  # the bottleneck
    limits = []
    for _ in range(20):  # steady overload: where it stays
        now = run_gradient(gradient, 0.5, pool(4), start=now)
        limits.append(gradient.limit)
    assert min(limits) >= 3 and max(limits) <= 7, limits
    now = run_gradient(gradient, 20.0, pool(12), start=now)
    assert gradient.limit >= 10


def test_under_steady_overload_the_limit_never_falls_below_the_critical_load() -> None:
    """It must not oscillate into shedding critical traffic: with a pool of 6 and the
    reserves, the critical line (the whole limit) stays at or above 5 over 60 s of
    overload, sampled every window."""
    gradient = Gradient(initial=20)
    now = run_gradient(gradient, 2.0, pool(100))
    now = run_gradient(gradient, 10.0, pool(6), start=now)  # settling
    lows = []
    for _ in range(240):
        now = run_gradient(gradient, 0.25, pool(6), start=now)
        lows.append(gradient.limit)
    assert min(lows) >= 5, min(lows)


def test_adaptive_capacity_sheds_lower_classes_first_in_the_worker(app: Flask) -> None:
    """QUOTA_ADAPTIVE starts each worker at 10: sheddable at 7 in flight, default at 8."""
    _, client = overload_app(app, QUOTA_ADAPTIVE=True)
    held = [hold(client, "critical") for _ in range(7)]
    assert all(r.status_code == 200 for r in held)
    assert hold(client, "sheddable").status_code == 503
    assert hold(client, "default").status_code == 200
    for response in held:
        response.close()


def test_with_no_knob_set_no_class_is_asked(app: Flask) -> None:
    """Protection off (the default): QUOTA_PRIORITY is never asked, nothing is shed."""
    asked: list[int] = []

    def priority() -> str:
        asked.append(1)
        return "sheddable"

    app.config["QUOTA_PRIORITY"] = priority
    _, client = overload_app(app)
    assert all(hold(client, "sheddable").status_code == 200 for _ in range(20))
    assert asked == [] and app.extensions["quota"].shedder is None


def test_g_still_holds_one_attribute_with_protection_on(app: Flask) -> None:
    _, client = overload_app(app, QUOTA_CAPACITY=5, QUOTA_ADAPTIVE=True)
    seen: list[list[str]] = []

    @app.teardown_request
    def snapshot(error: BaseException | None) -> None:
        seen.append([name for name in vars(g) if "quota" in name])

    client.get("/work").close()
    assert seen == [["_flask_quota"]]


def test_the_dashboard_shows_in_flight_by_class_the_capacity_and_sheds(app: Flask) -> None:
    """The overview's panel: the fleet's requests in flight by class (read from its set),
    the capacity in force and each class's line, and the last minute's sheds."""
    app.secret_key = "test"
    app.config.update(QUOTA_DASHBOARD_URL="/quota", QUOTA_DASHBOARD_AUTH=lambda: "ops")
    _, client = overload_app(app, QUOTA_CAPACITY=10)
    held = [hold(client, "critical"), hold(client, "default"), hold(client, "default")]
    api = client.get("/quota/api/overview").get_json()["overload"]
    assert api["capacity"] == 10 and api["scope"] == "fleet"
    assert api["in_flight"] == {"critical": 1, "default": 2, "sheddable": 0}
    assert api["lines"] == {"critical": 10, "default": 8, "sheddable": 7}
    page = client.get("/quota/").get_data(as_text=True)
    assert 'id="overload-panel"' in page and "10 (fleet)" in page
    for response in held:
        response.close()
    assert client.get("/quota/api/overview").get_json()["overload"]["in_flight"] == {
        "critical": 0, "default": 0, "sheddable": 0,
    }  # fmt: skip
    off = Flask(__name__)
    off.secret_key = "test"
    off.config.update(QUOTA_DASHBOARD_URL="/quota", QUOTA_DASHBOARD_AUTH=lambda: "ops")
    _, plain = overload_app(off)
    assert plain.get("/quota/api/overview").get_json()["overload"] is None
    assert 'id="overload-panel"' not in plain.get("/quota/").get_data(as_text=True)
