"""``error_message=`` on a limit becomes the 429's ``detail`` when that limit denies."""

from __future__ import annotations

import pytest
from flask import Flask, request

from flask_quota import Quota
from flask_quota.storage import MemoryStorage


def test_a_string_and_a_callable_message(app: Flask) -> None:
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}})
    quota = Quota(app, storage=MemoryStorage())

    @app.get("/sms")
    @quota.limit("1/minute", error_message="Too many texts: wait a minute.")
    def sms() -> str:
        return "ok"

    @app.get("/call")
    @quota.limit("1/minute", error_message=lambda: f"Calls to {request.args['to']}: wait.")
    @quota.limit("5/minute", resource="calls_any")
    def call() -> str:
        return "ok"

    http = app.test_client()
    http.get("/sms")
    denied = http.get("/sms")
    assert denied.status_code == 429
    assert denied.get_json()["detail"] == "Too many texts: wait a minute."
    http.get("/call?to=bob")
    assert http.get("/call?to=bob").get_json()["detail"] == "Calls to bob: wait."


def test_the_default_detail_for_another_limit_of_the_stack(app: Flask) -> None:
    """The message is that limit's: a stacked limit without one keeps the default detail."""
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}})
    quota = Quota(app, storage=MemoryStorage())

    @app.get("/v")
    @quota.limit("5/minute", error_message="never shown")
    @quota.limit("1/minute", resource="tight")
    def v() -> str:
        return "ok"

    http = app.test_client()
    http.get("/v")
    assert http.get("/v").get_json()["detail"].startswith("Endpoint limit 'tight' exceeded")


def test_a_bad_message_is_refused_at_configuration(app: Flask) -> None:
    quota = Quota(app, storage=MemoryStorage())
    with pytest.raises(ValueError, match="error_message"):
        quota.limit("1/minute", error_message=5)  # type: ignore[arg-type]
