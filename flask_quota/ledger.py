"""The usage ledger (``QUOTA_LEDGER``): admitted units per day, caller, tenant and resource.

The path from a request to a row adds no storage call and no database write to the
request: ``Ledger.record`` adds to an in-process dict (one lock, a few dict updates);
a background thread per worker writes what accumulated every ``interval`` seconds in
one transaction, one upsert per (day, caller, tenant, resource) touched, so the
database's write load follows the number of active callers, not the request rate.

What a fault can do to the counts (docs/billing.md states it for users):

- **A worker killed** (SIGKILL, OOM) loses what it recorded since its last flush: at
  most ``interval`` seconds of its own requests. A worker that exits normally flushes
  first (``atexit``).
- **The database down** loses nothing while it is down, up to ``max_pending`` distinct
  rows per worker waiting (more are dropped, logged and counted): each flush is retried
  until it commits.
- **Counted twice: never.** A flush writes its own id in the same transaction as its
  rows; one retried after an unclear failure (the commit's answer lost) finds its id
  and is skipped. Many servers add to the same rows with upserts, each its own counts.
- **Redis restarted:** nothing; the ledger never reads the counter storage.

Webhook events (``webhooks.enqueue``) are written in the same transaction, so an event
decided in a request is kept exactly when the counts of that flush are.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, Engine, Table, delete, func, insert, select
from sqlalchemy.dialects import mysql, postgresql, sqlite

from .core.calendar import Calendar
from .sql.models import CALLER_MAX, LedgerFlush, UsageRow
from .writer import start_writer

if TYPE_CHECKING:
    from .webhooks import Event

__all__ = ["Ledger", "caller_of", "counted", "day_of", "period_usage"]

log = logging.getLogger("flask_quota")

# (day, caller, tenant, resource) -> [units, requests, denied]
Key = tuple[date, str, str, str]
Counts = dict[Key, list[int]]
REQUESTS = ""  # the resource under which a caller's requests themselves are counted
_US_PER_MINUTE = 60_000_000
_FLUSH_IDS_KEPT = timedelta(days=1)  # a retry comes within seconds; a day is plenty
WARN_EVERY = 60.0  # seconds between two warnings of a failing write


def caller_of(identity_id: str) -> str:
    """The ledger's caller column for an identity: itself, or its digest when longer
    than the column (an app's identity loader may return anything)."""
    if len(identity_id) <= CALLER_MAX:
        return identity_id
    return "sha256:" + hashlib.sha256(identity_id.encode()).hexdigest()


def day_of(now_us: int, zone: ZoneInfo) -> date:
    """The day ``now_us`` (microseconds since the epoch) falls on in ``zone``."""
    return datetime.fromtimestamp(now_us / 1_000_000, zone).date()


class _Batch:
    """Counts and events handed to one flush, under the id that makes it idempotent."""

    __slots__ = ("counts", "events", "id")

    def __init__(self, counts: Counts, events: list[Event]) -> None:
        self.id = uuid.uuid4().hex
        self.counts, self.events = counts, events


class Ledger:
    """Accumulates usage in-process and writes it to the ``quota_usage`` table.
    ``ready()`` is called before each write: it makes sure the tables exist.

    ``usage`` False keeps only the webhook events (``QUOTA_WEBHOOK_URL`` without
    ``QUOTA_LEDGER``): they are written the same way.
    """

    def __init__(
        self,
        engine: Callable[[], Engine],
        zone: ZoneInfo,
        *,
        usage: bool = True,
        ready: Callable[[], None] = lambda: None,
        before: Callable[[], None] = lambda: None,
        interval: float = 0.5,
        max_pending: int = 100_000,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine, self.zone, self.usage, self.ready = engine, zone, usage, ready
        self.before = before  # run first in every flush (the alerts' claims, which add events)
        self.interval, self.max_pending, self.clock = interval, max_pending, clock
        self.dropped = 0  # counts not recorded because too many rows waited (all time)
        self._lock = threading.Lock()
        self._counts: Counts = {}
        self._events: list[Event] = []
        self._failed: _Batch | None = None  # a flush that did not commit, retried as is
        self._flushing = threading.Lock()
        self._wake = threading.Event()
        self._thread_pid: int | None = None
        self._day: tuple[int, date] = (-1, date.min)  # (minute, its day): the usual lookup
        self._pruned = datetime.min.replace(tzinfo=UTC)
        self._warned = -WARN_EVERY  # time.monotonic() of the last warning

    # -- the request side -------------------------------------------------------

    def record(
        self,
        now_us: int,
        caller: str,
        tenant: str | None,
        units: Iterable[tuple[str, int]],
        *,
        admitted: bool,
    ) -> None:
        """Count one request of ``caller``: admitted (with the units each of its
        resources kept) or denied (``units`` then names the resources it asked for)."""
        minute = now_us // _US_PER_MINUTE
        known_minute, day = self._day
        if minute != known_minute:  # zones' offsets are whole minutes: a minute has one day
            day = day_of(minute * _US_PER_MINUTE, self.zone)
            self._day = (minute, day)
        who = caller_of(caller)
        owner = tenant or ""
        with self._lock:
            counts = self._counts
            for resource, n in ((REQUESTS, 1), *units):
                key = (day, who, owner, resource)
                row = counts.get(key)
                if row is None:
                    if len(counts) >= self.max_pending:
                        self.dropped += 1  # the database is away: drop, never grow
                        continue
                    row = counts[key] = [0, 0, 0]
                if admitted:
                    row[0] += n
                    row[1] += 1
                else:
                    row[2] += 1
        self._started()

    def event(self, event: Event) -> None:
        """Keep ``event`` for the outbox: written with the next flush."""
        with self._lock:
            if len(self._events) < self.max_pending:
                self._events.append(event)
            else:
                self.dropped += 1
        self._started()

    # -- the writer -------------------------------------------------------------

    def flush(self) -> bool:
        """Write a failed batch (under its own id), then what is pending. True when
        nothing is left unwritten."""
        with self._flushing:
            try:
                self.before()
            except Exception:  # never stops the writer: logged, the counts still go out
                log.exception("flask-quota: the ledger writer's first step failed")
            if self._failed is not None and not self._write(self._failed):
                return False
            self._failed = None
            with self._lock:
                counts, events = self._counts, self._events
                self._counts, self._events = {}, []
            if not counts and not events:
                return True
            batch = _Batch(counts, events)
            if self._write(batch):
                return True
            self._failed = batch
            return False

    def _write(self, batch: _Batch) -> bool:
        try:
            self.ready()  # the tables exist (the SQL store makes them, once per process)
            with self.engine().begin() as conn:
                done = conn.execute(select(LedgerFlush.id).where(LedgerFlush.id == batch.id))
                if done.first() is not None:
                    return True  # committed before; its answer was lost
                now = self.clock()
                conn.execute(insert(LedgerFlush).values(id=batch.id, at=now))
                if batch.counts:
                    upsert(conn, batch.counts)
                if batch.events:
                    from .webhooks import enqueue  # only with QUOTA_WEBHOOK_URL

                    enqueue(conn, batch.events)
                if now - self._pruned > timedelta(hours=1):
                    conn.execute(delete(LedgerFlush).where(LedgerFlush.at < now - _FLUSH_IDS_KEPT))
                    self._pruned = now
            return True
        except Exception as exc:  # the database is away: kept, retried next interval
            now_s = time.monotonic()
            if now_s - self._warned >= WARN_EVERY:  # a dead database logs once a minute
                self._warned = now_s
                log.warning(
                    "flask-quota: the usage ledger could not be written (%s: %s); %d rows "
                    "and %d events wait for the next try",
                    type(exc).__name__,
                    str(exc).splitlines()[0][:200] if str(exc) else "",
                    len(batch.counts),
                    len(batch.events),
                )
            return False

    def poke(self) -> None:
        """Flush soon: something waits that should not wait a whole interval (an alert)."""
        self._started()
        self._wake.set()

    def _started(self) -> None:
        if self._thread_pid != os.getpid():
            self._start()

    def _start(self) -> None:
        # Started lazily, in the worker that records (gunicorn forks after init_app).
        with self._lock:
            if self._thread_pid == os.getpid():
                return
            self._thread_pid = os.getpid()
            # A fork copies the parent's locks in whatever state its threads held them.
            self._flushing, self._wake = threading.Lock(), threading.Event()
        start_writer(self, "flask-quota-ledger")

    def close(self) -> None:
        """Write what is pending (tests, and an app shut down cleanly)."""
        self.flush()
        self._wake.set()


def upsert(conn: Connection, counts: Counts) -> None:
    """Add ``counts`` to their rows, creating the missing ones: one statement, in key
    order (transactions of several servers lock shared rows in the same order)."""
    rows = [
        {"day": d, "caller": c, "tenant": t, "resource": r, "units": u, "requests": n, "denied": x}
        for (d, c, t, r), (u, n, x) in sorted(counts.items())
    ]
    table = UsageRow.__table__
    assert isinstance(table, Table)
    dialect = conn.dialect.name
    if dialect in ("mysql", "mariadb"):
        my = mysql.insert(table)
        stmt = my.on_duplicate_key_update(
            units=table.c.units + my.inserted.units,
            requests=table.c.requests + my.inserted.requests,
            denied=table.c.denied + my.inserted.denied,
        )
    elif dialect in ("postgresql", "sqlite"):
        ins = (postgresql if dialect == "postgresql" else sqlite).insert(table)
        stmt = ins.on_conflict_do_update(
            index_elements=["day", "caller", "tenant", "resource"],
            set_={
                "units": table.c.units + ins.excluded.units,
                "requests": table.c.requests + ins.excluded.requests,
                "denied": table.c.denied + ins.excluded.denied,
            },
        )
    else:  # pragma: no cover - the three supported databases are above
        raise RuntimeError(f"the usage ledger does not support the {dialect} database")
    conn.execute(stmt, rows)


def period_usage(engine: Engine, caller: str, calendar: Calendar, now_us: int) -> dict[str, Any]:
    """A caller's use in its current billing period (``calendar`` on its billing day), as
    the status endpoint shows it: the period's first and last day and the totals per
    resource, as written by the last flushes (this worker's pending counts not yet)."""
    start, end = calendar.span("month", now_us)
    first = day_of(start, calendar.zone)
    last = day_of(end - 1, calendar.zone)
    who = caller_of(caller)
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                UsageRow.resource,
                func.sum(UsageRow.units),
                func.sum(UsageRow.requests),
                func.sum(UsageRow.denied),
            )
            .where(UsageRow.caller == who, UsageRow.day >= first, UsageRow.day <= last)
            .group_by(UsageRow.resource)
            .order_by(UsageRow.resource)
        ).all()
    return {
        "period": {"first": first.isoformat(), "last": last.isoformat()},
        "totals": [
            {"resource": r, "units": int(u or 0), "requests": int(n or 0), "denied": int(d or 0)}
            for r, u, n, d in rows
        ],
    }


def counted(rows: Sequence[UsageRow]) -> dict[Key, tuple[int, int, int]]:
    """Rows as ``{key: (units, requests, denied)}`` (tests and tools)."""
    return {(r.day, r.caller, r.tenant, r.resource): (r.units, r.requests, r.denied) for r in rows}
