"""Webhooks: the outbox of events (``quota_webhook_events``) and the thread that sends it.

An event is written to the outbox in the transaction that decided it (``enqueue``, called
by the ledger's flush), so it is kept exactly when that decision is. A sender thread per
worker process (``WebhookSender``) POSTs due events to ``QUOTA_WEBHOOK_URL``, each signed
with ``QUOTA_WEBHOOK_SECRET`` (``sign``; receivers check with ``verify``), and retries a
failed one with exponential backoff (``backoff``) until it is 24 hours old.

The contract is at-least-once: an event may arrive twice (a worker killed between the
receiver's 2xx and the database write, a lease that ran out under a slow receiver), so
receivers de-duplicate by its ``id``. What never happens is two senders posting one event
at the same time: a sender claims an event with a conditional ``UPDATE`` of its
``locked_until`` (a lease) before posting it, and only one claim can succeed, whatever
the number of workers and servers sharing the database.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import logging
import os
import random
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

from sqlalchemy import Connection, Engine, delete, insert, or_, select, update

from .sql.errors import AdminError, one_line
from .sql.models import WebhookEvent

__all__ = [
    "BATCH",
    "EVENT_TYPES",
    "MAX_AGE",
    "MAX_DELAY",
    "SIGNATURE_HEADER",
    "Event",
    "EventInfo",
    "WebhookSender",
    "backoff",
    "body_of",
    "enqueue",
    "event_info",
    "list_events",
    "new_event",
    "prune",
    "retry",
    "sign",
    "verify",
]

log = logging.getLogger("flask_quota")

EVENT_TYPES = (
    "quota.alert",
    "quota.exceeded",
    "caller.blocked",
    "credits.low",
    "credits.exhausted",
)
MAX_AGE = timedelta(hours=24)  # an event still undelivered when this old is given up on
BATCH = 50  # events a sender takes per round: a backlog drains without one huge query
FIRST_DELAY = 1.0  # seconds before the first retry (before jitter) ...
MAX_DELAY = 600.0  # ... doubling per failed attempt up to ten minutes
ERROR_MAX = 200  # characters of an attempt's error kept in ``last_error``
LOG_EVERY = 60.0  # seconds between two warnings of one kind: a dead receiver logs once a minute
# Rounds in a row the database must fail before a warning: not at start-up, while the
# tables are still being made, nor for one dropped connection.
DATABASE_PATIENCE = 3
SIGNATURE_HEADER = "Quota-Signature"
# How long the outbox keeps an event once it is settled (the table must not grow for
# ever): delivered ones a week (a receiver's own log is the record), failed ones a month
# (an operator may still `flask quota webhooks retry` them).
KEEP_DELIVERED = timedelta(days=7)
KEEP_FAILED = timedelta(days=30)
PRUNE_EVERY = 3600.0  # seconds between two prunes by one sender


@dataclass(frozen=True)
class Event:
    """One event for the webhook: ``id`` (``evt_<32 hex>``, what receivers de-duplicate
    by), ``type`` (one of ``EVENT_TYPES``), ``created`` (UTC, whole seconds) and ``data``
    (a JSON object)."""

    id: str
    type: str
    created: datetime
    data: dict[str, Any]


@dataclass(frozen=True)
class EventInfo:
    """An outbox row as operators see it (``flask quota webhooks list``)."""

    id: str
    type: str
    status: str  # pending | delivered | failed
    attempts: int
    created: datetime
    next_attempt_at: datetime
    delivered_at: datetime | None
    last_error: str | None


def new_event(type: str, data: dict[str, Any], now: datetime) -> Event:
    """A new event of ``type`` carrying ``data``, created at ``now`` (timezone-aware).

    ``created`` keeps whole seconds: MariaDB's ``DATETIME`` keeps no fraction, and the
    body must be the same on every attempt, whatever the database. ``data`` is checked
    to be JSON now, so a bad one fails its caller rather than the ledger's flush.
    """
    if type not in EVENT_TYPES:
        raise ValueError(
            f"unknown webhook event type {type!r}: use one of {', '.join(EVENT_TYPES)}"
        )
    if now.tzinfo is None:
        raise ValueError("new_event needs a timezone-aware datetime, e.g. datetime.now(UTC)")
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"webhook event data must be JSON: {exc}") from None
    created = now.astimezone(UTC).replace(microsecond=0)
    return Event(id=f"evt_{uuid.uuid4().hex}", type=type, created=created, data=dict(data))


def enqueue(connection: Connection, events: Sequence[Event]) -> None:
    """Add ``events`` to the outbox, due at once, in ``connection``'s transaction.

    Nothing is committed here: the caller's transaction keeps the events together with
    the decision they report, or neither.
    """
    if not events:
        return
    rows = [
        {
            "id": event.id,
            "type": event.type,
            "created": event.created,
            "data": event.data,
            "status": "pending",
            "attempts": 0,
            "next_attempt_at": event.created,
            "locked_until": None,
            "last_error": None,
            "delivered_at": None,
        }
        for event in events
    ]
    connection.execute(insert(WebhookEvent), rows)


def body_of(event: Event) -> bytes:
    """The JSON POSTed for ``event``: ``{"id","type","created","data"}`` in that order,
    compact, ASCII, the keys inside ``data`` sorted, so every attempt sends the same bytes.

    ``created`` is ISO 8601 in UTC with a ``Z``, to the second: ``2026-12-03T22:30:00Z``.
    """
    created = event.created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    parts = (
        ("id", json.dumps(event.id)),
        ("type", json.dumps(event.type)),
        ("created", json.dumps(created)),
        ("data", json.dumps(event.data, sort_keys=True, separators=(",", ":"), allow_nan=False)),
    )
    return ("{" + ",".join(f'"{key}":{value}' for key, value in parts) + "}").encode("ascii")


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    message = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Quota-Signature`` header for ``body`` sent at ``timestamp`` (Unix seconds):
    ``t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>." + body>``. The timestamp is
    signed too, so a receiver can refuse an old message replayed."""
    return f"t={timestamp},v1={_digest(secret, timestamp, body)}"


def verify(secret: str, header: str, body: bytes, *, now: float, tolerance: float = 300) -> bool:
    """True when ``header`` (a ``Quota-Signature``) signs ``body`` with ``secret`` and its
    timestamp is within ``tolerance`` seconds of ``now``, either way.

    A malformed header is False, never an exception. Several ``v1`` entries are allowed
    (any may match), so a receiver keeps working while a sender changes its secret.
    """
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            return False
        if key == "t":
            if timestamp is not None or not value.isascii() or not value.isdigit():
                return False
            timestamp = int(value)
        elif key == "v1":
            signatures.append(value)
    if timestamp is None or not signatures or abs(now - timestamp) > tolerance:
        return False
    expected = _digest(secret, timestamp, body).encode()
    # Compare every entry, in constant time each: how far a guess matches must not show.
    matches = [hmac.compare_digest(expected, s.encode("utf-8", "replace")) for s in signatures]
    return any(matches)


def backoff(attempts: int, rng: random.Random) -> float:
    """Seconds to wait after the ``attempts``-th failed attempt (1 for the first).

    Exponential with *equal jitter*: the ceiling starts at ``FIRST_DELAY`` (1 s) and
    doubles per attempt up to ``MAX_DELAY`` (600 s); the wait is drawn between half the
    ceiling and the ceiling. Half of it is random, so the events of one outage do not
    come back all at once; the other half is fixed, so each wait is at least half the
    one before and a receiver that is down is not hammered.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    ceiling = min(MAX_DELAY, FIRST_DELAY * 2.0 ** min(attempts - 1, 30))
    return ceiling / 2 + rng.random() * ceiling / 2


class _Throttle:
    """At most one warning per kind per ``every`` seconds; how many were held back."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, kind: str) -> int | None:
        """The number of warnings held back since the last one, or None: hold this one."""
        now = time.monotonic()
        if now - self._last.get(kind, -float("inf")) < self.every:
            self._held[kind] = self._held.get(kind, 0) + 1
            return None
        self._last[kind] = now
        return self._held.pop(kind, 0)


@dataclass(frozen=True)
class _Claim:
    event: Event
    attempts: int  # before this one: the fence of the result's write


class WebhookSender:
    """Sends the outbox's due events to ``url``, signed with ``secret``, from one daemon
    thread per process (``start``), every ``interval`` seconds.

    ``engine`` is called for each round, so a worker forked after this was made uses the
    engine its own process has. A receiver that does not answer costs the thread
    ``timeout`` seconds per socket operation of an event, never a request. A claim holds
    an event for ``lease`` seconds: longer than ``timeout``, so the lease outlives a
    sender's attempt, and short, so an event claimed by a killed worker is taken up
    again soon. ``clock`` (Unix seconds) and ``rng`` are for tests.
    """

    def __init__(
        self,
        engine: Callable[[], Engine],
        url: str,
        secret: str,
        *,
        interval: float = 1.0,
        timeout: float = 5.0,
        lease: float = 30.0,
        batch: int = BATCH,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the webhook URL must be http:// or https://, not {url!r}")
        if not secret:
            raise ValueError("the webhook secret must not be empty")
        if interval <= 0 or timeout <= 0 or batch < 1:
            raise ValueError("interval, timeout and batch must be positive")
        if lease <= timeout:
            raise ValueError(f"lease ({lease} s) must be longer than timeout ({timeout} s)")
        self.engine = engine
        self.url = url
        self.secret = secret
        self.interval = interval
        self.timeout = timeout
        self.lease = lease
        self.batch = batch
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self._throttle = _Throttle(LOG_EVERY)
        self._start_lock = threading.Lock()
        self._pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pruned = -PRUNE_EVERY  # clock() of this sender's last prune

    # -- the thread ---------------------------------------------------------

    def start(self) -> None:
        """Start this process's sender thread, unless it runs already; safe to call again
        in a forked child (gunicorn forks its workers after ``init_app``)."""
        if self._pid == os.getpid():
            return
        with self._start_lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            # A fork copies the parent's thread object and stop flag, not the thread.
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="flask-quota-webhooks", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop this process's sender thread (it finishes the event in flight first)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.timeout + 5)
        self._pid = None

    def _run(self, stop: threading.Event) -> None:
        failures = 0  # rounds in a row the database failed
        while not stop.is_set():
            full = False
            try:
                _, taken = self._round(stop)
                full = taken >= self.batch  # a backlog: the next round at once
                failures = 0
            except Exception as exc:  # the database is away: the next round tries again
                failures += 1
                if failures >= DATABASE_PATIENCE:
                    self._warn(
                        "database",
                        "flask-quota: webhook events wait: the sender cannot reach the "
                        "database (%s)",
                        one_line(exc),
                    )
            if not full:
                stop.wait(self.interval)

    def _warn(self, kind: str, message: str, *args: object) -> None:
        held = self._throttle.allow(kind)
        if held is not None:
            suffix = f" ({held} more like it in the last {LOG_EVERY:.0f} s)" if held else ""
            log.warning(message + suffix, *args)

    # -- one round ----------------------------------------------------------

    def run_once(self) -> int:
        """Send the due events (at most ``batch``, the longest due first); the number
        delivered. Database errors propagate; a receiver's never do."""
        delivered, _ = self._round(None)
        return delivered

    def _round(self, stop: threading.Event | None) -> tuple[int, int]:
        """(events delivered, events due) of one round."""
        now = self._now()
        if self.clock() - self._pruned >= PRUNE_EVERY:
            prune(self.engine(), now)
            self._pruned = self.clock()
        with self.engine().connect() as conn:
            due = conn.scalars(
                select(WebhookEvent.id)
                .where(_due(now))
                .order_by(WebhookEvent.next_attempt_at, WebhookEvent.id)
                .limit(self.batch)
            ).all()
        delivered = 0
        for event_id in due:
            if stop is not None and stop.is_set():
                break
            # Claimed one at a time, just before its POST: a lease taken for the whole
            # batch would run out behind a slow receiver.
            claim = self._claim(event_id)
            if claim is not None:
                delivered += self._send(claim)
        return delivered, len(due)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    def _claim(self, event_id: str) -> _Claim | None:
        """Take ``event_id`` for ``lease`` seconds if it is still due and free: exactly
        one of any number of senders trying at once gets it (rowcount 1)."""
        now = self._now()
        with self.engine().begin() as conn:
            taken = conn.execute(
                update(WebhookEvent)
                .where(WebhookEvent.id == event_id, _due(now))
                .values(locked_until=now + timedelta(seconds=self.lease))
            ).rowcount
            if taken != 1:
                return None  # another sender has it, or it was sent meanwhile
            row = conn.execute(
                select(
                    WebhookEvent.id,
                    WebhookEvent.type,
                    WebhookEvent.created,
                    WebhookEvent.data,
                    WebhookEvent.attempts,
                ).where(WebhookEvent.id == event_id)
            ).one()
        event = Event(id=row.id, type=row.type, created=row.created, data=row.data)
        return _Claim(event, row.attempts)

    def _send(self, claim: _Claim) -> int:
        """POST one claimed event and write the outcome; 1 if it was delivered."""
        event = claim.event
        try:
            status = self._post(body_of(event))
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except Exception as exc:  # refused, timed out, TLS, DNS: all retried alike
            error = f"{type(exc).__name__}: {exc}"
        now = self._now()
        attempts = claim.attempts + 1
        mine = (WebhookEvent.id == event.id, WebhookEvent.status == "pending")
        with self.engine().begin() as conn:
            if error is None:
                conn.execute(
                    update(WebhookEvent)
                    .where(*mine)
                    .values(
                        status="delivered",
                        delivered_at=now,
                        attempts=WebhookEvent.attempts + 1,
                        locked_until=None,
                    )
                )
                return 1
            error = error[:ERROR_MAX]
            if now - event.created > MAX_AGE:
                values: dict[str, Any] = {"status": "failed"}
                wait = None
            else:
                wait = backoff(attempts, self.rng)
                values = {"next_attempt_at": now + timedelta(seconds=wait)}
            # Fenced by the attempt count: a sender whose lease ran out (a receiver slower
            # than ``lease``) must not overwrite the outcome of the one that took over.
            conn.execute(
                update(WebhookEvent)
                .where(*mine, WebhookEvent.attempts == claim.attempts)
                .values(attempts=attempts, last_error=error, locked_until=None, **values)
            )
        host = urlsplit(self.url).hostname  # not the URL: its path or query may hold a token
        if wait is None:
            self._warn(
                "failed",
                "flask-quota: webhook %s (%s) failed for 24 h and was given up (%s); "
                "`flask quota webhooks retry %s` sends it again",
                event.id, event.type, error, event.id,
            )  # fmt: skip
        else:
            self._warn(
                "retry",
                "flask-quota: webhook %s to %s failed (%s); attempt %d, next in %.0f s",
                event.id, host, error, attempts, wait,
            )  # fmt: skip
        return 0

    def _post(self, body: bytes) -> int:
        """POST ``body`` to the URL; the response's status. Redirects are not followed
        (a 3xx is a failure, retried): a redirected POST would lose its body."""
        parts = urlsplit(self.url)
        host, port = parts.hostname or "", parts.port
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            context = ssl.create_default_context()
            conn = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "flask-quota",
            SIGNATURE_HEADER: sign(self.secret, int(self.clock()), body),
        }
        if parts.username is not None:  # https://user:password@host/...: basic auth
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request("POST", target, body=body, headers=headers)
            return conn.getresponse().status  # the body is not read: only the status counts
        finally:
            conn.close()


def prune(engine: Engine, now: datetime) -> int:
    """Delete events delivered more than ``KEEP_DELIVERED`` ago and failed ones created
    more than ``KEEP_FAILED`` ago; how many went. Pending events are never touched."""
    with engine.begin() as conn:
        gone = conn.execute(
            delete(WebhookEvent).where(
                or_(
                    (WebhookEvent.status == "delivered")
                    & (WebhookEvent.delivered_at < now - KEEP_DELIVERED),
                    (WebhookEvent.status == "failed") & (WebhookEvent.created < now - KEEP_FAILED),
                )
            )
        ).rowcount
    return int(gone)


def _due(now: datetime) -> Any:
    """The condition of an event a sender may take at ``now``: pending, due, not leased."""
    return (
        (WebhookEvent.status == "pending")
        & (WebhookEvent.next_attempt_at <= now)
        & or_(WebhookEvent.locked_until.is_(None), WebhookEvent.locked_until <= now)
    )


# -- operators ----------------------------------------------------------------


def _info(row: Any) -> EventInfo:
    return EventInfo(
        id=row.id,
        type=row.type,
        status=row.status,
        attempts=row.attempts,
        created=row.created,
        next_attempt_at=row.next_attempt_at,
        delivered_at=row.delivered_at,
        last_error=row.last_error,
    )


_INFO_COLUMNS = (
    WebhookEvent.id,
    WebhookEvent.type,
    WebhookEvent.status,
    WebhookEvent.attempts,
    WebhookEvent.created,
    WebhookEvent.next_attempt_at,
    WebhookEvent.delivered_at,
    WebhookEvent.last_error,
)


def list_events(engine: Engine, *, failed_only: bool = False, limit: int = 50) -> list[EventInfo]:
    """The newest ``limit`` events of the outbox (only those given up on: ``failed_only``)."""
    if limit < 1:
        raise AdminError(f"the limit must be at least 1, not {limit}")
    query = (
        select(*_INFO_COLUMNS).order_by(WebhookEvent.created.desc(), WebhookEvent.id).limit(limit)
    )
    if failed_only:
        query = query.where(WebhookEvent.status == "failed")
    with engine.connect() as conn:
        return [_info(row) for row in conn.execute(query)]


def event_info(engine: Engine, event_id: str) -> EventInfo:
    """The outbox row of ``event_id``; ``AdminError`` if there is none."""
    with engine.connect() as conn:
        row = conn.execute(select(*_INFO_COLUMNS).where(WebhookEvent.id == event_id)).first()
    if row is None:
        raise AdminError(
            f"no webhook event {event_id!r}: `flask quota webhooks list` shows the ids"
        )
    return _info(row)


def retry(engine: Engine, event_id: str, *, now: datetime | None = None) -> bool:
    """Make a failed or pending event due at once (``now``), its attempts kept; True if
    it was, False if it has been delivered (nothing changed). ``AdminError`` for an
    unknown id. An attempt in flight meanwhile has the last word (delivered, or its
    own backoff)."""
    event_info(engine, event_id)  # an unknown id is an error, not a False
    moment = now if now is not None else datetime.now(UTC)
    with engine.begin() as conn:
        changed = conn.execute(
            update(WebhookEvent)
            .where(WebhookEvent.id == event_id, WebhookEvent.status.in_(("pending", "failed")))
            .values(status="pending", next_attempt_at=moment)
        ).rowcount
    return bool(changed == 1)
