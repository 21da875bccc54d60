"""Where the after-response work of issue 22's features meets streams, other hooks and
inner limits: each case was a defect found by review of the merged features."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask, Response, request, stream_with_context
from werkzeug.wrappers import Response as WerkzeugResponse

from flask_quota import Quota, QuotaExceeded
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock, assert_limited
from tests.helpers import left


def test_a_hook_failing_after_ours_still_frees_a_streams_lease(
    app: Flask, clock: FrozenClock
) -> None:
    """An after-request hook that runs after ours and raises turns the stream into a 500
    that is never sent nor closed: its lease is given back at teardown, not leaked."""

    @app.after_request  # registered before Quota(app): Flask runs it after ours
    def boom(response: Response) -> Response:
        if request.args.get("boom"):
            raise RuntimeError("an app's own hook failed")
        return response

    app.config.update(QUOTA_PLANS={"free": {}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/s")
    @quota.limit(concurrent=1)
    def s() -> Response:
        return Response(iter(["a", "b"]))

    http = app.test_client()
    with pytest.raises(RuntimeError):  # the test app propagates it; a server answers 500
        http.get("/s?boom=1")
    with http.get("/s") as again:
        assert again.status_code == 200


def test_settle_inside_a_stream_settles_when_it_ends(app: Flask, clock: FrozenClock) -> None:
    """A streamed answer learns its real cost while it streams (an LLM's tokens):
    ``quota.settle`` in the stream makes the charge exact once the stream is closed."""
    app.config.update(QUOTA_PLANS={"free": {}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.post("/chat")
    @quota.limit("1000/hour", resource="tokens", cost=100)
    def chat() -> Response:
        def tokens() -> Iterator[str]:
            yield "x"
            quota.settle(10)
            yield "y"

        return Response(stream_with_context(tokens()))

    with app.test_client().post("/chat") as response:
        assert response.get_data(as_text=True) == "xy"
        assert response.headers["X-RateLimit-Remaining"] == "900"  # sent before the end
    assert left(app, quota) == 990


def test_a_limited_denial_in_a_view_carries_that_limits_answer_only(
    app: Flask, clock: FrozenClock
) -> None:
    """The 429 of a ``quota.limited`` inside a limited view is that limit's: the view's
    rate headers (which admitted the request) would contradict its body."""
    app.config.update(QUOTA_PLANS={"free": {}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.post("/send")
    @quota.limit("100/minute")
    def send() -> str:
        with quota.limited("1/minute", resource="send_sms", key="+15550100"):
            return "sent"

    http = app.test_client()
    assert http.post("/send").status_code == 200
    denied = http.post("/send")
    assert assert_limited(denied, resource="send_sms")["limit"] == 1
    assert "X-RateLimit-Resource" not in denied.headers
    assert "X-RateLimit-Remaining" not in denied.headers


def test_an_errorhandler_returning_our_response_gets_the_new_names(
    app: Flask, clock: FrozenClock
) -> None:
    """``return error.get_response()`` in the app's handler: the renamed headers only."""
    app.config.update(QUOTA_PLANS={"free": {}}, QUOTA_HEADER_NAMES={"Retry-After": "X-Wait"})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.errorhandler(QuotaExceeded)
    def mine(error: QuotaExceeded) -> WerkzeugResponse:
        return error.get_response()

    @app.get("/r")
    @quota.limit("1/minute")
    def r() -> str:
        return "ok"

    http = app.test_client()
    http.get("/r")
    denied = http.get("/r")
    assert denied.status_code == 429
    assert denied.headers["X-Wait"] == "60"
    assert "Retry-After" not in denied.headers


def test_limited_counts_in_its_resources_unit(app: Flask, clock: FrozenClock) -> None:
    app.config.update(
        QUOTA_PLANS={"free": {"resources": {"tok": {"rate": "1000/hour", "unit": "tokens"}}}}
    )
    quota = Quota(app, storage=MemoryStorage(clock))
    with app.app_context():
        with quota.limited("5/minute", resource="tok", key="batch", cost=600):
            pass
        with (
            pytest.raises(QuotaExceeded) as denied,
            quota.limited("5/minute", resource="tok", key="batch", cost=600),
        ):
            pass
    assert "1000 tokens per 3600 s" in denied.value.description


def test_a_concurrency_denial_never_blocks_the_caller(app: Flask, clock: FrozenClock) -> None:
    """``QUOTA_BLOCK_AFTER`` counts what rates deny; a caller told to retry for a slot
    (Retry-After: 1) that does so is not blocked for it."""
    app.config.update(QUOTA_PLANS={"free": {}}, QUOTA_BLOCK_AFTER="3/minute")
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/s")
    @quota.limit(concurrent=1)
    def s() -> Response:
        return Response(iter(["a"]))

    http = app.test_client()
    with http.get("/s") as held:
        assert held.status_code == 200
        tiers = [http.get("/s").get_json()["tier"] for _ in range(5)]
    assert tiers == ["concurrent"] * 5
    with http.get("/s") as after:
        assert after.status_code == 200


def test_a_view_without_a_limit_still_shows_the_plans_tiers(app: Flask, clock: FrozenClock) -> None:
    """The after-response paths above must leave the plain case alone: the user tier's
    headers on a view that has no ``@quota.limit``."""
    app.config.update(QUOTA_PLANS={"free": {"user": "50/minute"}})
    Quota(app, storage=MemoryStorage(clock))

    @app.get("/")
    def index() -> str:
        return "ok"

    response = app.test_client().get("/")
    assert response.headers["X-RateLimit-Resource"] == "user"
    assert response.headers["RateLimit-Policy"] == '"user";q=50;w=60'
