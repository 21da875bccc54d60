"""QUOTA_HEADER_NAMES: our headers under the app's own names (Flask-Limiter's
RATELIMIT_HEADER_*), on every response we add headers to, validated at init_app."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_quota import Identity, Quota, QuotaExceeded
from flask_quota.core.headers import RENAMEABLE
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock, assert_limited

RENAMED = {"X-RateLimit-Limit": "X-Quota-Limit", "X-RateLimit-Remaining": "X-Quota-Remaining"}
EVERY = {
    "X-RateLimit-Limit": "X-Q-Limit",
    "X-RateLimit-Remaining": "X-Q-Remaining",
    "X-RateLimit-Reset": "X-Q-Reset",
    "X-RateLimit-Resource": "X-Q-Resource",
    "RateLimit": "Q-RateLimit",
    "RateLimit-Policy": "Q-Policy",
    "Retry-After": "X-Q-Retry-After",
    "X-Concurrency-Limit": "X-Q-In-Flight",
    "X-Concurrency-Remaining": "X-Q-In-Flight-Left",
    "X-RateLimit-Delayed": "X-Q-Held",
    "X-Credits-Balance": "X-Q-Balance",
    "X-Credits-Resource": "X-Q-Balance-Of",
}
# Sent on other responses than a 429: a request held by delay= (tests/test_waiting.py
# renames it) and a credits resource's spend (below).
NOT_ON_A_429 = ("X-RateLimit-Delayed", "X-Credits-Balance", "X-Credits-Resource")


def limited_app(
    app: Flask, clock: FrozenClock, concurrent: int | None = None, **config: Any
) -> tuple[Quota, FlaskClient]:
    app.config.update(QUOTA_PLANS={"free": {}}, **config)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/r")
    @quota.limit("1/minute", concurrent=concurrent)
    def r() -> str:
        return "ok"

    return quota, app.test_client()


def test_renamed_limit_and_remaining_replace_the_old_names_on_200_and_429(
    app: Flask, clock: FrozenClock
) -> None:
    _, client = limited_app(app, clock, QUOTA_HEADER_NAMES=RENAMED)
    ok, denied = client.get("/r"), client.get("/r")
    assert (ok.status_code, denied.status_code) == (200, 429)
    for response, remaining in ((ok, "0"), (denied, "0")):
        assert response.headers["X-Quota-Limit"] == "1"
        assert response.headers["X-Quota-Remaining"] == remaining
        assert "X-RateLimit-Limit" not in response.headers
        assert "X-RateLimit-Remaining" not in response.headers
        # The others keep their names.
        assert response.headers["X-RateLimit-Reset"].isdigit()
        assert "RateLimit-Policy" in response.headers
    assert denied.headers["Retry-After"] == "60"


def test_every_header_can_be_renamed_including_the_429s_retry_after(
    app: Flask, clock: FrozenClock
) -> None:
    assert set(EVERY) == set(RENAMEABLE)  # a header we add to RENAMEABLE joins EVERY
    # A concurrency limit too, so its headers are sent.
    _, client = limited_app(app, clock, concurrent=3, QUOTA_HEADER_NAMES=EVERY)
    client.get("/r")
    denied = client.get("/r")
    assert denied.status_code == 429
    for old, new in EVERY.items():
        if old in NOT_ON_A_429:
            continue
        assert new in denied.headers, new
        assert old not in denied.headers, old
    assert denied.headers["X-Q-Retry-After"] == "60"


def test_the_credits_headers_can_be_renamed(app: Flask, clock: FrozenClock) -> None:
    """A credits resource's balance and name go out under the app's names too."""
    app.config.update(
        QUOTA_PLANS={"payg": {"resources": {"sms": "credits"}}},
        QUOTA_DEFAULT_PLAN="payg",
        QUOTA_ANONYMOUS_PLAN="payg",
        QUOTA_HEADER_NAMES=EVERY,
    )
    quota = Quota(app, storage=MemoryStorage(clock))

    @quota.identity_loader
    def caller() -> Identity:
        return Identity("c1", "payg")

    @app.post("/sms")
    @quota.limit(resource="sms", cost=2)
    def sms() -> str:
        return "sent"

    with app.app_context():
        quota.grant(identity="c1", resource="sms", units=5)
    spent = app.test_client().post("/sms")
    assert spent.status_code == 200
    assert (spent.headers["X-Q-Balance"], spent.headers["X-Q-Balance-Of"]) == ("3", "sms")
    assert "X-Credits-Balance" not in spent.headers


def test_a_429_made_by_the_apps_errorhandler_gets_the_new_names(
    app: Flask, clock: FrozenClock
) -> None:
    _, client = limited_app(
        app, clock, QUOTA_HEADER_NAMES={**RENAMED, "Retry-After": "X-Quota-Wait"}
    )

    @app.errorhandler(QuotaExceeded)
    def slow_down(error: QuotaExceeded) -> tuple[str, int]:
        return "slow down", 429

    client.get("/r")
    denied = client.get("/r")
    assert (denied.status_code, denied.text) == (429, "slow down")
    assert denied.headers["X-Quota-Wait"] == "60"
    assert denied.headers["X-Quota-Remaining"] == "0"
    for old in ("Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining"):
        assert old not in denied.headers


def test_a_charge_after_the_response_sends_the_new_names(app: Flask, clock: FrozenClock) -> None:
    """quota.charge() settles after the view: its headers take the other path."""
    app.config.update(QUOTA_PLANS={"free": {}}, QUOTA_HEADER_NAMES=RENAMED)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/tokens")
    @quota.limit("100/minute")
    def tokens() -> str:
        quota.charge(9)
        return "ok"

    response = app.test_client().get("/tokens")
    assert response.headers["X-Quota-Remaining"] == "90"
    assert "X-RateLimit-Remaining" not in response.headers


def test_the_503_of_a_closed_fail_mode_renames_retry_after(app: Flask) -> None:
    app.config.update(
        QUOTA_STORAGE_URL="redis://127.0.0.1:1/0",  # nothing listens there
        QUOTA_STORAGE_TIMEOUT=0.05,
        QUOTA_FAIL_MODE="closed",
        QUOTA_DENY_CACHE=False,
        QUOTA_HEADER_NAMES={"Retry-After": "X-Quota-Retry"},
    )
    Quota(app)
    app.add_url_rule("/x", "x", lambda: "x")
    response = app.test_client().get("/x")
    assert response.status_code == 503
    assert response.headers["X-Quota-Retry"].isdigit()
    assert "Retry-After" not in response.headers


def test_json_from_the_environment_is_read(app: Flask, clock: FrozenClock) -> None:
    _, client = limited_app(app, clock, QUOTA_HEADER_NAMES='{"x-ratelimit-limit": "X-Max"}')
    response = client.get("/r")
    assert response.headers["X-Max"] == "1"
    assert "X-RateLimit-Limit" not in response.headers


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ({"X-RateLimit-Used": "X-Used"}, r"'X-RateLimit-Used' is not a header flask-quota sends"),
        ({"X-RateLimit-Limit": "X Limit"}, r"\['X-RateLimit-Limit'\].*not a valid header name"),
        ({"X-RateLimit-Limit": "X-A\r\nSet-Cookie: a=b"}, r"\['X-RateLimit-Limit'\].*line break"),
        ({"X-RateLimit-Limit": ""}, r"\['X-RateLimit-Limit'\].*not a valid header name"),
        ({"X-RateLimit-Limit": 3}, r"\['X-RateLimit-Limit'\].*not a valid header name"),
        ({"Retry-After": "content-type"}, r"\['Retry-After'\].*overwrite the response's own"),
        (
            {"X-RateLimit-Limit": "X-Q", "X-RateLimit-Remaining": "x-q"},
            r"'X-RateLimit-Limit' and 'X-RateLimit-Remaining' would both be sent as",
        ),
        (
            {"X-RateLimit-Limit": "RateLimit"},
            r"'X-RateLimit-Limit' and 'RateLimit' would both be sent as",
        ),
        ({"X-RateLimit-Limit": "A", "x-ratelimit-limit": "B"}, r"'X-RateLimit-Limit' .* twice"),
        (["X-RateLimit-Limit"], r"QUOTA_HEADER_NAMES must be a dict"),
        ("{not json", r"QUOTA_HEADER_NAMES is not valid JSON"),
    ],
)
def test_bad_names_fail_at_init_app_naming_the_key(app: Flask, names: Any, message: str) -> None:
    app.config["QUOTA_HEADER_NAMES"] = names
    with pytest.raises(ValueError, match=message) as caught:
        Quota(app)
    assert "QUOTA_HEADER_NAMES" in str(caught.value)


def test_assert_limited_reads_the_renamed_retry_after(app: Flask, clock: FrozenClock) -> None:
    _, client = limited_app(app, clock, QUOTA_HEADER_NAMES={"Retry-After": "X-Quota-Wait"})
    client.get("/r")
    denied = client.get("/r")
    assert "Retry-After" not in denied.headers
    assert assert_limited(denied, retry_after="X-Quota-Wait")["retry_after"] == 60
