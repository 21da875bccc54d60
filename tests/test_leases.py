"""Concurrency limits: ``concurrent=N`` and a plan's ``concurrent`` bound requests in flight.

A streamed response holds its lease until it is closed, so the Flask test client
can keep requests "in flight" for as long as a test needs: ``client.get(path)``
on a streaming view returns at once and its lease is held until ``.close()``.
The same scenarios run on memory, a real redis-server and a real valkey-server
(``tests/backends.py``) with one injected clock; Cluster and Sentinel run theirs
on real groups.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask, Response, request
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from flask_quota import Identity, Quota, signals
from flask_quota.core.leases import split
from flask_quota.core.plans import Plan, PlanCatalog
from flask_quota.core.rates import parse_rates
from flask_quota.core.tiers import Tier
from flask_quota.settings import Settings
from flask_quota.sql import inputs
from flask_quota.sql.errors import AdminError
from flask_quota.state import get_state
from flask_quota.storage import MemoryStorage, Storage
from flask_quota.storage.denycache import DenyCache
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock
from tests.backends import backend  # noqa: F401  (a fixture)
from tests.cluster import Cluster
from tests.prom import Scrape
from tests.servers import RedisServer

PLANS = {"free": {"user": "100/minute"}}


def lease_app(
    app: Flask, storage: Storage | None = None, **config: Any
) -> tuple[Quota, FlaskClient]:
    """``app`` with ``/slow`` (streamed, ``concurrent=2``), ``/fast`` (``concurrent=2``),
    ``/boom`` (raises, ``concurrent=2``) and ``/other`` (no limit of its own); the caller
    is named by the ``X-Who`` header (``alice`` when absent), its org by ``X-Org``."""
    app.config.update(QUOTA_PLANS=PLANS, QUOTA_DEFAULT_PLAN="free", QUOTA_ANONYMOUS_PLAN="free")
    app.config.setdefault("QUOTA_DATABASE_URL", f"sqlite:///{app.instance_path}/quota.sqlite3")
    app.config.update(config)
    quota = Quota(app, storage=storage)

    @quota.identity_loader
    def who() -> Identity:
        return Identity(request.headers.get("X-Who", "alice"), plan="free")

    @app.route("/slow")
    @quota.limit(concurrent=2)
    def slow() -> Response:
        return Response(iter(["working", "done"]))

    @app.route("/fast")
    @quota.limit(concurrent=2)
    def fast() -> str:
        return "ok"

    @app.route("/boom")
    @quota.limit(concurrent=2)
    def boom() -> str:
        raise RuntimeError("the view failed")

    @app.route("/org")
    @quota.limit(concurrent=1, key=lambda: request.headers["X-Org"])
    def org() -> Response:
        return Response(iter(["org work"]))

    @app.route("/other")
    def other() -> Response:
        return Response(iter(["other"]))

    return quota, app.test_client()


def held(client: FlaskClient, path: str = "/slow", who: str = "alice") -> TestResponse:
    """A streamed request left in flight: its lease is held until it is closed."""
    return client.get(path, headers={"X-Who": who})


def statuses(responses: list[TestResponse]) -> list[int]:
    return [r.status_code for r in responses]


def close_all(responses: list[TestResponse]) -> None:
    for response in responses:
        response.close()


def test_concurrent_must_be_an_int_of_at_least_one(app: Flask) -> None:
    """``concurrent=`` takes an int >= 1; anything else fails when the view is decorated."""
    quota = Quota(app, storage=MemoryStorage())
    for bad in (0, -1, True, "2", 1.5, 100_001, 10**8):
        with pytest.raises(ValueError, match="concurrent must be an int from 1 to 100,000"):
            quota.limit(concurrent=bad)  # type: ignore[arg-type]
    quota.limit(concurrent=1)  # alone: a valid limit, no rate and no resource needed
    quota.limit(concurrent=100_000)


def test_the_most_slots_a_plan_allows_still_decide_on_a_one_second_lease(app: Flask) -> None:
    """A plan's ``concurrent`` above 100,000 is refused at configuration; at 100,000 the
    lease decides even with ``QUOTA_LEASE_SECONDS = 1`` (before, 10**8 slots were
    accepted and every request of the plan answered 500)."""
    with pytest.raises(ValueError, match="concurrent"):
        bad = Flask("bad")
        bad.config.update(QUOTA_PLANS={"free": {"concurrent": 10**8}})
        Quota(bad, storage=MemoryStorage())
    app.config.update(QUOTA_PLANS={"free": {"concurrent": 100_000}}, QUOTA_LEASE_SECONDS=1)
    quota = Quota(app, storage=MemoryStorage())

    @app.get("/ok")
    def ok() -> str:
        return "ok"

    response = app.test_client().get("/ok")
    assert response.status_code == 200
    assert response.headers["X-Concurrency-Limit"] == "100000"
    with app.app_context():
        assert quota.peek("nobody")[0].tier == "concurrent"
    # The CLI's and the dashboard's reading of the bound refuses the same.
    with pytest.raises(AdminError, match="at most 100,000"):
        inputs.concurrency("100001")
    assert inputs.concurrency("100000") == 100_000


@pytest.mark.parametrize("bad", [0, -5, "soon", 1.5, 10**9])
def test_lease_seconds_is_checked_at_configuration(bad: object) -> None:
    """``QUOTA_LEASE_SECONDS`` is whole seconds from 1 to 366 days; the error names the key."""
    with pytest.raises(ValueError, match="QUOTA_LEASE_SECONDS"):
        Settings.from_config({"QUOTA_LEASE_SECONDS": bad})
    assert Settings.from_config({"QUOTA_LEASE_SECONDS": "3"}).lease_seconds == 3
    assert Settings.from_config({}).lease_seconds == 60


def test_two_in_flight_and_the_third_is_told_why(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """``concurrent=2``: two streams in flight, the third gets 429 ``"tier": "concurrent"``
    naming the resource, a detail, ``Retry-After: 1`` and the concurrency headers; the
    rate headers and ``RateLimit-Policy`` never describe the lease."""
    storage, _ = backend
    _, client = lease_app(app, storage)
    first, second = held(client), held(client)
    assert statuses([first, second]) == [200, 200]
    assert first.headers["X-Concurrency-Limit"] == "2"
    assert [
        first.headers["X-Concurrency-Remaining"],
        second.headers["X-Concurrency-Remaining"],
    ] == [
        "1",
        "0",
    ]
    third = held(client)
    assert third.status_code == 429
    body = third.get_json()
    assert body["tier"] == "concurrent"
    assert body["resource"] == "slow"
    assert body["limit"] == 2
    assert body["detail"].startswith("2 requests in flight at once on 'slow'")
    assert third.headers["Retry-After"] == "1"
    assert third.headers["X-Concurrency-Remaining"] == "0"
    assert "concurrent" not in third.headers["RateLimit-Policy"]
    assert third.headers["X-RateLimit-Resource"] == "user"
    # Another caller has slots of its own; another endpoint is not this limit.
    bob = held(client, who="bob")
    assert bob.status_code == 200
    assert held(client, "/other").status_code == 200
    close_all([first, second, third, bob])


def test_a_stream_holds_its_slot_until_it_is_closed(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """The slot comes back when the streamed response is closed, not when the view returns."""
    storage, _ = backend
    _, client = lease_app(app, storage)
    first, second = held(client), held(client)
    assert b"".join(first.iter_encoded()) == b"workingdone"  # the stream has run, still open
    assert held(client).status_code == 429
    first.close()
    again = held(client)
    assert again.status_code == 200
    first.close()  # closing twice gives nothing back twice
    assert held(client).status_code == 429
    close_all([second, again])


def test_a_response_that_is_not_streamed_gives_back_at_teardown(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """A view that returns its whole body holds no slot once the request is over (even
    when the test client never closes the response)."""
    storage, _ = backend
    _, client = lease_app(app, storage)
    assert [client.get("/fast").status_code for _ in range(5)] == [200] * 5


@pytest.mark.parametrize("propagate", [True, False])
def test_a_view_that_raises_gives_its_slot_back(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
    propagate: bool,
) -> None:
    """Raised into the test client (``PROPAGATE_EXCEPTIONS``: teardown gives it back) or
    answered 500 (closing that response does, as a server closes every response), a
    failed view's lease comes back."""
    storage, _ = backend
    _, client = lease_app(app, storage, PROPAGATE_EXCEPTIONS=propagate)
    for _ in range(3):
        if propagate:
            with pytest.raises(RuntimeError):
                client.get("/boom")
        else:
            with client.get("/boom") as failed:
                assert failed.status_code == 500
    assert client.get("/fast").status_code == 200
    first, second = held(client), held(client)
    assert statuses([first, second]) == [200, 200]
    close_all([first, second])


def test_a_plans_limit_spans_every_endpoint(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """A plan's ``concurrent`` counts the caller's requests on every endpoint together."""
    storage, _ = backend
    _, client = lease_app(app, storage)
    in_force(app, Plan("free", user_rate=parse_rates("100/minute"), concurrent=2))
    first, second = held(client, "/other"), held(client, "/slow")
    assert statuses([first, second]) == [200, 200]
    third = held(client, "/other")
    assert third.status_code == 429
    body = third.get_json()
    assert (body["tier"], body["resource"]) == ("concurrent", None)
    assert "across every endpoint" in body["detail"]
    assert held(client, "/other", who="bob").status_code == 200
    close_all([first, second, third])
    assert held(client, "/other").status_code == 200


def in_force(app: Flask, *plans: Plan) -> None:
    """Decide ``app``'s requests on ``plans`` alone (the SQL plumbing of a plan's
    ``concurrent`` is tested with the SQL plans)."""
    catalog = PlanCatalog(list(plans))
    app.extensions["quota"].enforcer.catalog = lambda: catalog


def test_the_429_offers_the_plan_that_allows_more_in_flight(app: Flask) -> None:
    """A plan's concurrency denial names the next plan with more slots; a limit's own
    ``concurrent=`` is every plan's, so it offers none (never a rate's upgrade)."""
    _, client = lease_app(app, MemoryStorage())
    rates = parse_rates("100/minute")
    in_force(
        app,
        Plan("free", user_rate=rates, resources={"slow": rates}, concurrent=1),
        Plan("pro", user_rate=rates, resources={"slow": parse_rates("900/minute")}, concurrent=8),
    )
    first = held(client, "/other")
    denied = held(client, "/other")
    assert denied.get_json()["upgrade"] == "Pro raises this to 8 in flight: see /pricing"
    first.close()
    streams = [held(client), held(client)]  # /slow: the plan's 1 slot is taken by the first
    assert streams[1].get_json()["tier"] == "concurrent"
    close_all(streams)
    in_force(
        app,
        Plan("free", user_rate=rates, resources={"slow": rates}),
        Plan("pro", user_rate=rates, resources={"slow": parse_rates("900/minute")}),
    )
    streams = [held(client) for _ in range(3)]
    assert streams[2].get_json()["resource"] == "slow"
    assert streams[2].get_json()["upgrade"] is None
    close_all([denied, *streams])


def test_a_lease_denial_charges_no_rate(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """All-or-nothing one way: a request refused its slot costs no unit of any rate."""
    storage, _ = backend
    _, client = lease_app(app, storage)
    first, second = held(client), held(client)
    assert second.headers["X-RateLimit-Remaining"] == "98"
    denied = [held(client) for _ in range(5)]
    assert set(statuses(denied)) == {429}
    close_all([first])
    after = held(client)
    assert after.headers["X-RateLimit-Remaining"] == "97"  # the five denials cost nothing
    close_all([second, after, *denied])


def test_a_rate_denial_takes_no_slot(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """All-or-nothing the other way: a request its rate refuses holds no slot."""
    storage, _ = backend
    quota, client = lease_app(app, storage, QUOTA_PLANS={"free": {"user": "2/minute"}})
    first, second = held(client), held(client)  # the two units of the minute
    second.close()
    denied = [held(client) for _ in range(3)]
    assert [(r.status_code, r.get_json()["tier"]) for r in denied] == [(429, "user")] * 3
    with app.app_context():
        leases = {b.name: b for b in quota.peek("alice")}["concurrent (slow)"]
    assert (leases.rate, leases.limit, leases.remaining) == ("2 in flight", 2, 1)
    close_all([first, *denied])


def test_an_unreleased_lease_expires_on_the_storage_clock(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """A lease nobody gave back (a killed worker) frees its slot ``QUOTA_LEASE_SECONDS``
    after admission, on the storage's clock, and not a microsecond sooner."""
    storage, clock = backend
    _, client = lease_app(app, storage, QUOTA_LEASE_SECONDS=30)
    lost = [held(client), held(client)]  # never closed: their worker "died"
    assert held(client).status_code == 429
    clock.advance(29.999999)
    assert held(client).status_code == 429
    clock.advance(0.000001)
    fresh = held(client)
    assert fresh.status_code == 200
    close_all([fresh, *lost])


def test_a_denial_says_when_a_slot_is_sure_to_be_free(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """From the newcomer: a concurrency 429 always says ``Retry-After: 1``. It still does
    (a holder may end any moment; the storage cannot tell a dead one from a slow one),
    and its body's ``reset`` now says when the oldest lease expires, the latest moment a
    slot is sure to be free, where it said now plus one second."""
    storage, clock = backend
    _, client = lease_app(app, storage, QUOTA_LEASE_SECONDS=30)
    lost = held(client)  # taken at t0: expires at t0 + 30
    clock.advance(10)
    other = held(client)  # expires at t0 + 40
    denied = held(client)
    body = denied.get_json()
    assert denied.status_code == 429 and body["tier"] == "concurrent"
    assert denied.headers["Retry-After"] == "1" and body["retry_after"] == 1
    assert body["reset"] == math.ceil(clock.seconds + 20)
    close_all([lost, other, denied])


def test_a_plans_upgrade_text_is_not_offered_for_a_concurrency_denial(app: Flask) -> None:
    """From the newcomer: a plan's ``upgrade`` text is about its rates ("Pro gives 8
    reports a month"): a concurrency 429 offered it too. It gets the next plan with more
    slots, or nothing."""
    _, client = lease_app(app, MemoryStorage())
    rates = parse_rates("100/minute")
    text = "Pro gives 8 reports a month: see /pricing"
    in_force(
        app,
        Plan("free", user_rate=rates, resources={"slow": rates}, concurrent=1, upgrade=text),
        Plan("pro", user_rate=rates, concurrent=8),
    )
    first = held(client, "/other")
    denied = held(client, "/other")
    assert denied.get_json()["upgrade"] == "Pro raises this to 8 in flight: see /pricing"
    first.close()
    in_force(app, Plan("free", user_rate=rates, upgrade=text), Plan("pro", user_rate=rates))
    streams = [held(client), held(client), held(client)]  # the limit's own concurrent=2
    assert streams[2].status_code == 429 and streams[2].get_json()["upgrade"] is None
    close_all([denied, *streams])


@pytest.mark.quiet
def test_a_lease_expires_on_the_redis_server_clock(app: Flask, redis_client: redis.Redis) -> None:
    """With no injected clock, Redis ``TIME`` decides: a lease never given back frees its
    slot ``QUOTA_LEASE_SECONDS`` (1 s) later, and its set carries a TTL meanwhile."""
    _, client = lease_app(app, RedisStorage(redis_client), QUOTA_LEASE_SECONDS=1)
    lost = [held(client), held(client)]  # never closed
    start = time.monotonic()
    assert 0 < redis_client.pttl("quota:{id=alice}:c:slow") <= 1000
    while (probe := held(client)).status_code == 429:
        assert time.monotonic() - start < 3, "the leases never expired"
        time.sleep(0.02)
    assert time.monotonic() - start > 0.5  # expired, not given back
    close_all([probe, *lost])


def test_a_key_owner_shares_one_set(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """With ``key=``, the callers of one owner share its slots; another owner has its own."""
    storage, _ = backend
    _, client = lease_app(app, storage)
    acme = client.get("/org", headers={"X-Who": "alice", "X-Org": "acme"})
    assert acme.status_code == 200
    assert client.get("/org", headers={"X-Who": "bob", "X-Org": "acme"}).status_code == 429
    globex = client.get("/org", headers={"X-Who": "bob", "X-Org": "globex"})
    assert globex.status_code == 200
    close_all([acme, globex])


def test_peek_shows_and_reset_frees_a_callers_slots(
    app: Flask,
    backend: tuple[Storage, FrozenClock],  # noqa: F811
) -> None:
    """``quota.peek`` lists each concurrency limit with the slots left; ``quota.reset``
    gives every slot back."""
    storage, _ = backend
    quota, client = lease_app(app, storage)
    first, second = held(client), held(client)
    with app.app_context():
        found = {b.name: b for b in quota.peek("alice")}
        assert (found["concurrent (slow)"].tier, found["concurrent (slow)"].remaining) == (
            "concurrent",
            0,
        )
        quota.reset("alice")
        assert {b.name: b for b in quota.peek("alice")}["concurrent (slow)"].remaining == 2
    again = [held(client), held(client)]
    assert statuses(again) == [200, 200]
    close_all([first, second, *again])


def test_routes_without_a_lease_take_none(app: Flask) -> None:
    """A route decides once whether it has a concurrency limit: one without sends no
    lease check and no concurrency header."""
    storage = MemoryStorage()
    _, client = lease_app(app, storage)
    response = client.get("/other")
    assert "X-Concurrency-Limit" not in response.headers
    state = app.extensions["quota"]
    route = next(iter(state.enforcer.routes.current.values()))
    assert route.leases == ()
    assert not any(k.split(":")[-1].startswith("c") for k in storage._data)
    response.close()


def test_the_teardown_hook_joins_at_the_first_lease_in_its_place(app: Flask) -> None:
    """Until a request holds a lease the app has no teardown hook of ours (no request
    pays Flask's dispatch of it); the first lease adds it where ``init_app`` would have
    registered it, between the app's teardown functions registered before and after."""
    ran: list[str] = []
    app.teardown_request(lambda error: ran.append("before init_app"))
    _, client = lease_app(app, MemoryStorage())
    app.teardown_request(lambda error: ran.append("after init_app"))
    assert len(app.teardown_request_funcs[None]) == 2
    client.get("/other").close()
    assert len(app.teardown_request_funcs[None]) == 2
    ran.clear()
    assert client.get("/fast").status_code == 200
    funcs = app.teardown_request_funcs[None]
    assert len(funcs) == 3 and funcs[1].__name__ == "release_at_teardown"
    assert ran == ["after init_app", "before init_app"]  # Flask runs them in reverse
    # Our hook ran for that first request too: each slot comes back at its teardown.
    assert [client.get("/fast").status_code for _ in range(3)] == [200] * 3
    assert len(app.teardown_request_funcs[None]) == 3  # added once


def test_signals_metrics_and_usage_count_a_concurrency_denial(app: Flask) -> None:
    """``quota_exceeded`` hears the denial (tier ``concurrent``); the metrics count it as
    ``denied`` on tier ``concurrent`` and the admitted ones as ``allowed``; the
    dashboard's usage records it under the limit's name; ``str(decision)`` says it."""
    _, client = lease_app(app, MemoryStorage(), QUOTA_METRICS_URL="/metrics")
    heard: list[Any] = []

    def receiver(sender: Flask, decision: Any, **_: Any) -> None:
        heard.append(decision)

    signals.quota_exceeded.connect(receiver)
    try:
        responses = [held(client) for _ in range(3)]
    finally:
        signals.quota_exceeded.disconnect(receiver)
    assert statuses(responses) == [200, 200, 429]
    assert [d.denied.tier for d in heard] == [Tier.CONCURRENT]
    assert str(heard[0]).startswith("denied by concurrent 'concurrent (slow)': 2 in flight")
    assert heard[0].usage_outcomes() == [("concurrent (slow)", False)]
    scraped = Scrape.parse(client.get("/metrics").get_data(as_text=True))
    total = "flask_quota_decisions_total"
    assert scraped.value(total, tier="concurrent", outcome="denied") == 1
    assert scraped.value(total, tier="concurrent", outcome="allowed") == 2
    close_all(responses)


# -- the deny cache and the fail modes -------------------------------------------------


def test_a_lease_denial_is_never_cached(app: Flask, redis_client: redis.Redis) -> None:
    """The deny cache remembers rate denials only: a slot frees the moment a request ends."""
    storage = DenyCache(RedisStorage(redis_client))
    _, client = lease_app(app, storage)
    first, second = held(client), held(client)
    assert held(client).status_code == 429
    first.close()
    third = held(client)
    assert third.status_code == 200
    assert len(storage) == 0
    close_all([second, third])


def test_a_lease_goes_back_in_one_zrem(app: Flask, redis_client: redis.Redis) -> None:
    """The give-back after the response is the set's ``ZREM`` of the request's member,
    a plain command: not the refund script, whose body (every algorithm's undo, the
    server clock) cost more Redis work than the request's whole decision."""
    _, client = lease_app(app, RedisStorage(redis_client))
    assert client.get("/fast").status_code == 200  # the first loads the library
    redis_client.config_resetstat()
    for _ in range(3):
        assert client.get("/fast").status_code == 200
    stats: dict[str, Any] = redis_client.info("commandstats")
    assert stats["cmdstat_zrem"]["calls"] == 3
    assert "cmdstat_evalsha" not in stats
    assert redis_client.zcard("quota:{id=alice}:c:fast") == 0  # every slot given back


DEAD = "redis://127.0.0.1:1/0"  # nothing listens there: every call fails at once


def test_failing_open_admits_without_a_lease(app: Flask) -> None:
    """``open``: the storage cannot take the lease, so no limit applies (and none is held)."""
    _, client = lease_app(app, None, QUOTA_STORAGE_URL=DEAD, QUOTA_FAIL_MODE="open")
    responses = [held(client) for _ in range(4)]
    assert statuses(responses) == [200] * 4
    assert "X-Concurrency-Limit" not in responses[0].headers
    close_all(responses)


def test_failing_closed_refuses(app: Flask) -> None:
    """``closed``: no lease can be taken, so the request is refused with 503."""
    _, client = lease_app(app, None, QUOTA_STORAGE_URL=DEAD, QUOTA_FAIL_MODE="closed")
    assert client.get("/slow").status_code == 503


def test_failing_local_takes_and_gives_back_in_the_fallback(app: Flask) -> None:
    """``local``: the in-process fallback decides the lease and gets it back."""
    _, client = lease_app(
        app, None, QUOTA_STORAGE_URL=DEAD, QUOTA_FAIL_MODE="local", QUOTA_STORAGE_TIMEOUT=0.1
    )
    guard = app.extensions["quota"].guard
    while not guard.degraded:  # a failed call is only checked locally until the breaker opens
        client.get("/fast")
    probe, second = held(client), held(client)
    assert probe.headers["X-Concurrency-Remaining"] == "1"
    assert second.headers["X-Concurrency-Remaining"] == "0"
    assert held(client).status_code == 429
    probe.close()
    assert held(client).status_code == 200
    fallback = guard.fallback
    assert fallback is not None and any(" " not in k and ":c:" in k for k in fallback._data)
    close_all([second])


def test_a_release_the_storage_cannot_take_is_logged_and_does_not_fail(
    app: Flask, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A give-back while the storage is down does not fail the response: it is logged
    and kept to be sent again once the storage answers."""
    _, client = lease_app(
        app,
        None,
        QUOTA_STORAGE_URL=own_redis.url,
        QUOTA_STORAGE_TIMEOUT=0.2,
        QUOTA_FAIL_MODE="open",
    )
    response = held(client)
    assert response.status_code == 200
    own_redis.stop()
    with caplog.at_level(logging.WARNING, logger="flask_quota"):
        response.close()
    assert "lease release failed" in caplog.text


def admitted_again_after(client: FlaskClient, path: str, seconds: float) -> float | None:
    """Seconds until ``path`` is answered 200 again (sequential requests, 50 ms apart),
    None if not within ``seconds``."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        response = client.get(path)
        response.close()
        if response.status_code == 200:
            return time.monotonic() - started
        time.sleep(0.05)
    return None


@pytest.mark.redis
def test_a_lease_taken_by_a_call_that_timed_out_comes_back(
    app: Flask, own_redis: RedisServer
) -> None:
    """Found in review: Redis stalled 300 ms during one request on a ``concurrent=1`` route.
    The decide call timed out and failed open; Redis ran it on resume, so a lease was
    held that no request knew of, and the next 78 requests over 19.7 s got 429
    "concurrent" until it expired. A call that failed may have taken its leases: they
    are given back once the storage answers (and again a few times, since the call may
    run after the first give-back), so the route admits again within 3 s."""
    _, client = lease_app(
        app, None, QUOTA_STORAGE_URL=own_redis.url, QUOTA_STORAGE_TIMEOUT=0.1,
        QUOTA_LEASE_SECONDS=30,
    )  # fmt: skip
    warm = client.get("/org", headers={"X-Org": "acme"})
    assert warm.status_code == 200
    warm.close()  # its slot back: the one slot is free
    own_redis.stall(0.3)
    stalled = client.get("/org", headers={"X-Org": "acme"})
    assert stalled.status_code == 200  # failed open after 0.1 s
    stalled.close()
    time.sleep(0.3)  # Redis resumes, and runs the stalled call: a lease nobody holds
    client.environ_base["HTTP_X_ORG"] = "acme"
    waited = admitted_again_after(client, "/org", 5)
    assert waited is not None and waited < 3, waited


@pytest.mark.redis
def test_a_give_back_while_the_breaker_is_open_is_sent_once_it_closes(
    app: Flask, own_redis: RedisServer
) -> None:
    """Found in review: a stream's lease given back while the breaker was open was
    dropped, though Redis would have taken it once it answered: the route refused
    until the lease expired (451 wrong 429s in 4.5 s in one run). It is kept and
    sent once the storage answers again."""
    _, client = lease_app(
        app, None, QUOTA_STORAGE_URL=own_redis.url, QUOTA_STORAGE_TIMEOUT=0.1,
        QUOTA_LEASE_SECONDS=30, QUOTA_BREAKER_COOLDOWN=0.2,
    )  # fmt: skip
    stream = client.get("/org", headers={"X-Org": "acme"})
    assert stream.status_code == 200  # the one slot, held while the stream is open
    own_redis.pause(1500)
    for _ in range(5):  # five timeouts open the breaker (fail open: admitted, unleased)
        client.get("/other").close()
    assert get_state(app).guard.degraded
    stream.close()  # its give-back meets the open breaker
    time.sleep(1.5)  # Redis answers again
    client.environ_base["HTTP_X_ORG"] = "acme"
    waited = admitted_again_after(client, "/org", 5)
    assert waited is not None and waited < 3, waited


# -- Cluster and Sentinel ---------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.slow
def test_cluster_a_global_denial_frees_the_slot(tmp_path: Path, cluster: Cluster) -> None:
    """Global tier 1/minute per IP (another slot than alice's): the second request is
    denied by it, and alice's lease set is empty afterwards (the refund gave it back)."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    prefix = f"lease{time.monotonic_ns()}"
    _, client = lease_app(
        app,
        None,
        QUOTA_STORAGE_URL=cluster.url,
        QUOTA_KEY_PREFIX=prefix,
        QUOTA_DENY_CACHE=False,
        QUOTA_FAIL_MODE="closed",
        QUOTA_PLANS={"free": {"global": "1/minute", "user": "100/minute"}},
    )
    first = held(client)
    first.close()
    denied = held(client)
    assert denied.status_code == 429 and denied.get_json()["tier"] == "global"
    raw = cluster.client()
    key = f"{prefix}:{{id=alice}}:c:slow"
    assert raw.zcard(key) == 0
    denied.close()


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory, server_kind: str) -> Iterator[Any]:
    from tests.conftest import need_server
    from tests.sentinel import SentinelGroup

    need_server(server_kind)
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel"), kind=server_kind)
    yield group
    group.stop()


@pytest.mark.redis
@pytest.mark.slow
def test_sentinel_holds_and_frees_slots(app: Flask, sentinels: Any) -> None:
    """Through Sentinel (the Redis backend on the master it names): two in flight, the
    third refused, one closed and a slot is free again."""
    _, client = lease_app(
        app,
        None,
        QUOTA_STORAGE_URL=sentinels.url,
        QUOTA_STORAGE_TIMEOUT=1,
        QUOTA_FAIL_MODE="closed",
    )
    first, second = held(client), held(client)
    assert statuses([first, second, held(client)]) == [200, 200, 429]
    first.close()
    third = held(client)
    assert third.status_code == 200
    close_all([second, third])


def test_split_reads_back_what_the_route_writes() -> None:
    """A lease key is its set and its member, split at the one space."""
    assert split("quota:{id=a%20b}:c:slow 0123abcd") == ("quota:{id=a%20b}:c:slow", "0123abcd")
    assert split("quota:{id=a}:c ") == ("quota:{id=a}:c", "")
