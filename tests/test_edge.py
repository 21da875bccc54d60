"""The request edge: one attribute on ``g``, and every way of deciding (a view's limits,
``quota.limited``, the status view) reaching the metrics and ``QUOTA_BLOCK_AFTER`` the
same way (``Enforcer.conclude``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, Response, g

from flask_quota import Identity, Quota, QuotaExceeded
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.prom import Scrape


def edge_app(app: Flask, **config: Any) -> Quota:
    app.config.update(
        QUOTA_PLANS={"free": {"user": "100/minute"}}, QUOTA_DATABASE_URL="sqlite://", **config
    )
    quota = Quota(app, storage=MemoryStorage(FrozenClock()))

    @quota.identity_loader
    def caller() -> Identity:
        return Identity("alice", "free")

    @app.get("/twice")
    @quota.limit("2/minute")
    def twice() -> str:
        return "ok"

    @app.get("/leased")
    @quota.limit(concurrent=1)
    def leased() -> Response:
        return Response(iter(["in flight"]))

    @app.get("/sms")
    def sms() -> str:
        with quota.limited("1/minute", resource="send_sms", key="+15550100"):
            return "sent"

    return quota


def test_g_holds_one_flask_quota_attribute(app: Flask) -> None:
    """Found in review: six ad-hoc attributes (``_quota``, ``_quota_denial``, ...). After
    an admitted, a denied and a leased request, ``g`` holds at most one of ours."""
    edge_app(app)
    seen: list[list[str]] = []

    @app.teardown_request
    def snapshot(error: BaseException | None) -> None:
        seen.append([name for name in vars(g) if "quota" in name])

    client = app.test_client()
    assert client.get("/twice").status_code == 200
    client.get("/twice")
    assert client.get("/twice").status_code == 429
    with client.get("/leased") as leased:
        assert leased.status_code == 200
    assert len(seen) == 4
    assert all(len(names) <= 1 for names in seen), seen
    assert {name for names in seen for name in names} == {"_flask_quota"}


@pytest.fixture
def scraped(app: Flask) -> Iterator[Any]:
    yield lambda: Scrape.parse(app.test_client().get("/metrics").get_data(as_text=True))


def test_quota_limited_denials_reach_the_metrics_and_block_after(app: Flask, scraped: Any) -> None:
    """Found in review: ``quota.limited`` never reached the observer (no metrics, no
    spans) and never counted towards ``QUOTA_BLOCK_AFTER``. Now it decides through the
    enforcer's tail, as a view's limit does: its denials are counted, and a caller
    denied by it often enough is blocked everywhere."""
    pytest.importorskip("prometheus_client")
    edge_app(app, QUOTA_METRICS_URL="/metrics", QUOTA_BLOCK_AFTER="2/minute")
    client = app.test_client()
    statuses = [client.get("/sms").status_code for _ in range(4)]
    assert statuses[:2] == [200, 429]
    blocked = client.get("/twice")  # another route: the caller is blocked
    assert blocked.status_code == 429 and blocked.get_json()["tier"] == "blocked"
    scrape = scraped()
    assert scrape.decisions(tier="endpoint", resource="send_sms", outcome="denied") >= 2
    assert scrape.decisions(tier="endpoint", resource="send_sms", outcome="allowed") == 1


def test_quota_limited_outside_a_request_blocks_nobody(app: Flask) -> None:
    """Outside a request there is no caller to block: denials only raise."""
    quota = edge_app(app, QUOTA_BLOCK_AFTER="1/minute")
    with app.app_context():
        for _ in range(3):
            try:
                with quota.limited("1/minute", resource="job", key="nightly"):
                    pass
            except QuotaExceeded as exc:
                assert exc.tier == "endpoint"
