"""``@quota.limit(callable)``: a rate chosen per request, parsed once per distinct answer."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, request

from flask_quota import Identity, Quota
from flask_quota.core import rates
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock

PAID: set[str] = set()


def ai_app(app: Flask, clock: FrozenClock) -> tuple[Flask, Quota]:
    # A window counts requests, so a rate change keeps the count (a token bucket keeps
    # its time instead: see docs/usage.md).
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}}, QUOTA_ALGORITHM="fixed_window")
    quota = Quota(app, storage=MemoryStorage(clock))

    @quota.identity_loader
    def who() -> Identity:
        return Identity(id=request.args["who"], plan="free")

    @app.get("/ai")
    @quota.limit(lambda: "4/minute" if request.args["who"] in PAID else "1/minute")
    def ai() -> str:
        return "ok"

    return app, quota


def test_unpaid_and_paid_callers(app: Flask, clock: FrozenClock) -> None:
    """Unpaid callers get 200, 429 on 1/minute; paid ones 200 x4, 429 on 4/minute."""
    PAID.clear()
    PAID.add("bob")
    http = ai_app(app, clock)[0].test_client()
    assert [http.get("/ai?who=ann").status_code for _ in range(2)] == [200, 429]
    assert [http.get("/ai?who=bob").status_code for _ in range(5)] == [200] * 4 + [429]
    assert http.get("/ai?who=ann").headers["X-RateLimit-Limit"] == "1"


def test_a_caller_keeps_its_bucket_when_its_rate_changes(app: Flask, clock: FrozenClock) -> None:
    """One bucket whatever the rate: ann used 1 on 1/minute, then pays: 3 more, not 4."""
    PAID.clear()
    http = ai_app(app, clock)[0].test_client()
    assert http.get("/ai?who=ann").status_code == 200
    PAID.add("ann")
    assert [http.get("/ai?who=ann").status_code for _ in range(4)] == [200] * 3 + [429]


def test_rate_keyword_and_several_rates(app: Flask, clock: FrozenClock) -> None:
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/s")
    @quota.limit(rate=lambda: "2/second, 3/day")
    def s() -> str:
        return "ok"

    http = app.test_client()
    assert [http.get("/s").status_code for _ in range(3)] == [200, 200, 429]
    clock.advance(1)
    assert [http.get("/s").status_code for _ in range(2)] == [200, 429]


def test_each_distinct_answer_is_parsed_once(
    app: Flask, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    PAID.clear()
    PAID.add("bob")
    parsed: list[object] = []
    real = rates.parse_rates

    def counting(text: object) -> rates.Rates:
        parsed.append(text)
        return real(text)  # type: ignore[arg-type]

    monkeypatch.setattr("flask_quota.core.facts.parse_rates", counting)
    http = ai_app(app, clock)[0].test_client()
    for _ in range(3):
        http.get("/ai?who=ann")
        http.get("/ai?who=bob")
    assert sorted(parsed) == ["1/minute", "4/minute"]  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("answer", "error"), [("lots/minute", ValueError), (None, TypeError), (5, TypeError)]
)
def test_a_bad_answer_names_the_view(
    app: Flask, clock: FrozenClock, answer: Any, error: type[Exception]
) -> None:
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/bad")
    @quota.limit(lambda: answer)
    def bad() -> str:
        return "ok"

    app.config["TESTING"] = True
    with pytest.raises(error, match="rate callable of 'bad'"):
        app.test_client().get("/bad")


def test_a_callable_rate_on_a_stacked_view(app: Flask, clock: FrozenClock) -> None:
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}}, QUOTA_ALGORITHM="fixed_window")
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/both")
    @quota.limit(lambda: "1/minute" if "slow" in request.args else "3/minute")
    @quota.limit("2/minute", resource="fixed")
    def both() -> str:
        return "ok"

    http = app.test_client()
    assert http.get("/both?slow=1").status_code == 200
    assert http.get("/both?slow=1").get_json()["resource"] == "both"
    assert http.get("/both").status_code == 200
    assert http.get("/both").get_json()["resource"] == "fixed"
