"""Webhooks (SPEC 9.2): the outbox, its signed POSTs, retries, claims and the CLI.

Every test posts to a real HTTP receiver (``Receiver``: a ThreadingHTTPServer on a port
of its own that records what arrives, and can answer 500, hang, or be killed and started
again on the same port) from a real outbox on SQLite, and on PostgreSQL and MariaDB when
tests/sqldb.py has them. Time is the sender's injected clock wherever it matters.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import Engine
from werkzeug.serving import make_server

from flask_quota import Quota
from flask_quota import webhooks as wh
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.engine import own_engine
from flask_quota.sql.errors import AdminError
from flask_quota.sql.models import Model
from flask_quota.testing import FrozenClock
from tests.servers import free_port
from tests.sqldb import sql_store

SECRET = "whsec-test-0123456789abcdef"
# How long (sender clock seconds) the receiver is down in the outage test: a minute, as
# an operator restarting it would take; the wall-clock outage lasts a second or two.
OUTAGE = 60.0


# -- a real receiver ----------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One POST as the receiver saw it."""

    headers: dict[str, str]
    body: bytes
    at: float  # the receiver's ``clock`` when it arrived

    @property
    def id(self) -> str:
        return str(json.loads(self.body)["id"])


class Receiver:
    """An HTTP server on a fixed port that records every POST and answers ``status``
    (or the next of ``statuses``); ``hang`` holds each request until released; ``hold``
    delays each answer; ``kill`` and ``start`` take it down and up on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks/quota?token=abc"
        self.received: list[Received] = []
        self.statuses: list[int] = []
        self.status = 200
        self.hold = 0.0
        self.hang = False
        self.released = threading.Event()
        self.in_flight: dict[str, int] = {}
        self.most_at_once = 0  # the most POSTs of one event id in flight at once
        self.paths: list[str] = []
        self.clock: Callable[[], float] = time.time  # stamps what arrives
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.start()

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                event_id = str(json.loads(body)["id"])
                with receiver._lock:
                    receiver.received.append(
                        Received(dict(self.headers.items()), body, receiver.clock())
                    )
                    receiver.paths.append(self.path)
                    receiver.in_flight[event_id] = receiver.in_flight.get(event_id, 0) + 1
                    receiver.most_at_once = max(receiver.most_at_once, receiver.in_flight[event_id])
                    status = receiver.statuses.pop(0) if receiver.statuses else receiver.status
                try:
                    if receiver.hang:
                        receiver.released.wait(30)
                    time.sleep(receiver.hold)
                finally:
                    with receiver._lock:
                        receiver.in_flight[event_id] -= 1
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        self._server = server

    def kill(self) -> None:
        """Stop listening: connections are refused until ``start``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def ids(self) -> list[str]:
        with self._lock:
            return [r.id for r in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.released.set()
    server.kill()


# -- an outbox ----------------------------------------------------------------


def _outbox(url: str) -> Engine:
    engine = own_engine(url)
    Model.metadata.create_all(engine)
    return engine


@pytest.fixture
def outbox(database_url: str) -> Iterator[Engine]:
    """The quota tables on each database of tests/sqldb.py (webhook events among them)."""
    engine = _outbox(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_outbox(tmp_path: Path) -> Iterator[Engine]:
    """The quota tables on a SQLite file, for what no database changes."""
    engine = _outbox(f"sqlite:///{tmp_path / 'outbox.sqlite3'}")
    yield engine
    engine.dispose()


def add(engine: Engine, now: float, type: str = "quota.alert", **data: Any) -> wh.Event:
    """Enqueue one event created at ``now`` (Unix seconds), committed."""
    event = wh.new_event(type, {"client": "acme", **data}, datetime.fromtimestamp(now, UTC))
    with engine.begin() as conn:
        wh.enqueue(conn, [event])
    return event


def sender(
    engine: Engine, url: str, clock: Callable[[], float], **options: Any
) -> wh.WebhookSender:
    return wh.WebhookSender(lambda: engine, url, SECRET, clock=clock, **options)


class Ceiling(random.Random):
    """Jitter that always draws the top: ``backoff`` waits exactly its ceiling."""

    def random(self) -> float:
        return 1.0


def until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# -- the message --------------------------------------------------------------


def test_the_body_is_compact_stable_json_with_created_in_utc() -> None:
    """``body_of`` gives id, type, created (ISO 8601, UTC, ``Z``) and data, in that order,
    without spaces and with data's keys sorted; ``new_event`` makes an ``evt_`` id and
    refuses an unknown type, a naive time and data that is not JSON."""
    now = datetime(2026, 12, 3, 23, 30, 5, 123456, tzinfo=UTC)
    event = wh.new_event("credits.low", {"units": 5, "client": "acme"}, now)
    assert event.id.startswith("evt_") and len(event.id) == 36
    assert event.created == datetime(2026, 12, 3, 23, 30, 5, tzinfo=UTC)
    assert (
        wh.body_of(event)
        == (
            f'{{"id":"{event.id}","type":"credits.low","created":"2026-12-03T23:30:05Z",'
            '"data":{"client":"acme","units":5}}'
        ).encode()
    )
    assert wh.new_event("credits.low", {}, now).id != event.id
    with pytest.raises(ValueError, match="unknown webhook event type"):
        wh.new_event("quota.bogus", {}, now)
    with pytest.raises(ValueError, match="timezone-aware"):
        wh.new_event("quota.alert", {}, datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="must be JSON"):
        wh.new_event("quota.alert", {"when": now}, now)


def test_verify_accepts_its_signature_and_refuses_tampering_age_and_garbage() -> None:
    """``verify`` is True for ``sign``'s header within the tolerance, and False for
    another body, another secret, a timestamp too old or too new, and malformed headers."""
    body = b'{"id":"evt_1"}'
    header = wh.sign(SECRET, 1_800_000_000, body)
    assert header.startswith("t=1800000000,v1=")
    assert wh.verify(SECRET, header, body, now=1_800_000_000 + 299)
    assert wh.verify(SECRET, f"{header},v1={'0' * 64}", body, now=1_800_000_000)  # rotation
    assert not wh.verify(SECRET, header, body + b" ", now=1_800_000_000)
    assert not wh.verify(SECRET + "x", header, body, now=1_800_000_000)
    assert not wh.verify(SECRET, header, body, now=1_800_000_000 + 301)
    assert not wh.verify(SECRET, header, body, now=1_800_000_000 - 301)
    assert not wh.verify(SECRET, header, body, now=1_800_000_000 + 100, tolerance=60)
    signature = header.split("v1=")[1]
    for bad in ("", "t=,v1=", f"v1={signature}", "t=1800000000", f"t=abc,v1={signature}",
                f"t=1800000000;v1={signature}", f"t=-5,v1={signature}", f"t=١٢,v1={signature}",
                f"t=1800000000,t=1800000000,v1={signature}", "garbage"):  # fmt: skip
        assert not wh.verify(SECRET, bad, body, now=1_800_000_000), bad


def test_backoff_doubles_from_one_second_to_ten_minutes_with_equal_jitter() -> None:
    """The n-th failure waits between half of and the whole of min(2**(n-1), 600) s."""
    rng = random.Random(7)
    for attempts in range(1, 40):
        ceiling = min(2.0 ** (attempts - 1), 600.0)
        waits = [wh.backoff(attempts, rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), attempts
        assert max(waits) - min(waits) > ceiling / 4  # jittered, not fixed
    assert wh.backoff(1, Ceiling()) == 1.0
    assert wh.backoff(11, Ceiling()) == 600.0
    with pytest.raises(ValueError):
        wh.backoff(0, rng)


# -- delivery -----------------------------------------------------------------


def test_a_delivered_event_is_signed_so_verify_and_plain_hmac_accept_it(
    sqlite_outbox: Engine, receiver: Receiver, clock: FrozenClock
) -> None:
    """The POST carries the body of ``body_of``, JSON content type, flask-quota's user
    agent and a Quota-Signature that ``verify`` and a hand-written HMAC both accept."""
    event = add(sqlite_outbox, clock.seconds, "quota.exceeded", resource="search")
    assert sender(sqlite_outbox, receiver.url, lambda: clock.seconds).run_once() == 1
    [got] = receiver.received
    assert receiver.paths == ["/hooks/quota?token=abc"]
    assert got.body == wh.body_of(event)
    assert json.loads(got.body) == {
        "id": event.id,
        "type": "quota.exceeded",
        "created": datetime.fromtimestamp(clock.seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "data": {"client": "acme", "resource": "search"},
    }
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["User-Agent"] == "flask-quota"
    header = got.headers["Quota-Signature"]
    assert wh.verify(SECRET, header, got.body, now=clock.seconds)
    t, v1 = (part.split("=", 1)[1] for part in header.split(","))
    assert int(t) == int(clock.seconds)
    mac = hmac.new(SECRET.encode(), t.encode() + b"." + got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(mac, v1)
    [info] = wh.list_events(sqlite_outbox)
    assert (info.status, info.attempts) == ("delivered", 1)
    assert info.delivered_at == datetime.fromtimestamp(clock.seconds, UTC)


def test_enqueue_writes_in_the_callers_transaction(outbox: Engine, clock: FrozenClock) -> None:
    """Events enqueued in a transaction that rolls back are gone; committed ones are
    pending, never tried, and due when they were created."""
    now = datetime.fromtimestamp(clock.seconds, UTC)
    lost = wh.new_event("caller.blocked", {"caller": "ip:203.0.113.9"}, now)
    with pytest.raises(RuntimeError), outbox.begin() as conn:
        wh.enqueue(conn, [lost])
        raise RuntimeError("the ledger's flush failed after enqueueing")
    assert wh.list_events(outbox) == []
    kept = [wh.new_event("credits.exhausted", {"n": n}, now) for n in range(3)]
    with outbox.begin() as conn:
        wh.enqueue(conn, kept)
        wh.enqueue(conn, [])
    listed = wh.list_events(outbox)
    assert sorted(e.id for e in listed) == sorted(e.id for e in kept)
    assert {(e.status, e.attempts, e.next_attempt_at) for e in listed} == {("pending", 0, now)}


def test_a_receiver_answering_500_is_retried_with_growing_delays_until_delivered(
    outbox: Engine, receiver: Receiver, clock: FrozenClock
) -> None:
    """Four 500s: each attempt is retried after twice the last wait (1, 2, 4, 8 s at the
    top of the jitter), never before its time; the fifth attempt delivers the same body."""
    event = add(outbox, clock.seconds)
    receiver.statuses = [500, 500, 500, 500]
    hooks = sender(outbox, receiver.url, lambda: clock.seconds, rng=Ceiling())
    waits = []
    for attempt in range(1, 5):
        assert hooks.run_once() == 0
        info = wh.event_info(outbox, event.id)
        assert (info.status, info.attempts, info.last_error) == ("pending", attempt, "HTTP 500")
        wait = (info.next_attempt_at - datetime.fromtimestamp(clock.seconds, UTC)).total_seconds()
        waits.append(wait)
        clock.advance(wait - 1)
        assert hooks.run_once() == 0  # not due yet: no POST
        assert len(receiver.received) == attempt
        clock.advance(1)
    assert waits == [1.0, 2.0, 4.0, 8.0]
    assert hooks.run_once() == 1
    assert receiver.ids() == [event.id] * 5
    assert {r.body for r in receiver.received} == {wh.body_of(event)}
    info = wh.event_info(outbox, event.id)
    assert (info.status, info.attempts) == ("delivered", 5)
    assert hooks.run_once() == 0 and len(receiver.received) == 5  # delivered: never again


class ShiftedClock:
    """The wall clock plus an offset a test moves forward (a minute in a second)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.mark.parametrize("down_for", [OUTAGE])
def test_a_receiver_down_for_a_while_gets_every_event_when_back(
    outbox: Engine, receiver: Receiver, down_for: float
) -> None:
    """The sender thread keeps failing while the receiver is down (``down_for`` seconds of
    its clock), then delivers every event, none lost, each copy validly signed."""
    clock = receiver.clock = ShiftedClock()
    hooks = sender(outbox, receiver.url, clock, interval=0.05, timeout=1.0, lease=5.0)
    before = [add(outbox, clock()) for _ in range(3)]
    hooks.start()
    try:
        assert until(lambda: len(set(receiver.ids())) == 3, 5), receiver.ids()
        receiver.kill()
        during: list[wh.Event] = []
        for _ in range(4):  # events keep coming while it is down
            during += [add(outbox, clock(), n=len(during)) for _ in range(3)]
            time.sleep(0.25)
            clock.offset += down_for / 4

        def tried() -> bool:
            return all(wh.event_info(outbox, e.id).attempts >= 1 for e in during)

        assert until(tried, 5)
        failing = [wh.event_info(outbox, e.id) for e in during]
        assert {e.status for e in failing} == {"pending"}
        assert all("ConnectionRefusedError" in (e.last_error or "") for e in failing)
        # Past any backoff the outage ran up, with the thread paused across the jump: a
        # copy signed before it must not arrive after it (no real clock jumps).
        hooks.stop()
        clock.offset += wh.MAX_DELAY
        receiver.start()
        hooks.start()
        wanted = {e.id for e in before + during}
        assert until(lambda: set(receiver.ids()) == wanted, 10), wanted - set(receiver.ids())
    finally:
        hooks.stop()
    assert {e.status for e in wh.list_events(outbox)} == {"delivered"}
    for got in receiver.received:
        assert wh.verify(SECRET, got.headers["Quota-Signature"], got.body, now=got.at)
    by_id = {e.id: e for e in before + during}
    assert all(got.body == wh.body_of(by_id[got.id]) for got in receiver.received)


@pytest.mark.quiet  # wall-clock bound: a loaded machine stretches it
def test_a_hanging_receiver_costs_the_sender_at_most_its_timeout_per_event(
    sqlite_outbox: Engine, receiver: Receiver, clock: FrozenClock
) -> None:
    """A receiver that never answers: ``run_once`` gives up on each event after
    ``timeout`` and records the timeout as a failed attempt."""
    events = [add(sqlite_outbox, clock.seconds) for _ in range(2)]
    receiver.hang = True
    hooks = sender(sqlite_outbox, receiver.url, lambda: clock.seconds, timeout=0.5, lease=5)
    began = time.monotonic()
    assert hooks.run_once() == 0
    assert time.monotonic() - began < 2 * 0.5 + 1.0
    assert sorted(receiver.ids()) == sorted(e.id for e in events)
    for event in events:
        info = wh.event_info(sqlite_outbox, event.id)
        assert (info.status, info.attempts) == ("pending", 1)
        assert info.last_error is not None and "timed out" in info.last_error


def test_an_event_failing_after_24_hours_is_given_up_until_retried(
    outbox: Engine, receiver: Receiver, clock: FrozenClock
) -> None:
    """A failure of an event older than 24 h marks it failed (a younger one stays pending)
    and it is not tried again; ``retry`` makes it due now and it is delivered."""
    old = add(outbox, clock.seconds)
    receiver.status = 500
    hooks = sender(outbox, receiver.url, lambda: clock.seconds)
    assert hooks.run_once() == 0
    assert wh.event_info(outbox, old.id).status == "pending"  # young: retried later
    clock.advance(24 * 3600 + 1)
    young = add(outbox, clock.seconds)
    assert hooks.run_once() == 0
    failed = wh.event_info(outbox, old.id)
    assert (failed.status, failed.attempts, failed.last_error) == ("failed", 2, "HTTP 500")
    assert wh.event_info(outbox, young.id).status == "pending"
    assert [e.id for e in wh.list_events(outbox, failed_only=True)] == [old.id]
    clock.advance(wh.MAX_DELAY)
    sent = len(receiver.ids())
    hooks.run_once()
    assert receiver.ids()[sent:] == [young.id]  # the failed one is left alone
    receiver.status = 200
    assert wh.retry(outbox, old.id, now=datetime.fromtimestamp(clock.seconds, UTC))
    again = wh.event_info(outbox, old.id)
    assert (again.status, again.attempts) == ("pending", 2)
    clock.advance(10)  # the young one's backoff too
    assert hooks.run_once() == 2
    assert wh.event_info(outbox, old.id).status == "delivered"
    assert not wh.retry(outbox, old.id)  # delivered: nothing to do
    with pytest.raises(AdminError, match="no webhook event 'evt_nope'"):
        wh.retry(outbox, "evt_nope")


def test_settled_events_are_pruned_and_pending_ones_kept(
    outbox: Engine, receiver: Receiver, clock: FrozenClock
) -> None:
    """A sender's hourly prune deletes events delivered over a week ago and failed ones
    created over a month ago; an event still pending, and younger settled ones, stay."""
    delivered = add(outbox, clock.seconds)
    hooks = sender(outbox, receiver.url, lambda: clock.seconds)
    assert hooks.run_once() == 1
    receiver.status = 500
    failed = add(outbox, clock.seconds)
    hooks.run_once()
    clock.advance(24 * 3600 + 1)
    hooks.run_once()  # over a day old and failing: failed
    assert wh.event_info(outbox, failed.id).status == "failed"
    clock.advance(8 * 24 * 3600)  # a week after the delivery: pruned at the next round
    pending = add(outbox, clock.seconds)
    hooks.run_once()
    assert wh.event_info(outbox, pending.id).status == "pending"  # failing, but young
    remaining = {e.id for e in wh.list_events(outbox, limit=100)}
    assert delivered.id not in remaining and {failed.id, pending.id} <= remaining
    clock.advance(30 * 24 * 3600)  # a month: the failed one goes; the pending one stays
    hooks.run_once()
    remaining = {e.id for e in wh.list_events(outbox, limit=100)}
    assert failed.id not in remaining and pending.id in remaining


def test_two_senders_never_post_one_event_at_once(database_url: str, receiver: Receiver) -> None:
    """Two senders (two engines, as on two servers) drain one outbox together: every
    event is POSTed exactly once and never by both at the same time."""
    engines = [_outbox(database_url), own_engine(database_url)]
    try:
        events = [add(engines[0], time.time(), n=n) for n in range(24)]
        receiver.hold = 0.03  # a receiver slow enough for the senders to overlap
        senders = [sender(e, receiver.url, time.time) for e in engines]
        counts = [0, 0]

        def drain(index: int) -> None:
            while any(e.status == "pending" for e in wh.list_events(engines[index], limit=100)):
                delivered = senders[index].run_once()
                counts[index] += delivered
                if not delivered:  # the other sender holds what is left
                    time.sleep(0.01)

        threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(receiver.ids()) == sorted(e.id for e in events)  # each exactly once
        assert receiver.most_at_once == 1
        assert sum(counts) == 24 and min(counts) > 0, counts  # both took part
    finally:
        for engine in engines:
            engine.dispose()


def test_the_sender_thread_outlives_a_broken_database_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database without the outbox fails every round: the thread keeps going, and the
    dozens of failures log one warning, not one per round."""
    engine = own_engine(f"sqlite:///{tmp_path / 'no-tables.sqlite3'}")
    rounds: list[float] = []

    def connect() -> Engine:
        rounds.append(time.monotonic())
        return engine

    hooks = wh.WebhookSender(connect, "http://127.0.0.1:9/", SECRET, interval=0.01)
    hooks.start()
    try:
        assert until(lambda: len(rounds) >= 30, 10)
        alive = [t for t in threading.enumerate() if t.name == "flask-quota-webhooks"]
        assert len(alive) == 1 and alive[0].is_alive()
    finally:
        hooks.stop()
        engine.dispose()
    warned = [r for r in caplog.records if "cannot reach the database" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "no such table" in warned[0].getMessage()


_FORKED = """
import os, sys, threading, time
from datetime import UTC, datetime
from sqlalchemy import create_engine
from flask_quota import webhooks as wh
from flask_quota.sql.models import Model

engine = create_engine(sys.argv[2])
Model.metadata.create_all(engine)
sender = wh.WebhookSender(lambda: engine, sys.argv[1], "whsec-test-0123456789abcdef",
                          interval=3600)
sender.start()
sender.start()
names = [t.name for t in threading.enumerate()]
if names.count("flask-quota-webhooks") != 1:
    sys.exit(3)
time.sleep(0.2)  # the parent's thread has had its round: it sleeps for an hour now
pid = os.fork()
if pid == 0:  # a gunicorn worker forked after init_app
    engine.dispose(close=False)
    event = wh.new_event("quota.alert", {"from": "child"}, datetime.now(UTC))
    with engine.begin() as conn:
        wh.enqueue(conn, [event])
    sender.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if wh.event_info(engine, event.id).status == "delivered":
            os._exit(0)
        time.sleep(0.02)
    os._exit(1)
os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_forked_worker_starts_its_own_sender(tmp_path: Path, receiver: Receiver) -> None:
    """``start`` runs one thread per process however often it is called, and a child
    forked after it (gunicorn's workers) starts its own, which delivers."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", _FORKED, receiver.url,
         f"sqlite:///{tmp_path / 'forked.sqlite3'}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 3, f"start() twice ran two threads: {done.stderr}"
    assert done.returncode == 0, f"the child's sender never delivered: {done.stderr}"
    assert [json.loads(r.body)["data"] for r in receiver.received] == [{"from": "child"}]


# -- the command line ---------------------------------------------------------


@pytest.fixture
def cli_app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_DATABASE_URL=database_url)
    Quota(app)
    yield app
    sql_store(app).close()


def quota(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["quota", "webhooks", *args])


def test_the_cli_lists_events_and_retries_a_failed_one(
    cli_app: Flask, receiver: Receiver, clock: FrozenClock
) -> None:
    """``webhooks list`` shows every event and ``--failed`` the failed ones; ``retry ID``
    makes a failed event due now, audited; a bad id or limit is one line, exit 1, and
    changes nothing."""
    store = sql_store(cli_app)
    store.ensure_ready()
    engine = store.engine
    old, sent = add(engine, clock.seconds - 25 * 3600), add(engine, clock.seconds, "credits.low")
    receiver.statuses = [500]
    assert sender(engine, receiver.url, lambda: clock.seconds).run_once() == 1

    listed = quota(cli_app, "list")
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.output.splitlines()
    assert header.split() == ["ID", "TYPE", "STATUS", "ATTEMPTS", "CREATED", "NEXT/DELIVERED",
                              "LAST", "ERROR"]  # fmt: skip
    assert [row.split()[:4] for row in rows] == [
        [sent.id, "credits.low", "delivered", "1"],
        [old.id, "quota.alert", "failed", "1"],
    ]
    assert rows[1].endswith("HTTP 500")
    failed = quota(cli_app, "list", "--failed")
    assert [row.split()[0] for row in failed.output.splitlines()[1:]] == [old.id]
    assert [
        r.split()[0] for r in quota(cli_app, "list", "--limit", "1").output.splitlines()[1:]
    ] == [sent.id]

    audit = QuotaAdmin(store, actor="test")
    entries = len(audit.audit_log())
    for bad, message in ((["retry", "evt_nope"], "no webhook event 'evt_nope'"),
                         (["retry", sent.id], "was delivered"),
                         (["list", "--limit", "0"], "--limit must be"),
                         (["list", "--limit", "x"], "--limit must be")):  # fmt: skip
        result = quota(cli_app, *bad, *(["--actor", "alice"] if bad[0] == "retry" else []))
        assert result.exit_code == 1, result.output
        assert result.output.count("\n") == 1 and message in result.output, result.output
    assert len(audit.audit_log()) == entries
    assert wh.event_info(engine, old.id).status == "failed"

    retried = quota(cli_app, "retry", old.id, "--actor", "alice")
    assert retried.exit_code == 0, retried.output
    assert f"{old.id} (quota.alert) is due now" in retried.output
    assert "QUOTA_WEBHOOK_URL is not set" in retried.output
    assert wh.event_info(engine, old.id).status == "pending"
    [entry] = audit.audit_log(limit=1)
    assert (entry.actor, entry.action, entry.target) == ("alice", "webhook.retry", old.id)
    assert sender(engine, receiver.url, time.time).run_once() == 1
    assert receiver.ids() == [old.id, sent.id, old.id]


# -- the receiver of docs/webhooks.md -----------------------------------------


def docs_receiver() -> str:
    """The Python of the "A receiver" section of docs/webhooks.md."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "webhooks.md").read_text()
    section = text.split("\n## A receiver\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_receiver_takes_each_event_once_and_refuses_forgeries(
    sqlite_outbox: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example receiver, served over HTTP, handles what a sender delivers; it
    acknowledges a copy without handling it twice, and refuses another body, another
    secret, a signature over 5 minutes old and a malformed header."""
    monkeypatch.setenv("QUOTA_WEBHOOK_SECRET", SECRET)
    example: dict[str, Any] = {"__name__": "docs_receiver"}
    exec(compile(docs_receiver(), "docs/webhooks.md", "exec"), example)
    handled: list[dict[str, Any]] = []
    example["handle"] = handled.append
    app: Flask = example["app"]
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        event = add(sqlite_outbox, time.time(), "quota.exceeded")
        url = f"http://127.0.0.1:{server.port}/hooks/quota"
        assert sender(sqlite_outbox, url, time.time).run_once() == 1
    finally:
        server.shutdown()
        server.server_close()
    assert handled == [json.loads(wh.body_of(event))]

    client = app.test_client()

    def post(header: str, body: bytes) -> int:
        return client.post(
            "/hooks/quota", data=body, headers={"Quota-Signature": header}
        ).status_code

    body, now = wh.body_of(event), int(time.time())
    assert post(wh.sign(SECRET, now, body), body) == 200  # a copy: acknowledged only
    other = wh.body_of(wh.new_event("credits.low", {"units": 10}, datetime.now(UTC)))
    assert post(wh.sign(SECRET, now, body), other) == 400
    assert post(wh.sign("another-secret-0123456789", now, other), other) == 400
    assert post(wh.sign(SECRET, now - 301, other), other) == 400
    assert post("t=now,v1=abc", other) == 400
    assert len(handled) == 1
    assert post(wh.sign(SECRET, now - 200, other), other) == 204
    assert [e["type"] for e in handled] == ["quota.exceeded", "credits.low"]


# -- through the app ------------------------------------------------------------


def events_app(tmp_path: Path, receiver: Receiver) -> tuple[Flask, Quota]:
    """An app whose caller ``ada`` has 4 requests a month, sending its events to
    ``receiver``."""
    from flask import request

    from flask_quota import Identity

    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        QUOTA_PLANS={"free": {"user": "4/month"}},
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path}/events.sqlite3",
        QUOTA_WEBHOOK_URL=receiver.url,
        QUOTA_WEBHOOK_SECRET=SECRET,
    )
    quota = Quota(app)

    @quota.identity_loader
    def caller() -> Identity:
        return Identity(request.headers.get("X-User", "ada"))

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    return app, quota


def test_the_apps_events_reach_the_receiver_signed(
    tmp_path: Path, receiver: Receiver, close_sql: Callable[[Flask], Flask]
) -> None:
    """Through the app: a monthly quota filled to its end and then refused, and an
    operator's block, reach a real receiver as quota.alert (50%, 80%, 100%),
    quota.exceeded and caller.blocked events, each once, each validly signed."""
    app, quota = events_app(tmp_path, receiver)
    close_sql(app)
    http = app.test_client()
    statuses = [http.get("/ping").status_code for _ in range(6)]
    assert statuses == [200, 200, 200, 200, 429, 429]
    with app.app_context():
        quota.block("ada", seconds=60, reason="abuse")
    assert until(lambda: len(receiver.received) >= 5, 15), receiver.ids()
    time.sleep(1.5)  # a second copy of anything would have come by now
    bodies = [json.loads(r.body) for r in receiver.received]
    kinds = sorted(
        (b["type"], b["data"].get("share")) for b in bodies if b["type"] != "caller.blocked"
    )
    assert kinds == [
        ("quota.alert", 0.5), ("quota.alert", 0.8), ("quota.alert", 1.0),
        ("quota.exceeded", None),
    ]  # fmt: skip
    blocked = [b for b in bodies if b["type"] == "caller.blocked"]
    assert len(blocked) == 1 and blocked[0]["data"]["caller"] == "id=ada"
    assert blocked[0]["data"]["reason"] == "abuse" and blocked[0]["data"]["seconds"] == 60
    for r in receiver.received:
        assert wh.verify(SECRET, r.headers["Quota-Signature"], r.body, now=time.time())


def test_a_hanging_receiver_holds_no_request(
    tmp_path: Path, receiver: Receiver, close_sql: Callable[[Flask], Flask]
) -> None:
    """With the receiver hanging on every POST (the sender thread stuck in one), requests
    go on being decided and answered, and their events wait in the outbox."""
    receiver.hang = True
    app, _ = events_app(tmp_path, receiver)
    close_sql(app)
    http = app.test_client()
    for user in ("ada", "bob", "cy"):
        for _ in range(3):  # each crosses 50% at its 2nd request: an event each
            start = time.monotonic()
            assert http.get("/ping", headers={"X-User": user}).status_code == 200
            assert time.monotonic() - start < 1.0  # far below the sender's 5 s timeout
    assert until(lambda: len(receiver.received) >= 1, 15)  # the sender is stuck in a POST
    engine = sql_store(app).engine
    assert until(lambda: len(wh.list_events(engine, limit=100)) == 3, 15)
    receiver.released.set()


def test_credits_events_reach_the_receiver_signed(
    tmp_path: Path, receiver: Receiver, close_sql: Callable[[Flask], Flask]
) -> None:
    """A prepaid balance spent down through the app: credits.low at each alert share of
    the grant short of all of it, and credits.exhausted at zero, reach a real receiver,
    once each, signed."""
    from flask import request

    from flask_quota import Identity

    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        QUOTA_PLANS={"payg": {"user": "100/minute", "resources": {"sms": "credits"}}},
        QUOTA_DEFAULT_PLAN="payg",
        QUOTA_ANONYMOUS_PLAN="payg",
        QUOTA_ALERTS=(0.5, 1.0),
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path}/credits.sqlite3",
        QUOTA_WEBHOOK_URL=receiver.url,
        QUOTA_WEBHOOK_SECRET=SECRET,
    )
    quota = Quota(app)
    close_sql(app)

    @quota.identity_loader
    def caller() -> Identity:
        return Identity(request.headers.get("X-User", "ada"))

    @app.post("/sms")
    @quota.limit(resource="sms")
    def sms() -> str:
        return "sent"

    with app.app_context():
        quota.grant(identity="ada", resource="sms", units=4)
    http = app.test_client()
    statuses = []
    for _ in range(5):
        statuses.append(http.post("/sms").status_code)
    assert statuses == [200, 200, 200, 200, 402]
    assert until(lambda: len(receiver.received) >= 2, 15), receiver.ids()
    time.sleep(1.5)  # a second copy of anything would have come by now
    bodies = [json.loads(r.body) for r in receiver.received]
    assert sorted((b["type"], b["data"].get("share")) for b in bodies) == [
        ("credits.exhausted", None), ("credits.low", 0.5),
    ]  # fmt: skip
    assert {b["data"]["resource"] for b in bodies} == {"sms"}
    for r in receiver.received:
        assert wh.verify(SECRET, r.headers["Quota-Signature"], r.body, now=time.time())
