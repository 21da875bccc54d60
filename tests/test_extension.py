"""Quota(app): tiers, plans, identities, decorators and configuration."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota import Identity, Quota, QuotaExceeded
from flask_quota.state import QuotaState
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.helpers import infer_and_items

PLANS = {
    "free": {
        "global": "50/second",
        "user": "100/minute",
        "resources": {"ai_inference": "5/minute", "bulk_search": "10/minute"},
    },
    "pro": {
        "global": "50/second",
        "user": "500/minute",
        "resources": {"ai_inference": "30/minute", "bulk_search": "60/minute"},
    },
}


def make_app(app: Flask, clock: FrozenClock, **config: Any) -> tuple[Quota, FlaskClient]:
    app.config.update({"QUOTA_PLANS": PLANS, **config})
    quota = Quota(app, storage=MemoryStorage(clock))
    infer_and_items(app, quota)

    @app.get("/export")
    @quota.limit("2/minute", cost=1)
    def export() -> str:
        return "exported"

    @app.get("/health")
    @quota.exempt
    def health() -> str:
        return "ok"

    return quota, app.test_client()


def test_state_lives_in_app_extensions(app: Flask, clock: FrozenClock) -> None:
    """init_app keeps per-app state in app.extensions['quota'] and sets config defaults."""
    quota = Quota()
    quota.init_app(app)
    assert isinstance(app.extensions["quota"], QuotaState)
    assert app.config["QUOTA_ALGORITHM"] == "token_bucket"


def test_second_init_app_is_refused(app: Flask) -> None:
    """Initialising the same app twice is an error that says what to do."""
    quota = Quota(app)
    with pytest.raises(RuntimeError, match="once per app"):
        quota.init_app(app)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("QUOTA_ALGORITHM", "leaky", "QUOTA_ALGORITHM"),
        ("QUOTA_HEADERS", "all", "QUOTA_HEADERS"),
        ("QUOTA_FAIL_MODE", "maybe", "QUOTA_FAIL_MODE"),
        ("QUOTA_STORAGE_TIMEOUT", "-1", "QUOTA_STORAGE_TIMEOUT"),
        ("QUOTA_STORAGE_TIMEOUT", "soon", "QUOTA_STORAGE_TIMEOUT"),
        ("QUOTA_ENABLED", "perhaps", "QUOTA_ENABLED"),
        ("QUOTA_DEFAULT_PLAN", "gold", "QUOTA_DEFAULT_PLAN"),
        ("QUOTA_STORAGE_URL", "mongodb://x", "QUOTA_STORAGE_URL"),
        ("QUOTA_PLANS", {"free": {"user": "100/fortnight"}}, "QUOTA_PLANS"),
        ("QUOTA_PLANS", "{not json", "QUOTA_PLANS"),
        ("QUOTA_DASHBOARD_URL", "quota", "QUOTA_DASHBOARD_URL"),
    ],
)
def test_bad_config_fails_at_init_naming_the_key(
    app: Flask, key: str, value: Any, message: str
) -> None:
    """Invalid configuration raises ValueError at init_app, naming the key."""
    app.config[key] = value
    with pytest.raises(ValueError, match=message):
        Quota(app)
    assert "quota" not in app.extensions


def test_string_config_from_the_environment_is_accepted(app: Flask) -> None:
    """Env-style strings for booleans, numbers and JSON plans are parsed."""
    app.config.update(
        QUOTA_ENABLED="true",
        QUOTA_STORAGE_TIMEOUT="0.25",
        QUOTA_PLANS='{"basic": {"user": "3/minute"}}',
        QUOTA_DEFAULT_PLAN="basic",
        QUOTA_ANONYMOUS_PLAN="basic",
    )
    Quota(app)
    settings = app.extensions["quota"].settings
    assert settings.enabled is True and settings.storage_timeout == 0.25
    assert list(settings.plans) == ["basic"]


def test_headers_follow_a_known_sequence(app: Flask, clock: FrozenClock) -> None:
    """Remaining, Reset and RateLimit match the token bucket arithmetic exactly."""
    _, http = make_app(app, clock)
    now = clock.now_us // 1_000_000
    response = http.post("/infer")
    assert response.status_code == 200
    headers = response.headers
    # ai_inference is 5/minute: one token is 12 s, so the bucket is full again in 12 s.
    assert headers["X-RateLimit-Limit"] == "5"
    assert headers["X-RateLimit-Remaining"] == "4"
    assert headers["X-RateLimit-Reset"] == str(now + 12)
    assert headers["X-RateLimit-Resource"] == "ai_inference"
    assert headers["RateLimit-Policy"] == (
        '"global";q=50;w=1, "user";q=100;w=60, "ai_inference";q=5;w=60'
    )
    assert headers["RateLimit"] == '"ai_inference";r=4;t=12'
    clock.advance(3)
    headers = http.post("/infer").headers
    assert headers["X-RateLimit-Remaining"] == "3"
    assert headers["RateLimit"] == '"ai_inference";r=3;t=21'  # 9 s left of the first token + 12
    # Fewest remaining wins: global (50, two used this second) beats user (97 left).
    items = http.get("/items").headers
    assert items["X-RateLimit-Resource"] == "global"
    assert items["X-RateLimit-Remaining"] == "48"
    assert items["RateLimit-Policy"] == '"global";q=50;w=1, "user";q=100;w=60'


def test_denial_is_a_problem_with_retry_after(app: Flask, clock: FrozenClock) -> None:
    """The 429 names the tier, the wait and the upgrade, in RFC 9457 form."""
    _, http = make_app(app, clock)
    for _ in range(5):
        assert http.post("/infer").status_code == 200
    clock.advance(2)
    response = http.post("/infer")
    assert response.status_code == 429
    assert response.content_type == "application/problem+json"
    assert response.headers["Retry-After"] == "10"  # the next token comes 12 s after the first
    body = response.get_json()
    now = clock.now_us // 1_000_000
    assert body == {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Too Many Requests",
        "status": 429,
        "detail": "Endpoint limit 'ai_inference' exceeded: 5 requests per 60 s on plan 'free'.",
        "violated-policies": ["ai_inference"],
        "tier": "endpoint",
        "resource": "ai_inference",
        "plan": "free",
        "limit": 5,
        "window": 60,
        "remaining": 0,
        "retry_after": 10,
        "reset": now - 2 + 60,
        "upgrade": "Pro raises this to 30 per minute: see /pricing",
    }
    assert response.headers["X-RateLimit-Remaining"] == "0"
    assert response.headers["RateLimit"] == '"ai_inference";r=0;t=58'
    clock.advance(10)
    assert http.post("/infer").status_code == 200


def test_endpoint_denial_leaves_other_tiers_unchanged(app: Flask, clock: FrozenClock) -> None:
    """All-or-nothing: requests the endpoint tier denies charge neither user nor global."""
    plans = {"free": {**PLANS["free"], "global": "1000/second"}}
    _, http = make_app(app, clock, QUOTA_PLANS=plans)
    for _ in range(5):
        http.post("/infer")
    for _ in range(20):
        assert http.post("/infer").status_code == 429
    # 5 admitted so far; the user tier must show 94 left after this one, not 74.
    items = http.get("/items").headers
    assert (items["X-RateLimit-Resource"], items["X-RateLimit-Remaining"]) == ("user", "94")


def test_user_tier_denies_with_its_own_name(app: Flask, clock: FrozenClock) -> None:
    """The user tier is shared by all endpoints and says so when it denies."""
    app.config["QUOTA_PLANS"] = {"free": {"user": "3/minute"}}
    quota = Quota(app, storage=MemoryStorage(clock))
    seen = []

    @app.get("/a")
    def a() -> str:
        seen.append(quota.current_decision())
        return "a"

    @app.get("/b")
    def b() -> str:
        return "b"

    http = app.test_client()
    assert [http.get(p).status_code for p in ("/a", "/b", "/a", "/b")] == [200, 200, 200, 429]
    body = http.get("/a").get_json()
    assert (body["tier"], body["resource"], body["violated-policies"]) == ("user", None, ["user"])
    assert body["detail"] == "User limit exceeded: 3 requests per 60 s on plan 'free'."
    assert body["upgrade"] is None  # no bigger plan exists
    # Inside a view, the request's own decision is at hand.
    first, second = seen
    assert first is not None and second is not None
    assert (first.plan, first.allowed, second.allowed) == ("free", True, True)
    user = [r for r in second.results if r.name == "user"]
    assert [r.outcome.remaining for r in user] == [0]


def test_literal_rate_and_cost(app: Flask, clock: FrozenClock) -> None:
    """@quota.limit('2/minute') limits by the endpoint name; cost weighs the request."""
    app.config["QUOTA_PLANS"] = PLANS
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/export")
    @quota.limit("4/minute", cost=2)
    def export() -> str:
        return "x"

    @app.get("/dynamic")
    @quota.limit("10/minute", cost=lambda: 3)
    def dynamic() -> str:
        return "y"

    http = app.test_client()
    first = http.get("/export")
    assert first.headers["X-RateLimit-Resource"] == "export"
    assert first.headers["X-RateLimit-Remaining"] == "2"
    assert http.get("/export").status_code == 200
    assert http.get("/export").status_code == 429
    assert http.get("/dynamic").headers["X-RateLimit-Remaining"] == "7"


def test_plan_rate_wins_over_the_literal_rate(app: Flask, clock: FrozenClock) -> None:
    """When the plan defines the resource, its rate applies, not the decorator's."""
    app.config["QUOTA_PLANS"] = PLANS
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/search")
    @quota.limit("1000/minute", resource="bulk_search")
    def search() -> str:
        return "s"

    assert app.test_client().get("/search").headers["X-RateLimit-Limit"] == "10"


def test_exempt_views_are_not_limited(app: Flask, clock: FrozenClock) -> None:
    """An exempt view never counts and never answers 429."""
    _, http = make_app(app, clock, QUOTA_PLANS={"free": {"global": "1/hour", "user": "1/hour"}})
    for _ in range(5):
        response = http.get("/health")
        assert response.status_code == 200
        assert "X-RateLimit-Limit" not in response.headers
    assert http.get("/items").status_code == 200


def test_disabled_quota_limits_nothing(app: Flask, clock: FrozenClock) -> None:
    """QUOTA_ENABLED=False switches enforcement off."""
    _, http = make_app(app, clock, QUOTA_ENABLED=False)
    assert all(http.post("/infer").status_code == 200 for _ in range(10))


@pytest.mark.parametrize(
    ("mode", "present", "absent"),
    [
        ("legacy", ["X-RateLimit-Limit"], ["RateLimit", "RateLimit-Policy"]),
        ("ietf", ["RateLimit", "RateLimit-Policy"], ["X-RateLimit-Limit"]),
        ("none", [], ["RateLimit", "X-RateLimit-Limit"]),
    ],
)
def test_header_modes(
    app: Flask, clock: FrozenClock, mode: str, present: list[str], absent: list[str]
) -> None:
    """QUOTA_HEADERS picks legacy, IETF, both or no headers."""
    _, http = make_app(app, clock, QUOTA_HEADERS=mode)
    headers = http.get("/items").headers
    assert all(name in headers for name in present)
    assert not any(name in headers for name in absent)


def test_identity_loader_keys_the_user_tier_by_identity(app: Flask, clock: FrozenClock) -> None:
    """An identity keeps its budget across IPs; its plan sets the rates."""
    quota, http = make_app(app, clock)

    @quota.identity_loader
    def load() -> Identity | None:
        from flask import request

        user = request.headers.get("X-User")
        return Identity(user, plan="pro") if user else None

    first = http.post("/infer", headers={"X-User": "ada"}, environ_base={"REMOTE_ADDR": "10.0.0.1"})
    assert first.headers["X-RateLimit-Limit"] == "30"
    second = http.post(
        "/infer", headers={"X-User": "ada"}, environ_base={"REMOTE_ADDR": "10.0.0.2"}
    )
    assert second.headers["X-RateLimit-Remaining"] == "28"
    other = http.post("/infer", headers={"X-User": "bob"}, environ_base={"REMOTE_ADDR": "10.0.0.1"})
    assert other.headers["X-RateLimit-Remaining"] == "29"


def test_identity_loader_must_return_identity(app: Flask, clock: FrozenClock) -> None:
    """A loader returning the wrong type is a programming error with a clear message."""
    quota, http = make_app(app, clock)
    quota.identity_loader(lambda: "ada")  # type: ignore[arg-type, return-value]
    app.config["PROPAGATE_EXCEPTIONS"] = True
    with pytest.raises(TypeError, match=r"must return flask_quota\.Identity"):
        http.get("/items")


def test_errorhandler_can_replace_the_429(app: Flask, clock: FrozenClock) -> None:
    """Apps customise the denial with @app.errorhandler(QuotaExceeded); headers stay."""
    _, http = make_app(app, clock, QUOTA_PLANS={"free": {"user": "1/minute"}})

    @app.errorhandler(QuotaExceeded)
    def custom(error: QuotaExceeded) -> tuple[dict[str, Any], int]:
        return {"slow down": error.retry_after, "tier": str(error.tier)}, 429

    http.get("/items")
    response = http.get("/items")
    assert response.status_code == 429
    assert response.get_json() == {"slow down": 60, "tier": "user"}
    assert response.headers["X-RateLimit-Remaining"] == "0"


def test_decorator_arguments_are_validated(app: Flask) -> None:
    """Malformed rates, resource names and costs fail at decoration time."""
    quota = Quota(app)
    with pytest.raises(ValueError, match="malformed rate"):
        quota.limit("ten per minute")
    with pytest.raises(ValueError, match="resource"):
        quota.limit(resource="ai inference!")
    with pytest.raises(ValueError, match="needs a rate"):
        quota.limit()
    with pytest.raises(ValueError, match="cost"):
        quota.limit("1/second", cost=-1)

    def view() -> str:
        return ""

    quota.limit("1/second", resource="r")(view)
    quota.limit("2/second")(view)  # limits stack, each on its own bucket
    with pytest.raises(ValueError, match="already has"):
        quota.limit("2/second", resource="r")(view)  # two limits, one bucket


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "sliding_window_log", "sliding_window_counter"]
)
def test_every_algorithm_enforces_through_the_app(
    app: Flask, clock: FrozenClock, algorithm: str
) -> None:
    """QUOTA_ALGORITHM switches the algorithm for every tier."""
    _, http = make_app(app, clock, QUOTA_ALGORITHM=algorithm)
    statuses = [http.post("/infer").status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]


def test_headers_stay_valid_for_any_endpoint_name(app: Flask, clock: FrozenClock) -> None:
    """A non-ASCII endpoint name is shown as printable ASCII in every header."""
    app.config["QUOTA_PLANS"] = {"free": {"user": "9/minute"}}
    quota = Quota(app, storage=MemoryStorage(clock))

    def view() -> str:
        return "ok"

    app.add_url_rule("/cafe", endpoint='caf\u00e9"\\', view_func=quota.limit("2/minute")(view))
    headers = app.test_client().get("/cafe").headers
    assert headers["X-RateLimit-Resource"] == 'caf?"\\'
    assert headers["RateLimit"] == '"caf?\\"\\\\";r=1;t=30'


def test_app_set_rate_limit_headers_are_replaced(app: Flask, clock: FrozenClock) -> None:
    """If the view already set a rate-limit header, ours replaces it (no duplicates)."""
    app.config["QUOTA_PLANS"] = {"free": {"user": "9/minute"}}
    Quota(app, storage=MemoryStorage(clock))

    @app.get("/own")
    def own() -> tuple[str, int, dict[str, str]]:
        return "ok", 200, {"X-RateLimit-Limit": "1000"}

    response = app.test_client().get("/own")
    assert response.headers.getlist("X-RateLimit-Limit") == ["9"]
