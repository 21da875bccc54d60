"""Flask-Limiter's usual examples, ported to flask-quota as the README's
"Coming from Flask-Limiter" section maps them, behave as their originals do.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Blueprint, Flask, g, jsonify, request
from flask.testing import FlaskClient

from flask_quota import Identity, Quota, QuotaExceeded
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock


def quota_app(app: Flask, clock: FrozenClock, user: str = "1000/hour", **config: Any) -> Quota:
    """A plan whose user tier stands for Flask-Limiter's default_limits."""
    app.config.update({"QUOTA_PLANS": {"free": {"user": user}}, **config})
    return Quota(app, storage=MemoryStorage(clock))


def statuses(client: FlaskClient, path: str, n: int, **kwargs: Any) -> list[int]:
    return [client.open(path, **kwargs).status_code for _ in range(n)]


# -- features that exist now ----------------------------------------------------------


def test_quickstart_default_limits_decorated_and_exempt(app: Flask, clock: FrozenClock) -> None:
    """Flask-Limiter's quickstart: default limits on /fast, '1 per day' on /slow, /ping
    exempt; each 429 says which limit and carries Retry-After."""
    quota = quota_app(app, clock, user="2/minute")  # default_limits=["2 per minute"]

    @app.get("/slow")
    @quota.limit("1 per day")
    def slow() -> str:
        return "24"

    @app.get("/fast")
    def fast() -> str:
        return "42"

    @app.get("/ping")
    @quota.exempt
    def ping() -> str:
        return "PONG"

    client = app.test_client()
    assert statuses(client, "/fast", 3) == [200, 200, 429]
    assert statuses(client, "/ping", 5) == [200] * 5
    clock.advance(60)
    assert statuses(client, "/slow", 2) == [200, 429]
    denied = client.get("/slow")
    assert denied.get_json()["resource"] == "slow" and int(denied.headers["Retry-After"]) > 3600


def test_cost_weighs_a_request(app: Flask, clock: FrozenClock) -> None:
    """@limiter.limit('10/minute', cost=5) ~ @quota.limit('10/minute', cost=5): two calls."""
    quota = quota_app(app, clock)

    @app.get("/heavy")
    @quota.limit("10/minute", cost=5)
    def heavy() -> str:
        return "done"

    assert statuses(app.test_client(), "/heavy", 3) == [200, 200, 429]


def test_shared_limit_is_one_resource_on_several_views(app: Flask, clock: FrozenClock) -> None:
    """limiter.shared_limit('3/minute', scope='search') on two views ~ one resource."""
    quota = quota_app(app, clock)

    @app.get("/search/books")
    @quota.limit("3/minute", resource="search")
    def books() -> str:
        return "books"

    @app.get("/search/films")
    @quota.limit("3/minute", resource="search")
    def films() -> str:
        return "films"

    client = app.test_client()
    assert statuses(client, "/search/books", 2) + statuses(client, "/search/films", 2) == [
        200, 200, 200, 429,
    ]  # fmt: skip


def test_error_message_becomes_an_error_handler(app: Flask, clock: FrozenClock) -> None:
    """error_message=... ~ @app.errorhandler(QuotaExceeded) with the decision's fields."""
    quota = quota_app(app, clock)

    @app.errorhandler(QuotaExceeded)
    def too_many(exc: QuotaExceeded) -> Any:
        return jsonify(error=f"slow down: {exc.limit} per {exc.window} s"), 429

    @app.get("/once")
    @quota.limit("1/minute")
    def once() -> str:
        return "ok"

    client = app.test_client()
    client.get("/once")
    response = client.get("/once")
    assert response.status_code == 429
    assert response.get_json() == {"error": "slow down: 1 per 60 s"}


def test_key_func_per_user_is_the_identity_loader(app: Flask, clock: FrozenClock) -> None:
    """Limiter(key_func=lambda: current_user.id) ~ @quota.identity_loader: each user has
    a budget of their own."""
    quota = quota_app(app, clock, user="2/minute")

    @quota.identity_loader
    def user() -> Identity | None:
        name = request.headers.get("X-User")
        return Identity(name) if name else None

    @app.get("/me")
    def me() -> str:
        return "me"

    client = app.test_client()
    assert statuses(client, "/me", 3, headers={"X-User": "ann"}) == [200, 200, 429]
    assert statuses(client, "/me", 2, headers={"X-User": "bob"}) == [200, 200]


def test_reset_forgets_a_callers_usage(app: Flask, clock: FrozenClock) -> None:
    """limiter.reset() ~ quota.reset(ip=...): the caller starts afresh."""
    quota = quota_app(app, clock, user="1/minute")

    @app.get("/x")
    def x() -> str:
        return "x"

    client = app.test_client()
    assert statuses(client, "/x", 2) == [200, 429]
    with app.app_context():
        assert quota.reset(ip="127.0.0.1") >= 1
    assert statuses(client, "/x", 1) == [200]


# -- Flask-Limiter features and their equivalents here -------------------------------


def test_deduct_when_is_charge_when(app: Flask, clock: FrozenClock) -> None:
    """deduct_when=lambda r: r.status_code >= 400 ~ charge_when=: only failures count."""
    quota = quota_app(app, clock)

    @app.post("/login")
    @quota.limit("3/minute", resource="login",
                 charge_when=lambda response: response.status_code >= 400)  # fmt: skip
    def login() -> Any:
        return ("ok", 200) if request.form.get("pw") == "right" else ("no", 401)

    client = app.test_client()
    ok = statuses(client, "/login", 10, method="POST", data={"pw": "right"})
    bad = statuses(client, "/login", 4, method="POST", data={"pw": "wrong"})
    assert ok == [200] * 10 and bad == [401, 401, 401, 429]


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter", "token_bucket"])
def test_headers_after_a_refund_match_what_peek_says(
    app: Flask, clock: FrozenClock, algorithm: str
) -> None:
    """From Flask-Limiter's suite: a '1/hour' limit refunded by deduct_when stacked with
    '3/second'. Its refunded bucket is full again, so the headers say it resets now, as
    ``quota.peek`` does (it said "an hour away"); the rule "fewest remaining, ties: the
    one that resets last" then shows the 3/second limit once both have one left."""
    quota = quota_app(app, clock, QUOTA_ALGORITHM=algorithm)

    @app.get("/x")
    @quota.limit("3/second", resource="burst")
    @quota.limit("1/hour", resource="hourly", charge_when=lambda r: r.status_code >= 400)
    def x() -> str:
        return "ok"

    client = app.test_client()
    now = clock.seconds
    first = client.get("/x")
    assert first.headers["X-RateLimit-Resource"] == "hourly"  # 1 of 1 left, 2 of 3
    assert first.headers["X-RateLimit-Remaining"] == "1"
    assert int(first.headers["X-RateLimit-Reset"]) <= now + 1  # full: resets now
    with app.app_context():
        hourly = [b for b in quota.peek(ip="127.0.0.1") if b.name.startswith("hourly")]
    assert hourly[0].remaining == 1 and hourly[0].reset_in == 0
    second = client.get("/x")  # 1 of 1 left, 1 of 3 left: the tie goes to burst
    assert second.headers["X-RateLimit-Resource"] == "burst"
    assert second.headers["X-RateLimit-Remaining"] == "1"


def test_limited_takes_a_callable_rate_as_limit_does(app: Flask, clock: FrozenClock) -> None:
    """From Flask-Limiter's suite: ``limiter.limit(callable)`` as a context manager and as
    a decorator. ``quota.limited`` takes a callable rate as ``@quota.limit`` does, asked
    on each entry (it raised ``ValueError``)."""
    quota = quota_app(app, clock, QUOTA_ALGORITHM="fixed_window")  # a count, whatever the rate
    paid = {"yes": False}

    def rate() -> str:
        return "4/minute" if paid["yes"] else "2/minute"

    @quota.limited(rate, resource="sync", key="partner")
    def sync() -> str:
        return "synced"

    with app.app_context():
        outcomes = []
        for _ in range(3):
            try:
                outcomes.append(sync())
            except QuotaExceeded:
                outcomes.append("429")
        assert outcomes == ["synced", "synced", "429"]
        paid["yes"] = True  # the same bucket, a higher rate: two more fit
        with quota.limited(rate, resource="sync", key="partner"):
            pass
        with quota.limited(rate, resource="sync", key="partner"):
            pass
        with pytest.raises(QuotaExceeded), quota.limited(rate, resource="sync", key="partner"):
            pass


def test_key_func_per_limit_is_key(app: Flask, clock: FrozenClock) -> None:
    """@limiter.limit(..., key_func=lambda: g.org) ~ key=: one bucket per organisation."""

    @app.before_request  # registered before Quota's hook, so it runs first
    def org() -> None:
        g.org = request.headers.get("X-Org", "none")

    quota = quota_app(app, clock)

    @app.get("/org")
    @quota.limit("3/minute", resource="org", key=lambda: g.org)
    def org_view() -> str:
        return "org"

    client = app.test_client()
    acme = [{"X-Org": "acme", "X-User": u} for u in ("a", "b", "a", "b")]
    assert [client.get("/org", headers=h).status_code for h in acme] == [200, 200, 200, 429]
    assert client.get("/org", headers={"X-Org": "other"}).status_code == 200


def test_several_limits_on_one_decorator(app: Flask, clock: FrozenClock) -> None:
    """'2/second;3/minute' in Flask-Limiter ~ '2/second, 3/minute' here."""
    quota = quota_app(app, clock)

    @app.get("/multi")
    @quota.limit("2/second, 3/minute")
    def multi() -> str:
        return "m"

    client = app.test_client()
    assert statuses(client, "/multi", 3) == [200, 200, 429]
    clock.advance(1.2)
    assert statuses(client, "/multi", 2) == [200, 429]


def test_per_method_false_shares_one_bucket(app: Flask, clock: FrozenClock) -> None:
    """per_method=False: GET and POST of a view draw on one bucket."""
    quota = quota_app(app, clock)

    @app.route("/form", methods=["GET", "POST"])
    @quota.limit("2/minute", per_method=False)
    def form() -> str:
        return "f"

    client = app.test_client()
    assert [client.get("/form").status_code, client.post("/form").status_code,
            client.get("/form").status_code] == [200, 200, 429]  # fmt: skip


def test_exempt_when_skips_trusted_callers(app: Flask, clock: FrozenClock) -> None:
    """exempt_when=lambda: request.remote_addr in TRUSTED: trusted callers are not limited."""
    quota = quota_app(app, clock)

    @app.get("/t")
    @quota.limit("1/minute", exempt_when=lambda: request.remote_addr == "10.0.0.1")
    def t() -> str:
        return "t"

    client = app.test_client()
    trusted = {"environ_base": {"REMOTE_ADDR": "10.0.0.1"}}
    assert statuses(client, "/t", 3, **trusted) == [200, 200, 200]
    assert statuses(client, "/t", 2) == [200, 429]


def test_request_filter_frees_matching_requests(app: Flask, clock: FrozenClock) -> None:
    """@limiter.request_filter ~ @quota.request_filter: True means no tier applies."""
    quota = quota_app(app, clock, user="1/minute")

    @quota.request_filter
    def internal() -> bool:
        return request.headers.get("X-Internal") == "1"

    @app.get("/r")
    def r() -> str:
        return "r"

    client = app.test_client()
    assert statuses(client, "/r", 3, headers={"X-Internal": "1"}) == [200] * 3
    assert statuses(client, "/r", 2) == [200, 429]


def test_blueprint_limit_and_exempt(app: Flask, clock: FrozenClock) -> None:
    """limiter.limit('2/minute')(bp) and limiter.exempt(bp) ~ the same calls on quota."""
    quota = quota_app(app, clock)
    limited, free = Blueprint("limited", __name__), Blueprint("free", __name__)

    @limited.get("/a")
    def a() -> str:
        return "a"

    @free.get("/b")
    def b() -> str:
        return "b"

    quota.limit("2/minute")(limited)
    quota.exempt(free)
    app.register_blueprint(limited, url_prefix="/l")
    app.register_blueprint(free, url_prefix="/f")
    client = app.test_client()
    assert statuses(client, "/l/a", 3) == [200, 200, 429]
    assert statuses(client, "/f/b", 5) == [200] * 5


def test_on_breach_is_the_quota_exceeded_signal(app: Flask, clock: FrozenClock) -> None:
    """on_breach=callback ~ signals.quota_exceeded: sent once per 429 with the decision."""
    from flask_quota import signals

    quota = quota_app(app, clock)
    seen: list[Any] = []

    @app.get("/s")
    @quota.limit("1/minute")
    def s() -> str:
        return "s"

    with signals.quota_exceeded.connected_to(lambda sender, **kw: seen.append(kw["decision"]), app):
        statuses(app.test_client(), "/s", 3)
    assert len(seen) == 2
