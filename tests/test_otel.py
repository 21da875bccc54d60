"""OpenTelemetry: the decision's ratelimit.* attributes on the recording span."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flask_quota import Identity, Quota
from flask_quota.otel import SpanObserver, span_observer
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock

ADDRESS = "198.51.100.23"


@pytest.fixture
def spans() -> Iterator[tuple[trace.Tracer, InMemorySpanExporter]]:
    """A tracer of an SDK provider of the test's own (the global one is left alone) and
    the in-memory exporter its finished spans go to."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


def traced_app(app: Flask, **config: Any) -> tuple[FlaskClient, Quota]:
    plans = {"free": {"user": "1/minute"}, "pro": {"user": "1/minute"}}
    app.config.update({"QUOTA_PLANS": plans, **config})
    quota = Quota(app, storage=MemoryStorage(FrozenClock()))

    @quota.identity_loader
    def who() -> Identity:
        return Identity("alice-secret-id", plan="pro")

    @app.get("/items")
    def items() -> str:
        return "ok"

    return app.test_client(), quota


def test_the_span_says_allowed_then_denied_and_never_who(
    app: Flask, spans: tuple[trace.Tracer, InMemorySpanExporter]
) -> None:
    """With a recording span per request: ratelimit.outcome is allowed, then denied,
    with tier, policy, remaining and plan; no attribute holds the identity or the IP."""
    tracer, exporter = spans
    http, _ = traced_app(app)
    for _ in range(2):
        with tracer.start_as_current_span("request"):
            http.get("/items", environ_base={"REMOTE_ADDR": ADDRESS})
    first, second = (dict(s.attributes or {}) for s in exporter.get_finished_spans())
    assert first == {
        "ratelimit.outcome": "allowed",
        "ratelimit.tier": "user",
        "ratelimit.policy": "user",
        "ratelimit.remaining": 0,
        "ratelimit.plan": "pro",
    }
    assert second["ratelimit.outcome"] == "denied" and second["ratelimit.tier"] == "user"
    for attributes in (first, second):
        for value in attributes.values():
            assert "alice" not in str(value) and ADDRESS not in str(value)


def test_the_storage_failing_is_on_the_span(
    app: Flask, spans: tuple[trace.Tracer, InMemorySpanExporter]
) -> None:
    """Failing open, the span says fail_open (the request passed unchecked)."""
    tracer, exporter = spans
    app.config["QUOTA_PLANS"] = {"free": {}, "pro": {"user": "1/minute"}}
    app.config.update(QUOTA_STORAGE_URL="redis://127.0.0.1:1/0", QUOTA_STORAGE_TIMEOUT=0.05)
    quota = Quota(app)
    quota.identity_loader(lambda: Identity("alice", plan="pro"))
    app.add_url_rule("/items", "items", lambda: "ok")
    with tracer.start_as_current_span("request"):
        assert app.test_client().get("/items").status_code == 200
    (span,) = exporter.get_finished_spans()
    assert (span.attributes or {})["ratelimit.outcome"] == "fail_open"


def test_without_a_recording_span_the_decision_is_not_even_built(app: Flask) -> None:
    """No SDK span records: the observer is asked once whether it watches, and nothing
    more happens for it (no Decision is made for an allowed request)."""
    http, _ = traced_app(app)
    observer = app.extensions["quota"].enforcer.observer
    assert isinstance(observer, SpanObserver)
    told: list[Any] = []
    observer.decided = lambda *args, **kwargs: told.append(args)  # type: ignore[method-assign]
    assert http.get("/items").status_code == 200
    assert not trace.get_current_span().is_recording() and told == []


def test_without_the_package_there_is_no_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    """opentelemetry-api absent (the `otel` extra not installed): no observer at all."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    assert span_observer() is None
