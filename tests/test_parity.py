"""What Flask-Limiter users reach for (issue 9): charge_when, key=, several rates,
per_method, blueprints, filters, exempt methods, quota.charge, signals, and the
storage operations under them (refund, forced charge) on memory and real Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Blueprint, Flask, g, jsonify, request
from flask.testing import FlaskClient

from flask_quota import Quota, QuotaExceeded, signals
from flask_quota.core import validators
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.policy import Decision
from flask_quota.core.rates import parse_rate, parse_rates
from flask_quota.settings import FailMode
from flask_quota.storage import Check, MemoryStorage, Storage
from flask_quota.storage.breaker import DEFAULT_THRESHOLD, CircuitBreaker
from flask_quota.storage.failover import GuardedStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

PLANS = {"free": {"user": "1000/minute"}}


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest, clock: FrozenClock) -> Iterator[Storage]:
    """The same behaviour on the in-process store and on a real redis-server."""
    if request.param == "memory":
        yield MemoryStorage(clock)
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    yield RedisStorage(client, clock=clock)


def quota_app(app: Flask, storage: Storage, **config: Any) -> Quota:
    app.config.update({"QUOTA_PLANS": PLANS, **config})
    return Quota(app, storage=storage)


# -- charge_when -------------------------------------------------------------


def login_app(app: Flask, storage: Storage) -> tuple[FlaskClient, list[int]]:
    quota = quota_app(app, storage)
    runs: list[int] = []

    @app.post("/login")
    @quota.limit("3/minute", resource="login", charge_when=lambda r: r.status_code >= 400)
    def login() -> Any:
        runs.append(1)
        if request.form.get("password") != "right":
            return "no", 401
        return "welcome"

    return app.test_client(), runs


def test_only_failed_logins_count(app: Flask, storage: Storage) -> None:
    """charge_when: successes are refunded, so 10 pass; failures get 401 x3, then 429."""
    http, _ = login_app(app, storage)
    ok = [http.post("/login", data={"password": "right"}).status_code for _ in range(10)]
    assert ok == [200] * 10
    failed = [http.post("/login", data={"password": "bad"}).status_code for _ in range(4)]
    assert failed == [401, 401, 401, 429]


def test_headers_show_the_refund(app: Flask, storage: Storage) -> None:
    """After a refunded request the headers count it back: remaining stays at the limit."""
    http, _ = login_app(app, storage)
    http.post("/login", data={"password": "bad"})
    response = http.post("/login", data={"password": "right"})
    assert response.headers["RateLimit"] == '"login";r=2;t=20'  # one failure charged
    assert response.headers["X-RateLimit-Remaining"] == "2"


def test_simultaneous_failures_cannot_slip_past(app: Flask, storage: Storage) -> None:
    """24 failed logins at once from a new caller: the view runs at most 3 times."""
    http, runs = login_app(app, storage)
    start = threading.Barrier(24)
    statuses: list[int] = []

    def attempt() -> None:
        client = app.test_client()
        start.wait()
        statuses.append(client.post("/login", data={"password": "bad"}).status_code)

    threads = [threading.Thread(target=attempt) for _ in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(statuses) == 24
    assert len(runs) <= 3
    assert statuses.count(401) == len(runs) and statuses.count(429) == 24 - len(runs)
    del http


def test_lost_refund_opens_the_breaker_not_the_response(app: Flask) -> None:
    """Refunds that cannot reach the storage are lost: at the breaker's threshold of
    failures in a row it opens, and ``storage_failed`` is sent once; nothing is
    raised into the response."""
    dead = RedisStorage.from_url("redis://127.0.0.1:1/0", timeout=0.2)
    guard = GuardedStorage(dead, FailMode.OPEN, CircuitBreaker("redis", cooldown=60))
    errors: list[BaseException | None] = []
    guard.breaker.on_change = errors.append
    check = Check("quota:{id=a}:e:GET:x:tb", Algorithm.TOKEN_BUCKET, parse_rate("3/minute"), 1)
    for _ in range(DEFAULT_THRESHOLD):
        guard.refund([check], 1)  # lost; the last of these opens the breaker
    guard.refund([check], 1)  # the breaker is open: not even tried
    assert guard.degraded
    assert len(errors) == 1 and errors[0] is not None


# -- key= ----------------------------------------------------------------------


def test_key_shares_one_bucket_per_organisation(app: Flask, storage: Storage) -> None:
    """Two users of one org exhaust a shared key= bucket together; another org is untouched."""
    quota = quota_app(app, storage)
    orgs = {"ann": "acme", "bob": "acme", "cy": "globex"}

    @quota.identity_loader
    def who() -> Any:
        from flask_quota import Identity

        user = request.headers.get("X-User")
        if user:
            g.org_id = orgs[user]
        return Identity(user) if user else None

    @app.get("/search")
    @quota.limit("4/minute", resource="org_search", key=lambda: g.org_id)
    def search() -> str:
        return "found"

    http = app.test_client()
    seq = [http.get("/search", headers={"X-User": u}).status_code for u in ["ann", "bob"] * 3]
    assert seq == [200, 200, 200, 200, 429, 429]
    assert http.get("/search", headers={"X-User": "cy"}).status_code == 200


def test_key_values_are_escaped_into_their_own_tag(app: Flask, clock: FrozenClock) -> None:
    """A key= value cannot pose as an identity's bucket or pick a hash tag."""
    storage = MemoryStorage(clock)
    quota = quota_app(app, storage)

    @app.get("/k")
    @quota.limit("5/minute", resource="k", key=lambda: request.args["org"])
    def k() -> str:
        return "k"

    app.test_client().get("/k", query_string={"org": "x}:{id=alice"})
    keys = list(storage._data)
    assert "quota:{k=x%7D%3A%7Bid=alice}:e:GET:k:tb" in keys
    assert not any(key.startswith("quota:{id=alice}") for key in keys)


# -- several rates -------------------------------------------------------------


def test_parse_rates_canonical_text_and_errors() -> None:
    """Comma-separated rates parse to one check each; the canonical text joins them."""
    assert str(parse_rates("2 per second,3/minute")) == "2/second, 3/minute"
    assert validators.rate_text("10/second;burst=20 , 10000/day") == (
        "10/second; burst=20, 10000/day"
    )
    for bad in ["2/second,", "2/second, 3/second", "1/s, 1/m, 1/h, 1/d, 2/5 days"]:
        with pytest.raises(ValueError):
            parse_rates(bad)


def test_two_rates_on_one_limit(app: Flask, storage: Storage, clock: FrozenClock) -> None:
    """ "2/second, 3/minute": 200, 200, 429; 1.2 s later 200, 429; two named policies."""
    quota = quota_app(app, storage)

    @app.get("/burst")
    @quota.limit("2/second, 3/minute", resource="burst")
    def burst() -> str:
        return "ok"

    http = app.test_client()
    first = [http.get("/burst") for _ in range(3)]
    assert [r.status_code for r in first] == [200, 200, 429]
    assert first[2].get_json()["violated-policies"] == ["burst"]
    clock.advance(1.2)
    later = [http.get("/burst") for _ in range(2)]
    assert [r.status_code for r in later] == [200, 429]
    assert later[1].get_json()["violated-policies"] == ["burst@60"]
    assert later[1].get_json()["resource"] == "burst"
    policy = later[1].headers["RateLimit-Policy"]
    assert '"burst";q=2;w=1' in policy and '"burst@60";q=3;w=60' in policy


def test_several_rates_in_plans_per_tier(app: Flask, clock: FrozenClock) -> None:
    """QUOTA_PLANS accepts several rates for a tier; each is its own named policy."""
    app.config["QUOTA_PLANS"] = {"free": {"user": "2/second, 3/minute", "global": "9/second"}}
    Quota(app, storage=MemoryStorage(clock))

    @app.get("/x")
    def x() -> str:
        return "x"

    http = app.test_client()
    assert [http.get("/x").status_code for _ in range(3)] == [200, 200, 429]
    policy = http.get("/x").headers["RateLimit-Policy"]
    assert policy == '"global";q=9;w=1, "user";q=2;w=1, "user@60";q=3;w=60'


def test_all_or_nothing_across_rates(app: Flask, clock: FrozenClock) -> None:
    """A request one rate denies is charged on none: the other rate keeps its room."""
    storage = MemoryStorage(clock)
    quota = quota_app(app, storage)

    @app.get("/b")
    @quota.limit("1/second, 5/minute", resource="b")
    def b() -> str:
        return "b"

    http = app.test_client()
    assert [http.get("/b").status_code for _ in range(4)] == [200, 429, 429, 429]
    with app.app_context():
        buckets = {s.name: s.remaining for s in quota.peek(ip="127.0.0.1")}
    assert buckets["b (GET)@60"] == 4


# -- a custom 429 handler ------------------------------------------------------


def test_custom_error_handler_still_gets_retry_after(app: Flask, clock: FrozenClock) -> None:
    """A JSON 429 from the app's own errorhandler carries Retry-After and the limit headers."""
    quota = quota_app(app, MemoryStorage(clock))

    @app.errorhandler(QuotaExceeded)
    def too_many(error: QuotaExceeded) -> Any:
        return jsonify(error="slow down", tier=str(error.tier)), 429

    @app.get("/one")
    @quota.limit("1/minute")
    def one() -> str:
        return "one"

    http = app.test_client()
    http.get("/one")
    response = http.get("/one")
    assert response.status_code == 429
    assert response.get_json() == {"error": "slow down", "tier": "endpoint"}
    assert response.headers["Retry-After"] == "60"
    assert response.headers["X-RateLimit-Remaining"] == "0"


# -- per_method ----------------------------------------------------------------


def test_head_counts_against_get(app: Flask, storage: Storage) -> None:
    """6 GET + 6 HEAD on a 10/minute resource: exactly 10 answered 200, the view runs 10 times."""
    quota = quota_app(app, storage)
    runs: list[str] = []

    @app.get("/page")
    @quota.limit("10/minute", resource="page")
    def page() -> str:
        runs.append(request.method)
        return "page"

    http = app.test_client()
    statuses = [http.get("/page").status_code for _ in range(6)]
    statuses += [http.head("/page").status_code for _ in range(6)]
    assert statuses.count(200) == 10 and statuses.count(429) == 2
    assert len(runs) == 10


def test_per_method_false_shares_one_bucket(app: Flask, clock: FrozenClock) -> None:
    """per_method=False: GET and POST draw on one bucket, listed once for inspection."""
    quota = quota_app(app, MemoryStorage(clock))

    @app.route("/s", methods=["GET", "POST"])
    @quota.limit("3/minute", resource="s", per_method=False)
    def s() -> str:
        return "s"

    http = app.test_client()
    assert [http.get("/s").status_code, http.post("/s").status_code] == [200, 200]
    assert [http.post("/s").status_code, http.get("/s").status_code] == [200, 429]
    with app.app_context():
        names = [b.name for b in quota.peek(ip="127.0.0.1") if b.tier == "endpoint"]
    assert names == ["s (*)"]


# -- blueprints ----------------------------------------------------------------


def test_blueprint_limit_exempt_and_own_decorator(app: Flask, clock: FrozenClock) -> None:
    """A blueprint's limit covers its views, exempt frees them, a view's decorator wins."""
    quota = quota_app(app, MemoryStorage(clock))
    admin = Blueprint("admin", __name__)
    health = Blueprint("health", __name__)
    inner = Blueprint("inner", __name__)

    @admin.get("/a")
    def a() -> str:
        return "a"

    @admin.get("/b")
    def b() -> str:
        return "b"

    @admin.get("/own")
    @quota.limit("1/minute")
    def own() -> str:
        return "own"

    @health.get("/h")
    def h() -> str:
        return "h"

    @inner.get("/i")
    def i() -> str:
        return "i"

    quota.limit("3/minute", resource="admin")(admin)
    quota.exempt(health)
    admin.register_blueprint(inner, url_prefix="/inner")
    app.register_blueprint(admin, url_prefix="/admin")
    app.register_blueprint(health)

    http = app.test_client()
    seq = [http.get(u).status_code for u in ["/admin/a", "/admin/b", "/admin/inner/i"]]
    assert [*seq, http.get("/admin/a").status_code] == [200, 200, 200, 429]
    assert [http.get("/admin/own").status_code for _ in range(2)] == [200, 429]
    response = http.get("/h")
    assert response.status_code == 200 and "RateLimit" not in response.headers
    with pytest.raises(ValueError, match=r"already has a @quota\.limit"):
        quota.limit("1/minute", resource="admin")(admin)  # stacked limits need own buckets


# -- exemptions ----------------------------------------------------------------


def test_options_requests_charge_nothing(app: Flask, clock: FrozenClock) -> None:
    """30 OPTIONS requests (CORS preflights) charge nothing and carry no headers."""
    quota = quota_app(app, MemoryStorage(clock))

    @app.route("/api", methods=["GET", "POST"])
    @quota.limit("5/minute", resource="api")
    def api() -> str:
        return "api"

    http = app.test_client()
    responses = [http.options("/api") for _ in range(30)]
    assert all(r.status_code == 200 and "RateLimit" not in r.headers for r in responses)
    with app.app_context():
        remaining = {b.name: b.remaining for b in quota.peek(ip="127.0.0.1")}
    assert remaining == {"user": 1000, "api (GET)": 5, "api (POST)": 5}


def test_exempt_methods_setting_is_validated(app: Flask) -> None:
    """QUOTA_EXEMPT_METHODS takes a comma-separated string or a list; nonsense is refused."""
    app.config["QUOTA_EXEMPT_METHODS"] = "options, head"
    Quota(app, storage=MemoryStorage())
    assert app.extensions["quota"].settings.exempt_methods == {"OPTIONS", "HEAD"}
    for bad in [42, "OPTIONS; DROP", ["GET", None]]:
        other = Flask(__name__, instance_path=app.instance_path)
        other.config["QUOTA_EXEMPT_METHODS"] = bad
        with pytest.raises(ValueError, match="QUOTA_EXEMPT_METHODS"):
            Quota(other, storage=MemoryStorage())


def test_exempt_when_skips_the_limit(app: Flask, clock: FrozenClock) -> None:
    """exempt_when() True skips the limit it decorates; the caller's tiers still apply."""
    quota = quota_app(app, MemoryStorage(clock))

    @app.get("/t")
    @quota.limit("1/minute", exempt_when=lambda: request.headers.get("X-Trusted") == "1")
    def t() -> str:
        return "t"

    http = app.test_client()
    trusted = [http.get("/t", headers={"X-Trusted": "1"}) for _ in range(3)]
    assert [r.status_code for r in trusted] == [200] * 3
    assert '"user"' in trusted[0].headers["RateLimit"]
    assert [http.get("/t").status_code for _ in range(2)] == [200, 429]


def test_request_filter_frees_a_request_entirely(app: Flask, clock: FrozenClock) -> None:
    """@quota.request_filter returning True: no tier applies and no headers are sent."""
    quota = quota_app(app, MemoryStorage(clock))

    @quota.request_filter
    def internal() -> bool:
        return request.headers.get("X-Internal") == "yes"

    @app.get("/f")
    @quota.limit("1/minute")
    def f() -> str:
        return "f"

    http = app.test_client()
    inside = [http.get("/f", headers={"X-Internal": "yes"}) for _ in range(3)]
    assert all(r.status_code == 200 and "RateLimit" not in r.headers for r in inside)
    assert [http.get("/f").status_code for _ in range(2)] == [200, 429]


# -- quota.charge ----------------------------------------------------------------


def test_charge_after_the_response_goes_into_debt(app: Flask, storage: Storage) -> None:
    """quota.charge(60) on a 100/minute resource: the third call is 429, retry_after >= 1."""
    quota = quota_app(app, storage)

    @app.post("/chat")
    @quota.limit("100/minute", resource="ai_tokens")
    def chat() -> str:
        quota.charge(60)
        return "reply"

    http = app.test_client()
    first, second, third = (http.post("/chat") for _ in range(3))
    assert [first.status_code, second.status_code, third.status_code] == [200, 200, 429]
    assert first.headers["X-RateLimit-Remaining"] == "39"  # 1 + 60 charged
    assert second.headers["X-RateLimit-Remaining"] == "0"  # in debt: shown as 0
    assert third.get_json()["retry_after"] >= 1


def test_charge_needs_a_limited_view(app: Flask, clock: FrozenClock) -> None:
    """quota.charge() in a view without @quota.limit is a programming error, named as such."""
    quota = quota_app(app, MemoryStorage(clock))
    app.config["PROPAGATE_EXCEPTIONS"] = True

    @app.get("/free")
    def free() -> str:
        quota.charge(5)
        return "free"

    with pytest.raises(RuntimeError, match=r"no @quota\.limit"):
        app.test_client().get("/free")


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_refund_and_charge_agree_across_backends(
    algorithm: Algorithm, redis_client: redis.Redis
) -> None:
    """Memory and Redis give back a charge and charge past the limit alike, per algorithm."""
    rate = parse_rate("10/minute")
    key = f"quota:{{id=t}}:e:GET:r:{algorithm.code}"
    seen = []
    for make in (MemoryStorage, lambda c: RedisStorage(redis_client, clock=c)):
        clock = FrozenClock()
        store: Storage = make(clock)
        verdict = store.decide([Check(key, algorithm, rate, 3)])
        clock.advance(0.5)
        store.refund([Check(key, algorithm, rate, 3)], verdict.now_us)
        after_refund = store.peek([Check(key, algorithm, rate, 0)]).outcomes[0]
        store.charge([Check(key, algorithm, rate, 15)])
        debt = store.peek([Check(key, algorithm, rate, 1)]).outcomes[0]
        seen.append((after_refund.remaining, debt.allowed, debt.remaining, debt.retry_after_us))
    assert seen[0][0] >= 9  # the refund gave (nearly all of) the 3 units back
    assert seen[0][1] is False and seen[0][2] <= 0 and seen[0][3] > 0  # in debt: wait
    assert seen[0] == seen[1]


def test_a_charge_past_what_lua_can_unpack_agrees_across_backends(
    redis_client: redis.Redis,
) -> None:
    """quota.charge(20000) on a sliding log keeps only its newest limit + 1 entries
    (they decide exactly as the whole log would, and one caller cannot grow a log
    that every decision reads): memory and Redis end in the same place."""
    rate = parse_rate("10/minute")
    key = "quota:{id=t}:e:GET:big:swl"
    seen = []
    for make in (MemoryStorage, lambda c: RedisStorage(redis_client, clock=c)):
        clock = FrozenClock()
        store: Storage = make(clock)
        store.charge([Check(key, Algorithm.SLIDING_WINDOW_LOG, rate, 20_000)])
        seen.append(store.peek([Check(key, Algorithm.SLIDING_WINDOW_LOG, rate, 1)]).outcomes[0])
    assert seen[0].allowed is False and seen[0].remaining == -1
    assert seen[0] == seen[1]
    assert redis_client.llen(key) == 10 + 1


# -- signals ---------------------------------------------------------------------


def test_quota_exceeded_fires_once_per_429(app: Flask, clock: FrozenClock) -> None:
    """signals.quota_exceeded is sent once for each 429, with the decision."""
    quota = quota_app(app, MemoryStorage(clock))
    heard: list[tuple[Any, Decision]] = []

    @app.get("/s")
    @quota.limit("2/minute", resource="sig")
    def s() -> str:
        return "s"

    def listener(sender: Any, decision: Decision, **extra: Any) -> None:
        heard.append((sender, decision))

    with signals.quota_exceeded.connected_to(listener, sender=app):
        http = app.test_client()
        statuses = [http.get("/s").status_code for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429]
    assert len(heard) == 3
    assert all(sender is app and d.denied is not None for sender, d in heard)
    assert heard[0][1].denied is not None and heard[0][1].denied.name == "sig"


def test_storage_signals_once_per_breaker_change(app: Flask, own_redis: Any) -> None:
    """storage_failed once when Redis dies (with the error), storage_recovered once when back."""
    storage = RedisStorage.from_url(own_redis.url, timeout=0.3)
    quota_app(app, storage, QUOTA_BREAKER_COOLDOWN=0.05)
    failed: list[BaseException] = []
    recovered: list[Any] = []

    @app.get("/r")
    def r() -> str:
        return "r"

    def on_failed(sender: Any, error: BaseException, **extra: Any) -> None:
        failed.append(error)

    def on_recovered(sender: Any, **extra: Any) -> None:
        recovered.append(sender)

    http = app.test_client()
    with (
        signals.storage_failed.connected_to(on_failed, sender=app),
        signals.storage_recovered.connected_to(on_recovered, sender=app),
    ):
        assert http.get("/r").status_code == 200
        own_redis.stop()
        for _ in range(5):
            http.get("/r")
        assert len(failed) == 1 and recovered == []
        own_redis.start()
        deadline = time.monotonic() + 20
        while not recovered and time.monotonic() < deadline:
            time.sleep(0.06)
            http.get("/r")
        for _ in range(3):
            http.get("/r")
    assert len(failed) == 1 and recovered == [app]


def test_demo_chat_meters_tokens(tmp_path: Any) -> None:
    """The demo's /v1/ai/chat charges the tokens it generated on ai_tokens (free: 2000/hour):
    five 400-token answers overdraw it, the sixth call waits; /v1/ai/infer is untouched."""
    from tests.demo import demo_app

    app = demo_app(
        {
            "QUOTA_DASHBOARD_URL": None,
            "QUOTA_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        }
    )
    http = app.test_client()
    prompt = {"prompt": "word " * 200}
    replies = [http.post("/v1/ai/chat", json=prompt) for _ in range(6)]
    assert [r.status_code for r in replies] == [200] * 5 + [429]
    assert all(r.get_json()["tokens"] == 400 for r in replies[:5])
    assert replies[5].get_json()["resource"] == "ai_tokens"
    assert replies[5].get_json()["retry_after"] >= 1
    assert http.post("/v1/ai/infer").status_code == 200
    app.extensions["quota"].sql.close()
