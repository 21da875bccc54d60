"""Waiting instead of refusing: ``quota.limited(..., wait=)`` and ``@quota.limit(...,
delay=)``. A caller who may wait reserves its room in the storage in one call and
sleeps until its time; the reservation algorithms themselves are
``tests/test_reservations.py``'s."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from flask_quota import Quota, QuotaExceeded
from flask_quota.core.waiting import MAX_DELAY
from tests.load import hammer, serve_many
from tests.servers import ROOT, RedisServer

DELAYED = "X-RateLimit-Delayed"
SERVED = "X-Served-At"  # tests.apps.many: when the worker answered


# A loaded test machine can take over the default 0.1 s to answer, and the default fail
# mode then admits without asking: these tests count admissions, so a slow answer is
# waited for, and a failed one refused, never admitted unasked.
PATIENT = {"QUOTA_STORAGE_TIMEOUT": 5, "QUOTA_FAIL_MODE": "closed"}


def _app(url: str, **config: Any) -> tuple[Flask, Quota]:
    app = Flask(__name__)
    app.config.update(QUOTA_STORAGE_URL=url, **{**PATIENT, **config})
    return app, Quota(app)


@pytest.fixture(params=["memory", "redis"])
def storage_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    request.getfixturevalue("redis_client").flushall()
    yield server.url


# -- delay= -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm", ["token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter"]
)
def test_delay_holds_what_fits_and_refuses_the_rest_at_once(
    storage_url: str, algorithm: str
) -> None:
    """On every algorithm: a burst past ``4/second`` with ``delay=1`` (a second's room)
    admits what the limit has now, holds the callers whose room comes within the delay
    (counted once each: the bucket is then empty) and answers the rest 429 at once."""
    app, quota = _app(storage_url, QUOTA_ALGORITHM=algorithm)

    @app.get("/x")
    @quota.limit("4/second", delay=1)
    def x() -> str:
        return "ok"

    client = app.test_client()
    started = time.monotonic()
    asked: list[float] = []  # when each request left (wall clock: the windows' own)

    def get(_: int) -> tuple[Any, float]:
        asked.append(time.time())
        return client.get("/x"), time.monotonic()

    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(get, range(12)))
    statuses = Counter(r.status_code for r, _ in replies)
    held = [(r, at - started) for r, at in replies if r.status_code == 200 and DELAYED in r.headers]
    quick = [r for r, _ in replies if r.status_code == 200 and DELAYED not in r.headers]
    refused = [at - started for r, at in replies if r.status_code == 429]
    assert set(statuses) == {200, 429}, statuses
    # What the limit had, then what a second of refill gives, plus what it refilled while
    # the burst arrived (a good part of a second on a loaded machine). A window algorithm
    # refills all at once: a burst that straddles a window's end had two windows' room
    # at once, and then the one after is held (CI: 4 at once, 4 held to the boundary
    # 0.05 s later and 3 more to the next).
    refill = int((max(asked) - min(asked)) * 4) + 1
    if algorithm in ("fixed_window", "sliding_window_counter"):
        straddled = int(max(asked) + 0.01) - int(min(asked) - 0.01)  # window ends crossed
        refill = max(refill, 4 * straddled)
    assert 4 <= len(quick) <= 4 + refill, statuses
    assert len(quick) + len(held) <= 8 + refill, statuses
    # A sliding counter's room may come later than a second: its estimate still weighs
    # this window's count then; every other algorithm has room within the second.
    assert held or algorithm == "sliding_window_counter", statuses
    for reply, took in held:
        waited = float(reply.headers[DELAYED])
        assert 0 < waited <= 1.0
        assert took >= waited - 0.02  # it was held that long
    assert max(refused) < 0.9  # refused at once, never after waiting


def test_delay_past_its_bound_is_a_429_and_never_a_wait(storage_url: str) -> None:
    """A request whose room lies past ``delay`` is refused at once with its Retry-After."""
    app, quota = _app(storage_url)

    @app.get("/x")
    @quota.limit("1/minute", delay=3)
    def x() -> str:
        return "ok"

    client = app.test_client()
    assert client.get("/x").status_code == 200
    started = time.monotonic()
    denied = client.get("/x")
    assert denied.status_code == 429
    # Refused at once; a wrongful wait would hold it the delay's 3 s (the margin is wide
    # because a loaded test machine takes a good part of a second over one request).
    assert time.monotonic() - started < 2.0
    assert int(denied.headers["Retry-After"]) >= 59
    assert DELAYED not in denied.headers


@pytest.mark.parametrize(
    ("delay", "error"),
    [(-1, ValueError), (MAX_DELAY + 0.1, ValueError), ("1", TypeError), (float("nan"), TypeError),
     (True, TypeError)],
)  # fmt: skip
def test_a_bad_delay_is_refused_when_the_limit_is_made(delay: Any, error: type) -> None:
    _, quota = _app("memory://")
    with pytest.raises(error, match="delay="):
        quota.limit("1/second", delay=delay)
    with pytest.raises(ValueError, match="concurrent= alone"):
        quota.limit(concurrent=2, delay=1)
    with pytest.raises(TypeError, match="wait="):
        quota.limited("1/second", key="k", wait="soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait="):
        quota.limited("1/second", key="k", wait=-1)


def test_a_delayed_request_is_counted_in_the_metrics(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    app, quota = _app(redis_server.url, QUOTA_METRICS_URL="/metrics")

    @app.get("/x")
    @quota.limit("1/second", resource="pace", delay=2)
    def x() -> str:
        return "ok"

    client = app.test_client()
    redis_client.flushall()
    assert DELAYED not in client.get("/x").headers
    held = client.get("/x")
    assert held.status_code == 200
    assert 0.5 < float(held.headers[DELAYED]) <= 1.0
    text = client.get("/metrics").get_data(as_text=True)
    assert 'flask_quota_wait_seconds_count{kind="delay",resource="pace"} 1.0' in text


def test_a_renamed_delay_header() -> None:
    app, quota = _app("memory://", QUOTA_HEADER_NAMES={DELAYED: "X-Held"})

    @app.get("/x")
    @quota.limit("1/second", delay=1)
    def x() -> str:
        return "ok"

    client = app.test_client()
    client.get("/x")
    held = client.get("/x")
    assert "X-Held" in held.headers
    assert DELAYED not in held.headers


@pytest.mark.slow
@pytest.mark.redis
def test_a_burst_on_gunicorn_waits_at_most_the_delay(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """The issue's case, on gunicorn's threaded workers and one Redis: ``10/second``
    with ``delay=0.5``, a burst of 20 at once admits the 10 in the bucket at once, about
    5 more after at most 0.5 s plus scheduling noise, and refuses the rest at once."""
    plans = {"free": {"global": "100000/minute", "user": "100000/minute"}}
    server = serve_many(
        tmp_path, plans, workers=2, threads=10, QUOTA_STORAGE_URL=own_redis.url,
        **{key: str(value) for key, value in PATIENT.items()},
    )  # fmt: skip
    try:
        redis.Redis.from_url(own_redis.url).flushall()
        started = time.monotonic()
        replies = hammer(server.port, [("/delayed", {}, "")] * 20, clients=20)
        spread = time.monotonic() - started
    finally:
        server.stop()
    statuses = Counter(r.status for r in replies)
    held = [r for r in replies if r.status == 200 and DELAYED in r.headers]
    quick = [r for r in replies if r.status == 200 and DELAYED not in r.headers]
    refused = [r for r in replies if r.status == 429]
    print(
        f"burst of 20: {dict(statuses)}, {len(quick)} at once, {len(held)} held "
        f"{sorted(float(r.headers[DELAYED]) for r in held)}, in {spread:.2f} s"
    )
    assert set(statuses) <= {200, 429}, statuses
    # The bucket's 10 at once, then what it refills, 10 a second, for the 0.5 s a request
    # may wait, plus what it refills between the first send and the last decision: a
    # loaded machine decides the burst over a good part of a second, not as it was sent
    # (CI once decided it over 0.24 s and admitted 10 + 7). A decision's time is the
    # worker's answer less the delay it held.
    decided = [float(r.headers[SERVED]) - float(r.headers.get(DELAYED, 0)) for r in replies]
    late = max(decided) - min(r.sent for r in replies)
    refill = int(late * 10) + 1
    assert 10 <= len(quick) <= 10 + refill, (statuses, late)
    assert len(held) >= 3 and len(quick) + len(held) <= 15 + refill, (statuses, late)
    for reply in held:
        assert 0 < float(reply.headers[DELAYED]) <= 0.5
        assert reply.elapsed < 0.5 + 0.5  # held its delay, plus scheduling noise
    assert len(quick) + len(held) + len(refused) == 20
    # Never a wait past the delay: answered within 0.5 s of being sent.
    assert max(float(r.headers[SERVED]) - r.sent for r in refused) < 0.5


# -- wait= ------------------------------------------------------------------------


def test_wait_outside_a_request_sleeps_until_its_turn(storage_url: str) -> None:
    """Inside ``app.app_context()`` (a task): the bucket's room is used at once; a caller
    whose turn lies past its ``wait`` raises at once, taking nothing; one whose turn is
    within it sleeps until then."""
    app, quota = _app(storage_url)
    # Slow turns (one every 2 s) keep every bound a second clear of a loaded machine's
    # noise: a wrongful wait, or a refusal that took the turn, is off by whole seconds.
    limit = quota.limited("2/4seconds", key="sms", wait=3)
    short = quota.limited("2/4seconds", key="sms", wait=1)
    times: list[float] = []
    started = time.monotonic()
    with app.app_context():
        for _ in range(2):
            with limit:
                times.append(time.monotonic() - started)
        with pytest.raises(QuotaExceeded), short:  # the next room is 2 s away
            pytest.fail("entered past its wait")
        assert time.monotonic() - started < 0.9  # at once, not after its 1 s wait
        with limit:  # the same room, untouched by the refusal
            times.append(time.monotonic() - started)
    assert times[0] < 0.9 and times[1] < 0.9  # the bucket's room, without a wait
    assert 1.9 <= times[2] < 3.0, times  # the next turn; had the refusal taken it, 4 s


def test_wait_as_a_decorator_waits_each_call_its_turn(storage_url: str) -> None:
    """``@quota.limited(..., wait=)`` on a task's function: each call takes the bucket's
    room or sleeps until its turn, as the context manager does; one whose turn lies past
    its wait raises at once."""
    app, quota = _app(storage_url)
    started = time.monotonic()
    times: list[float] = []

    @quota.limited("2/second", key="deco", wait=0.8)
    def send() -> None:
        times.append(time.monotonic() - started)

    @quota.limited("2/second", key="deco", wait=0.1)
    def hurried() -> None:
        pytest.fail("entered past its wait")

    with app.app_context():
        for _ in range(3):
            send()
        with pytest.raises(QuotaExceeded):  # the next turn is half a second away
            hurried()
    assert len(times) == 3
    assert times[2] - times[0] >= 0.3, times  # the third waited for the refill (0.5 s)


def test_a_cancelled_wait_takes_nothing(storage_url: str) -> None:
    """A waiter interrupted while it sleeps (here by a signal, as a task's time limit
    does) gives its reservation back: the next waiter gets the same turn, not the one
    after it."""
    app, quota = _app(storage_url)
    limit = quota.limited("1/2seconds", key="cancel", wait=5)

    class Stop(Exception):
        pass

    def stop(*_: Any) -> None:
        raise Stop

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        with app.app_context():
            with limit:
                pass  # the bucket's one unit
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            started = time.monotonic()
            # Reserved for about 2 s from now, interrupted at 0.2 s.
            with pytest.raises(Stop), limit:
                pytest.fail("an interrupted wait entered")
            with limit:
                waited = time.monotonic() - started
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # The same turn (about 2 s after the first), not the next one (about 4 s).
    assert 1.6 <= waited < 3.0, waited


def test_wait_inside_a_view_holds_the_request(storage_url: str) -> None:
    app, quota = _app(storage_url)

    @app.get("/send")
    def send() -> str:
        with quota.limited("1/second", resource="sms", key="provider", wait=2):
            return "sent"

    client = app.test_client()
    assert client.get("/send").status_code == 200
    started = time.monotonic()
    assert client.get("/send").status_code == 200
    assert 0.8 <= time.monotonic() - started < 1.5


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.redis
def test_processes_and_threads_share_an_outbound_quota(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """The issue's case: 4 processes x 5 threads make 150 calls of
    ``quota.limited("60/minute", key="openai", wait=30)`` on one Redis. The bucket's 60
    go at once; then the 20 callers queue (at most 20 s of waiting each, within the
    30 s), so every call is admitted, one a second, in about 90 s. No span of T seconds
    admits more than 60 + T; none raises; fewer than 3 Redis commands per admitted call
    (startup included); and among the calls that waited, the processes' admission
    counts differ by at most 50%."""
    client = redis.Redis.from_url(own_redis.url)
    client.flushall()
    client.config_resetstat()
    start = time.time() + 5  # every process is up and waits for this moment
    outs = [tmp_path / f"p{i}.json" for i in range(4)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.apps.outbound",
                own_redis.url,
                "150",
                "5",
                str(start),
                str(out),
            ],
            cwd=ROOT,
        )
        for out in outs
    ]
    for proc in procs:
        assert proc.wait(timeout=150) == 0
    stats = client.info("commandstats")
    # The calls' own: the decide script (FCALL, or EVALSHA where functions are refused)
    # and a refund. The rest is each process's background (the plans' sync, start-up).
    mine = ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")
    commands = sum(v["calls"] for k, v in stats.items() if k in mine)
    print({k[8:]: v["calls"] for k, v in stats.items()})
    records = [(i, r) for i, out in enumerate(outs) for r in json.loads(out.read_text())]
    assert len(records) == 150
    admitted = sorted(r["at"] for _, r in records if r["admitted"])
    refused = [r for _, r in records if not r["admitted"]]
    took = max(admitted) - min(admitted)
    print(
        f"admitted {len(admitted)}, refused {len(refused)}, the last {took:.2f} s after the first, "
        f"{commands} Redis commands ({commands / len(admitted):.2f} per admitted call)"
    )
    assert not refused, refused[:3]  # no wait here ever needs more than its 30 s
    assert len(admitted) == 150
    assert 89 <= took <= 90 + 3, took  # the 90 past the bucket, one a second
    # Every span from the first call: each admission's time here is when its thread woke,
    # at or after the storage's, so counting by it never counts more than the storage
    # admitted by then, and the bucket was untouched before the first call asked.
    first = min(r["asked"] for _, r in records)
    for j, at in enumerate(admitted):
        assert j + 1 <= 60 + (at - first), (j, at - first)
    # Spans between admissions past the bucket's 60 (one a second): their ends are wake-up
    # times, each a scheduling delay late on a loaded machine, so one unit of slack.
    for i in range(60, len(admitted)):
        for j in range(i + 1, len(admitted)):
            assert j - i + 1 <= 60 + (admitted[j] - admitted[i]) + 1, (i, j)
    assert commands / len(admitted) < 3
    waited = Counter(i for i, r in records if r["admitted"] and r["at"] - r["asked"] > 0.5)
    print(f"admitted after waiting, per process: {dict(sorted(waited.items()))}")
    assert len(waited) == 4 and max(waited.values()) <= 1.5 * min(waited.values()), waited


def test_waiters_of_threads_never_share_a_unit(storage_url: str) -> None:
    """Eight threads waiting on ``5/second`` at once: each is let in at its own time,
    at least 0.2 s (a unit) after the one before, none refused within its wait."""
    app, quota = _app(storage_url)
    limit = quota.limited("5/second", key="shared", wait=3)
    with app.app_context(), quota.limited("5/second", key="shared", cost=5):
        pass  # empties the bucket
    times: list[float] = []
    lock = threading.Lock()

    def call() -> None:
        with app.app_context(), limit, lock:
            times.append(time.monotonic())

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    times.sort()
    assert len(times) == 8
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.2 - 0.03, gaps  # a unit each, within the sleep's noise


def test_a_request_refused_by_another_limit_reserves_nothing(storage_url: str) -> None:
    """All-or-nothing holds for reservations: a request whose delay= limit would hold it
    but whose other limit refuses gets its 429 at once, and the turn it would have taken
    stays for the next caller."""
    app, quota = _app(storage_url)

    # A turn every two seconds: a refused request that had waited for its turn first
    # would take over a second even on a loaded machine (CI once took 0.45 s to refuse).
    @app.get("/a")
    @quota.limit("1/2seconds", resource="pace", delay=3)
    @quota.limit("1/minute", resource="other")
    def a() -> str:
        return "ok"

    @app.get("/b")
    @quota.limit("1/2seconds", resource="pace", delay=3)
    def b() -> str:
        return "ok"

    client = app.test_client()
    assert client.get("/a").status_code == 200
    started = time.monotonic()
    refused = client.get("/a")
    assert refused.status_code == 429
    assert DELAYED not in refused.headers
    assert time.monotonic() - started < 1.0
    held = client.get("/b")  # the turn one unit after the first: not two
    assert held.status_code == 200
    assert 0.5 < float(held.headers[DELAYED]) <= 2.0  # a turn taken by /a would be 4 s off
