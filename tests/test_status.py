"""QUOTA_STATUS_URL: a caller reads its own quota, charged on the global tier only."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request
from flask.testing import FlaskClient

from flask_quota import Identity, Quota
from flask_quota.storage import MemoryStorage
from flask_quota.storage.denycache import DenyCache
from flask_quota.testing import FrozenClock, test_storage

KEY = "status_key_0123456789"
PLANS = {
    "pro": {"global": "100/minute", "user": "10/minute", "resources": {"search": "4/minute"}},
    "free": {"global": "3/minute", "user": "2/minute"},
}


def status_app(app: Flask, **config: Any) -> tuple[FlaskClient, Quota]:
    storage = config.pop("storage", None)
    app.config.update({"QUOTA_PLANS": PLANS, "QUOTA_STATUS_URL": "/rate_limit", **config})
    quota = Quota(app, storage=storage)

    @quota.api_key_loader
    def lookup(key: str) -> Identity | None:
        return Identity("u42", "pro") if secrets.compare_digest(key, KEY) else None

    @app.get("/search")
    @quota.limit(resource="search")
    def search() -> str:
        return "found"

    @app.get("/items")
    def items() -> str:
        return "ok"

    return app.test_client(), quota


def by_policy(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["policy"]: row for row in body["limits"]}


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_status_reads_without_charging_but_the_global_tier(
    backend: str, app: Flask, request: pytest.FixtureRequest, close_sql: Callable[[Flask], Flask]
) -> None:
    """After one request to `search` (user 10/minute, search 4/minute, plan pro), five
    GET /rate_limit all answer 200 with user 9 and search 3 left, plan "pro"; only the
    global tier and the status's own budget (listed last) count them (on memory and on a
    real Redis behind the deny cache)."""
    config: dict[str, Any] = {}
    if backend == "redis":
        # On the test's clock: five reads on a loaded machine outlasted the 0.6 s a
        # 100/minute bucket takes to refill one (CI read 98, 98, 97, ...).
        redis = test_storage(request.getfixturevalue("own_redis").url, FrozenClock())
        config["storage"] = DenyCache(redis)
    else:
        config["storage"] = MemoryStorage(FrozenClock())
    http, _ = status_app(close_sql(app), **config)
    assert http.get("/search", headers={"X-API-Key": KEY}).status_code == 200
    globals_left = []
    for _ in range(5):
        response = http.get("/rate_limit", headers={"X-API-Key": KEY})
        assert response.status_code == 200
        assert response.headers["Cache-Control"] == "no-store"
        body = response.get_json()
        assert (body["plan"], body["tenant"]) == ("pro", None)
        rows = by_policy(body)
        assert rows["user"]["remaining"] == 9
        assert rows["search"]["remaining"] == 3
        globals_left.append(rows["global"]["remaining"])
    assert globals_left == [98, 97, 96, 95, 94]
    assert body["limits"] == [
        {"tier": "global", "resource": None, "policy": "global", "limit": 100,
         "remaining": 94, "reset": body["limits"][0]["reset"], "window": 60, "unit": "requests"},
        {"tier": "user", "resource": None, "policy": "user", "limit": 10,
         "remaining": 9, "reset": body["limits"][1]["reset"], "window": 60, "unit": "requests"},
        {"tier": "endpoint", "resource": "search", "policy": "search", "limit": 4,
         "remaining": 3, "reset": body["limits"][2]["reset"], "window": 60, "unit": "requests"},
        {"tier": "endpoint", "resource": "quota_status", "policy": "quota_status", "limit": 60,
         "remaining": 55, "reset": body["limits"][3]["reset"], "window": 60, "unit": "requests"},
    ]  # fmt: skip
    assert all(0 < row["reset"] <= 60 for row in body["limits"])
    # The search bucket was not touched by the status reads: three more searches pass.
    assert [http.get("/search", headers={"X-API-Key": KEY}).status_code for _ in range(4)] == [
        200, 200, 200, 429,
    ]  # fmt: skip


def test_with_enforcement_off_nothing_is_charged(app: Flask) -> None:
    """QUOTA_ENABLED=False: the status still reads every bucket, and charges none."""
    http, _ = status_app(app, storage=MemoryStorage(FrozenClock()), QUOTA_ENABLED=False)
    for _ in range(5):
        body = http.get("/rate_limit").get_json()
        remaining = {r["policy"]: r["remaining"] for r in body["limits"]}
        assert remaining == {"global": 3, "user": 2, "quota_status": 60}


def test_an_anonymous_caller_is_answered_by_its_address(app: Flask) -> None:
    """No key: the anonymous plan's buckets for the caller's IP."""
    http, _ = status_app(app, storage=MemoryStorage(FrozenClock()))
    http.get("/items", environ_base={"REMOTE_ADDR": "192.0.2.7"})
    body = http.get("/rate_limit", environ_base={"REMOTE_ADDR": "192.0.2.7"}).get_json()
    assert body["plan"] == "free"
    remaining = {r["policy"]: r["remaining"] for r in body["limits"]}
    assert remaining == {"global": 1, "user": 1, "quota_status": 59}


def test_the_status_request_is_refused_when_the_global_tier_is_spent(app: Flask) -> None:
    """The status request counts on the global tier like any other: once spent, it is a
    429 naming the global tier, and the user bucket is still untouched."""
    http, _ = status_app(app, storage=MemoryStorage(FrozenClock()))
    codes = [http.get("/rate_limit").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    denied = http.get("/rate_limit")
    assert denied.status_code == 429 and denied.get_json()["tier"] == "global"
    assert "Retry-After" in denied.headers


def test_a_blocked_caller_gets_its_block(app: Flask) -> None:
    """A blocked caller's status is the block's 429, as on every other path."""
    http, quota = status_app(app, storage=MemoryStorage(FrozenClock()))
    with app.app_context():
        quota.block(identity="u42", seconds=60)
    response = http.get("/rate_limit", headers={"X-API-Key": KEY})
    assert response.status_code == 429 and response.get_json()["tier"] == "blocked"


def test_a_failing_storage_answers_503_not_500(app: Flask) -> None:
    """Storage down, failing open: requests pass, but the status has nothing to show."""
    http, _ = status_app(app, QUOTA_STORAGE_URL="redis://127.0.0.1:1/0", QUOTA_STORAGE_TIMEOUT=0.05)
    assert http.get("/items").status_code == 200
    response = http.get("/rate_limit")
    assert response.status_code == 503
    assert "Retry-After" in response.headers


@pytest.mark.parametrize(
    "headers",
    [
        {"X-API-Key": "x" * 10_000},
        {"X-API-Key": "\x00\x01\x7f"},
        {"X-API-Key": "ключ-🔑" * 20},
        {"X-API-Key": ""},
        {"X-Forwarded-For": "not an address, 999.1.1.1"},
        {"X-API-Key": KEY[:-1]},
    ],
)
@pytest.mark.parametrize("reject", [False, True])
def test_hostile_keys_and_headers_never_500(
    app: Flask, headers: dict[str, str], reject: bool
) -> None:
    """Junk keys are anonymous (or 401 with QUOTA_REJECT_UNKNOWN_KEYS), never a 500."""
    http, _ = status_app(
        app, storage=MemoryStorage(FrozenClock()), QUOTA_REJECT_UNKNOWN_KEYS=reject
    )
    response = http.get("/rate_limit?x=%00&plan=enterprise", headers=headers)
    if "X-API-Key" in headers and reject:
        assert response.status_code == 401
    else:
        assert response.status_code == 200
        assert response.get_json()["plan"] == "free"  # a query names no plan
    assert http.post("/rate_limit").status_code == 405


def test_a_bad_status_url_is_refused(tmp_path: Path) -> None:
    """A status URL that is not a path fails at init_app, naming the key."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_STATUS_URL"] = "rate_limit"
    with pytest.raises(ValueError, match=r"QUOTA_STATUS_URL='rate_limit' must be a path"):
        Quota(app)


def test_without_the_setting_there_is_no_status_view(app: Flask) -> None:
    """QUOTA_STATUS_URL=None (the default) serves nothing."""
    http, _ = status_app(app, storage=MemoryStorage(FrozenClock()), QUOTA_STATUS_URL=None)
    assert http.get("/rate_limit").status_code == 404


def test_the_demo_serves_the_status(tmp_path: Path) -> None:
    """The demo (wsgi.py) answers GET /rate_limit for a caller who searched once."""
    from tests.demo import demo_app

    demo = demo_app(
        {
            "QUOTA_DASHBOARD_URL": None,
            "QUOTA_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        }
    )
    http = demo.test_client()
    assert "GET /rate_limit" in http.get("/").get_json()["endpoints"]
    http.get("/v1/search?q=x")
    body = http.get("/rate_limit").get_json()
    assert body["plan"] == "free"
    searched = [r for r in body["limits"] if r["resource"] == "bulk_search"]
    assert searched and searched[0]["remaining"] == searched[0]["limit"] - 1
    demo.extensions["quota"].sql.close()


def test_status_shows_the_tenants_bucket(app: Flask) -> None:
    """A caller of a tenant sees the tenant's bucket, spent by its colleagues too."""
    app.config.update(
        QUOTA_PLANS={"team": {"tenant": "5/minute", "user": "10/minute"}},
        QUOTA_DEFAULT_PLAN="team",
        QUOTA_ANONYMOUS_PLAN="team",
        QUOTA_STATUS_URL="/rate_limit",
    )
    quota = Quota(app, storage=MemoryStorage(FrozenClock()))

    @quota.identity_loader
    def who() -> Identity | None:
        name = request.headers.get("X-User")
        return Identity(name, "team", tenant="acme") if name else None

    @app.get("/items")
    def items() -> str:
        return "ok"

    http = app.test_client()
    assert http.get("/items", headers={"X-User": "bob"}).status_code == 200
    body = http.get("/rate_limit", headers={"X-User": "alice"}).get_json()
    assert body["tenant"] == "acme"
    rows = by_policy(body)
    assert (rows["tenant"]["tier"], rows["tenant"]["remaining"]) == ("tenant", 4)
    assert rows["user"]["remaining"] == 10


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_status_shows_requests_in_flight(
    backend: str, app: Flask, request: pytest.FixtureRequest, close_sql: Callable[[Flask], Flask]
) -> None:
    """A plan's ``concurrent`` and a limit's own ``concurrent=`` are buckets that apply
    to the caller: while one request of ``report`` runs, the status shows one slot of
    each taken, and both free again once it has answered."""
    config: dict[str, Any] = {
        "QUOTA_PLANS": {"team": {"user": "10/minute", "concurrent": 3}},
        "QUOTA_DEFAULT_PLAN": "team",
        "QUOTA_ANONYMOUS_PLAN": "team",
        "QUOTA_STATUS_URL": "/rate_limit",
    }
    if backend == "redis":
        config["QUOTA_STORAGE_URL"] = request.getfixturevalue("own_redis").url
    app = close_sql(app)
    app.config.update(config)
    quota = Quota(app, storage=None if backend == "redis" else MemoryStorage(FrozenClock()))
    entered, leave = threading.Event(), threading.Event()

    @quota.identity_loader
    def who() -> Identity | None:
        return Identity("u7", "team")

    @app.get("/report")
    @quota.limit(resource="report", concurrent=2)
    def report() -> str:
        entered.set()
        leave.wait(10)
        return "done"

    http = app.test_client()
    running = threading.Thread(target=lambda: app.test_client().get("/report"))
    running.start()
    try:
        assert entered.wait(10)
        rows = by_policy(http.get("/rate_limit").get_json())
        inflight = {
            name: (row["tier"], row["resource"], row["limit"], row["remaining"])
            for name, row in rows.items()
            if row["tier"] == "concurrent"
        }
        assert inflight == {
            "concurrent": ("concurrent", None, 3, 2),
            "concurrent (report)": ("concurrent", "report", 2, 1),
        }
    finally:
        leave.set()
        running.join(10)
    rows = by_policy(http.get("/rate_limit").get_json())
    assert (rows["concurrent"]["remaining"], rows["concurrent (report)"]["remaining"]) == (3, 2)
    # A slot frees when its request ends, not on a clock; its window is a lease's longest life.
    assert {(row["reset"], row["window"]) for row in inflight_rows(rows)} == {(0, 60)}


def inflight_rows(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows.values() if row["tier"] == "concurrent"]


def test_the_status_has_a_budget_of_its_own_per_caller(app: Flask) -> None:
    """Found in review: with a plan without a global tier (the setup the Flask-Limiter
    guide recommends) 300 of 300 status calls were answered. It has a budget of its own
    per caller (``QUOTA_STATUS_RATE``, a plan's ``quota_status`` resource wins), decided
    with the global tier in its one storage call."""
    http, _ = status_app(
        app, storage=MemoryStorage(FrozenClock()), QUOTA_PLANS={"free": {}},
        QUOTA_STATUS_RATE="5/minute",
    )  # fmt: skip
    codes = Counter(http.get("/rate_limit").status_code for _ in range(300))
    assert codes == {200: 5, 429: 295}
    denied = http.get("/rate_limit").get_json()
    assert (denied["tier"], denied["resource"]) == ("endpoint", "quota_status")
    other = http.get("/rate_limit", environ_base={"REMOTE_ADDR": "192.0.2.9"})
    assert other.status_code == 200  # another caller, its own budget
    assert by_policy(other.get_json())["quota_status"]["remaining"] == 4


def test_a_plan_sets_the_status_budget_and_the_default_is_sixty_a_minute(app: Flask) -> None:
    http, _ = status_app(
        app, storage=MemoryStorage(FrozenClock()),
        QUOTA_PLANS={"free": {"resources": {"quota_status": "2/minute"}}, "pro": {}},
    )  # fmt: skip
    assert [http.get("/rate_limit").status_code for _ in range(3)] == [200, 200, 429]
    keyed = Counter(
        http.get("/rate_limit", headers={"X-API-Key": KEY}).status_code for _ in range(70)
    )
    assert keyed == {200: 60, 429: 10}  # pro has no quota_status: QUOTA_STATUS_RATE


@pytest.mark.redis
def test_status_calls_past_the_budget_cost_redis_nothing(own_redis: Any, tmp_path: Path) -> None:
    """Found in review: with 20 sliding-log endpoints a status call cost 5.9 ms of Redis
    time, and nothing bounded how often one caller made it. Past its budget a caller's
    status calls are answered by the deny cache: 300 calls, at most 61 reach Redis."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config.update(
        QUOTA_STORAGE_URL=own_redis.url, QUOTA_DATABASE_URL="sqlite://",
        QUOTA_STATUS_URL="/rate_limit", QUOTA_ALGORITHM="sliding_window_log",
        QUOTA_PLANS={"free": {"user": "1000/minute"}},
    )  # fmt: skip
    quota = Quota(app)
    for i in range(20):
        app.add_url_rule(f"/e{i}", f"e{i}", quota.limit("1000/minute")(lambda: "ok"))
    http = app.test_client()
    for i in range(20):
        assert http.get(f"/e{i}").status_code == 200
    with own_redis.client() as client:
        client.config_resetstat()
    started = time.monotonic()
    codes = Counter(http.get("/rate_limit").status_code for _ in range(300))
    elapsed = time.monotonic() - started
    with own_redis.client() as client:
        stats = client.info("commandstats")
    calls = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))
    assert codes == {200: 60, 429: 240}
    # The 60 admitted and the first denial, and a denial asked again once per sync
    # interval (0.5 s: the deny cache trusts a denial that long).
    assert calls <= 61 + math.ceil(elapsed / 0.5), (calls, elapsed)


def test_each_limit_says_what_it_counts(app: Flask) -> None:
    """Every bucket of the status names its ``unit``: the rate tiers count requests, a
    resource counts its plan's unit (else its decorator's, else requests), a concurrency
    bucket counts requests in flight, and the status budget counts requests."""
    app.config.update(
        QUOTA_PLANS={
            "team": {
                "global": "100/second",
                "user": "10/minute",
                "concurrent": 3,
                "resources": {
                    "ai_tokens": {"rate": "2000/hour", "unit": "tokens"},
                    "pages": "100/hour",
                },
            }
        },
        QUOTA_DEFAULT_PLAN="team",
        QUOTA_ANONYMOUS_PLAN="team",
        QUOTA_STATUS_URL="/rate_limit",
    )
    quota = Quota(app, storage=MemoryStorage(FrozenClock()))
    quota.identity_loader(lambda: Identity("u7", "team"))
    app.add_url_rule("/chat", "chat", quota.limit(resource="ai_tokens")(lambda: "c"))
    # A decorator's unit applies where the plan names none.
    app.add_url_rule("/pdf", "pdf", quota.limit(resource="pages", unit="pages")(lambda: "p"))
    app.add_url_rule("/search", "search", quota.limit("5/minute", resource="search")(lambda: "s"))
    rows = by_policy(app.test_client().get("/rate_limit").get_json())
    units = {name: row["unit"] for name, row in rows.items()}
    assert units == {
        "global": "requests",
        "user": "requests",
        "concurrent": "requests in flight",
        "ai_tokens": "tokens",
        "pages": "pages",
        "search": "requests",
        "quota_status": "requests",
    }, rows
