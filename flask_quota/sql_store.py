"""Where the quota tables live, and how each process keeps a fresh copy of them.

Requests never query SQL and never wait for it. Once started, a process serves a
``SqlCatalog`` snapshot; a sync thread reads one number, ``quota_meta.version``,
every ``QUOTA_SYNC_INTERVAL`` seconds and reloads the snapshot when it moved.
Every change bumps that number in its own transaction (``SqlStore.change``), so a
change made by any process on any server reaches every worker within the interval
plus one reload, and costs requests nothing.

When the sync starts (``autostart``, called by ``init_app``):

- at once, in the background, when the tables are wanted: a configured
  ``QUOTA_DATABASE_URL``, ``Quota(app, db=db)``, a mounted dashboard, or a default
  SQLite file that exists already. Inside a ``flask ...`` command nothing starts
  (``flask db upgrade`` must find the database as it is); there the first
  request starts it.
- otherwise (the implicit default file, absent) nothing is created and no thread
  runs: requests get the configured plans, and at most once per interval a request
  looks whether the file has appeared (made by ``flask quota ...`` or by another
  process's dashboard), and then starts the sync.

A database in trouble never reaches requests. Every call of our own engine is
bounded (connect, statement and pool timeouts, TCP keepalives). The sync runs each
attempt in a thread of its own and watches it, so a database that hangs is noticed
and logged like one that fails, once per change of state; ``health()`` tells how
old the served snapshot is. Before the first load, requests get the configured
plans, and an API key that cannot be verified yet is served as anonymous, never
refused (``KeysUnavailable``); only keyed requests in the sync's first second wait
for the first load, and at most until that second is over.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from flask import Flask, has_app_context
from sqlalchemy import (
    Column,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    create_engine,
    event,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as SqlTimeout
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.pool import StaticPool

from .core import validators
from .core.algorithms import Algorithm
from .core.identity import Identity
from .core.plans import LimitMode, Plan, PlanCatalog
from .core.rates import Rates, parse_rates
from .core.tiers import Tier
from .models import (
    SCHEMA_REVISION,
    Client,
    Override,
    PlanLimit,
    PlanRecord,
    QuotaMeta,
    copy_tables,
    metadata,
)
from .settings import Settings
from .snapshot import KeyEntry, OverrideRule, SqlCatalog
from .storage.url import SCHEMES

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = [
    "DEFAULT_DATABASE_FILE",
    "STALE_AFTER",
    "VERSION_TABLE",
    "KeysUnavailable",
    "SqlStore",
    "SyncHealth",
    "TablesMissing",
    "local_database_warning",
]

log = logging.getLogger("flask_quota")

DEFAULT_DATABASE_FILE = "flask_quota.sqlite3"
# Our own Alembic version table, so that a host's ``alembic_version`` is never touched.
VERSION_TABLE = "quota_alembic_version"
_INIT_LOCK_ID = 0x71756F7461  # "quota": pg_advisory_xact_lock key for first-time setup
# MySQL GET_LOCK name for the same, + a hash of the database's name: lock names stop
# at 64 characters, database names may use all 64.
_INIT_LOCK_NAME = "flask_quota_setup:"

STALE_AFTER = 5.0  # seconds without a confirmed sync before the snapshot counts as stale
# API-key requests arriving this soon after the sync started wait (at most that long)
# for the first load, so a healthy database verifies keys from the very first request.
FIRST_LOAD_GRACE = 1.0
# Bounds of our own engine's calls (the host's engine, with db=, is the host's to tune),
# kept to a few seconds: a dashboard page waiting on the database holds an app worker.
CONNECT_TIMEOUT = 3  # seconds, libpq's and PyMySQL's connect_timeout
STATEMENT_TIMEOUT_MS = 5000  # PostgreSQL statement_timeout (PyMySQL: read/write timeouts 3 s)
# Operator calls (QuotaAdmin) get less, per transaction, on any PostgreSQL engine.
ADMIN_STATEMENT_TIMEOUT_MS = 2000
MYSQL_LOCK_WAIT = 2  # seconds, innodb_lock_wait_timeout (InnoDB's default is 50)
POOL_TIMEOUT = 2.0  # seconds to wait for a pooled connection
SQLITE_BUSY_TIMEOUT = 3.0  # seconds a SQLite writer waits for another's lock
# Counters in these are shared between servers (a unix socket is one server's Redis).
_SHARED_COUNTERS = ("redis", "rediss", "redis+sentinel", "redis+cluster")


class TablesMissing(RuntimeError):
    """The host's database has no quota tables yet."""


class KeysUnavailable(RuntimeError):
    """An API key cannot be checked now: no snapshot of the clients has loaded yet.

    The extension then serves the request as anonymous, and never refuses it with
    401 (``QUOTA_REJECT_UNKNOWN_KEYS``): the key may well be a paying client's.
    """


@dataclass(frozen=True)
class SyncHealth:
    """How current this process's copy of the quota tables is (``SqlStore.health()``)."""

    started: bool  # the sync runs in this process
    loaded: bool  # a snapshot from the database is served (else: the configured plans)
    age: float | None  # seconds since it was last confirmed current (or since start)
    stale: bool  # age beyond STALE_AFTER: changes made since may not apply here
    stale_events: int  # how often it went stale in this process
    error: str | None  # why the last sync attempt failed, while they fail


class _Sync:
    """One process's sync thread and what it has observed (reset at fork)."""

    def __init__(self) -> None:
        self.started_at = time.monotonic()
        self.error: str | None = None
        self.first_done = threading.Event()  # the first attempt ended, well or not
        self.stop = threading.Event()
        self.failing = False  # as last logged
        self.stale = False  # as last logged
        self.stale_events = 0
        self.thread: threading.Thread | None = None  # the supervisor
        self.attempt: threading.Thread | None = None  # the attempt it watches


class SqlStore:
    """Plans, clients and overrides in SQL, served to requests from a snapshot.

    With ``db`` (the host's Flask-SQLAlchemy) the tables live in the host's
    database and the host creates them (migrations or ``db.create_all()``).
    Without it the store owns an engine for ``QUOTA_DATABASE_URL`` (default: a
    SQLite file in the instance folder) and creates the tables on first use.
    """

    def __init__(self, settings: Settings, *, db: SQLAlchemy | None, instance_path: str) -> None:
        if db is not None and settings.database_url is not None:
            raise ValueError(
                "QUOTA_DATABASE_URL is set, but Quota(app, db=db) keeps the quota tables in "
                "db's database: remove QUOTA_DATABASE_URL or the db= argument"
            )
        for name in settings.plans:
            # The tables (and the dashboard's URLs) accept only these names: refused at
            # init_app rather than when the first seed fails in the background.
            try:
                validators.plan_name(name)
            except ValueError as exc:
                raise ValueError(f"QUOTA_PLANS: {exc}") from None
        self.settings = settings
        self._db = db
        self.owns_engine = db is None
        self.url = settings.database_url or _default_url(instance_path)
        # The implicit default file: made only when something needs SQL.
        self._default_file: Path | None = None
        if db is None and settings.database_url is None:
            self._default_file = Path(instance_path) / DEFAULT_DATABASE_FILE
        self._wanted = self._default_file is None  # start the sync when asked to
        self._next_look = 0.0  # when a request may next look for the default file
        self._app: weakref.ref[Flask] | None = None  # with db=: whose app context to use
        self._engine: Engine | None = None
        self._current: SqlCatalog | None = None  # served while this process's sync runs
        self._last: SqlCatalog | None = None  # the newest snapshot loaded (kept at fork)
        self._fresh_at: float | None = None  # monotonic time it was last confirmed current
        self._sync: _Sync | None = None
        self._ready = False
        self._ready_failures = 0  # failed table setups in this process, and the last one's error
        self._ready_error: BaseException | None = None
        self._warned_local = False
        self._warned_keys = False
        self._lock = threading.Lock()  # guards the engine
        self._start_lock = threading.Lock()  # one sync per process
        self._swap_lock = threading.Lock()  # never replace a snapshot with an older one
        self._ready_lock = threading.Lock()  # one table setup at a time in this process
        self._listeners: list[Callable[[], None]] = []
        self._ready_listeners: list[Callable[[], None]] = []
        if db is not None:
            # The host's `db.create_all()` and `flask db migrate` then include our tables.
            copy_tables(db.metadata)
        _STORES.add(self)

    # -- engine -------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """Our own engine, or the host's ``db.engine`` (resolved in the app's context)."""
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    self._engine = self._make_engine()
        return self._engine

    def _make_engine(self) -> Engine:
        if self._db is None:
            return _own_engine(self.url)
        app = self._app() if self._app is not None else None
        if app is None or has_app_context():
            return self._db.engine
        with app.app_context():  # the sync thread has no context of its own
            return self._db.engine

    # -- starting -----------------------------------------------------------

    def autostart(self, app: Flask, *, needed: bool = False) -> None:
        """Called by ``init_app``: start the sync in the background if the tables are
        wanted (``needed``: e.g. the dashboard is mounted). Never inside a ``flask``
        command, whose migrations must find the database untouched; nor before the
        host's Flask-SQLAlchemy is set up on ``app`` (``db=``). The first request
        starts it then."""
        if self._db is not None:
            self._app = weakref.ref(app)
        if needed or (self._default_file is not None and self._default_file.is_file()):
            self._wanted = True
        host_ready = self._db is None or "sqlalchemy" in app.extensions
        if self._wanted and host_ready and click.get_current_context(silent=True) is None:
            self.start()

    def start(self) -> None:
        """Load the snapshot and keep it current, in a background thread; idempotent.

        Returns at once: until the first load, requests get the configured plans.
        """
        with self._start_lock:
            if self._sync is not None:
                return
            self._wanted = True
            if not self._warned_local:
                self._warned_local = True
                warning = local_database_warning(
                    self.settings.storage_url, self.url if self.owns_engine else None
                )
                if warning is not None:
                    log.warning(warning)
            sync = _Sync()
            sync.thread = threading.Thread(
                target=_supervise,
                args=(weakref.ref(self), sync, self.settings.sync_interval),
                name="flask-quota-sync",
                daemon=True,
            )
            self._sync = sync
            sync.thread.start()

    def _may_start(self, *, look: bool) -> bool:
        """Whether the tables are wanted; for the default file, whether it exists now
        (looked at once per interval, or now with ``look``)."""
        if self._wanted or self._default_file is None:
            return self._wanted
        now = time.monotonic()
        if look or now >= self._next_look:
            self._next_look = now + self.settings.sync_interval
            if self._default_file.is_file():
                self._wanted = True
        return self._wanted

    # -- the request path ---------------------------------------------------

    def catalog(self) -> PlanCatalog:
        """What requests are limited by: the snapshot, an attribute read once loaded."""
        current = self._current
        return current if current is not None else self._cold()

    def _cold(self) -> PlanCatalog:
        # Not serving a snapshot of this process's sync yet: never wait for SQL.
        if self._sync is None and self._may_start(look=False):
            self.start()
        last = self._last
        return last if last is not None else self.settings.plans

    def identify(self, api_key: str) -> Identity | None:
        """The live client owning ``api_key`` (from the snapshot), else ``None``.

        Raises ``KeysUnavailable`` while no snapshot has loaded: the key can be
        neither accepted nor refused.
        """
        snapshot = self._current
        if snapshot is None:
            snapshot = self._keys_snapshot()
            if snapshot is None:
                return None
        return snapshot.identify(api_key)

    def _keys_snapshot(self) -> SqlCatalog | None:
        if self._sync is None:
            if not self._may_start(look=True):
                return None  # no database at all, so no client: the key is unknown
            self.start()
        sync = self._sync
        if self._last is None and sync is not None:
            sync.first_done.wait(max(0.0, sync.started_at + FIRST_LOAD_GRACE - time.monotonic()))
        last = self._last
        if last is None:
            if not self._warned_keys:
                self._warned_keys = True
                log.warning(
                    "flask-quota: API keys cannot be verified until the quota database at %s "
                    "answers: they are served as anonymous, and not refused even with "
                    "QUOTA_REJECT_UNKNOWN_KEYS",
                    self.display_url,
                )
            raise KeysUnavailable("no snapshot of the clients has loaded yet")
        return last

    # -- health -------------------------------------------------------------

    def health(self) -> SyncHealth:
        """How current the served snapshot is, for dashboards and readiness probes."""
        sync = self._sync
        if sync is None:
            return SyncHealth(False, self._last is not None, None, False, 0, None)
        age = self._age(sync)
        return SyncHealth(
            True, self._last is not None, age, age > STALE_AFTER, sync.stale_events, sync.error
        )

    def wait_loaded(self, timeout: float) -> bool:
        """Wait until the first sync attempt has ended (at most ``timeout`` seconds);
        True if a snapshot is loaded. For start-up scripts, never for requests."""
        sync = self._sync
        if sync is not None:
            sync.first_done.wait(timeout)
        return self._last is not None

    def _age(self, sync: _Sync) -> float:
        fresh = self._fresh_at
        return time.monotonic() - (fresh if fresh is not None else sync.started_at)

    def _attempt(self, sync: _Sync) -> None:
        """One sync attempt, in a thread of its own (it may hang on a hung database)."""
        began = time.monotonic()
        try:
            if sync.stop.is_set():
                return
            self.ensure_ready()
            self.refresh()
        except Exception as exc:  # the supervisor logs it; requests keep the snapshot
            sync.error = _one_line(exc)
        else:
            sync.error = None
            self._fresh_at = began
        finally:
            sync.first_done.set()

    def _observe(self, sync: _Sync, running_for: float) -> None:
        """Log changes of state, once each (called by the supervisor every interval)."""
        problem = sync.error
        if problem is None and running_for > STALE_AFTER:
            problem = f"no reply for {running_for:.0f} s"
        if problem is not None and not sync.failing:
            sync.failing = True
            serving = (
                "the snapshot loaded before"
                if self._last is not None
                else "the configured plans, with API keys served as anonymous,"
            )
            log.warning(
                "flask-quota: the quota database at %s does not answer (%s); serving %s "
                "until it does",
                self.display_url, problem, serving,
            )  # fmt: skip
        elif problem is None and sync.failing:
            sync.failing = False
            log.warning("flask-quota: the quota database at %s answers again", self.display_url)
        age = self._age(sync)
        if age > STALE_AFTER and not sync.stale:
            sync.stale = True
            sync.stale_events += 1
            if self._last is not None:
                log.warning(
                    "flask-quota: the quota snapshot is %.0f s old: plans, clients and "
                    "overrides changed since then are not applied by this process",
                    age,
                )
            else:
                log.warning(
                    "flask-quota: no quota snapshot has loaded %.0f s after start: "
                    "serving the configured plans",
                    age,
                )
        elif age <= STALE_AFTER and sync.stale:
            sync.stale = False
            log.info("flask-quota: the quota snapshot is current again")

    # -- schema and seed ----------------------------------------------------

    def ensure_ready(self) -> None:
        """Create the tables (own engine only), seed plans and the version row; idempotent.

        Many workers may start at once on a fresh database: PostgreSQL serialises
        them with an advisory lock, MySQL with a named lock; on SQLite a loser
        retries after the winner. A slow failure is no such race (the database is
        down): it is not retried.
        Within a process, callers (the sync, the CLI, the dashboard) take turns;
        one that waits ``CONNECT_TIMEOUT`` behind another stuck on a hung database
        gives up with ``sqlalchemy.exc.TimeoutError`` rather than trying again itself.
        """
        if self._ready:
            return
        failures = self._ready_failures
        if not self._ready_lock.acquire(timeout=CONNECT_TIMEOUT):
            # Another caller has waited that long on the database: do not stack on it.
            raise SqlTimeout(
                f"the quota database at {self.display_url} is still being set up by another "
                f"request after {CONNECT_TIMEOUT} s (connecting, or creating its tables): "
                "try again shortly"
            )
        made = False
        try:
            if not self._ready:
                if self._ready_failures != failures:
                    # It failed while we waited: its answer is ours, without a second wait.
                    raise SqlTimeout(f"the quota database did not answer: {self._ready_error}")
                try:
                    self._create_and_seed()
                except DBAPIError as exc:  # the database failed (not: tables missing)
                    self._ready_failures += 1
                    self._ready_error = exc
                    raise
                made = True
        finally:
            self._ready_lock.release()
        if made:
            for listener in self._ready_listeners:
                try:
                    listener()
                except Exception as exc:
                    log.error("flask-quota: start-up plan check failed: %s", _one_line(exc))

    def on_ready(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` once in this process, when the tables are first ready
        (the plans-source check of ``plansync.at_start``)."""
        self._ready_listeners.append(listener)

    def _create_and_seed(self) -> None:
        began = time.monotonic()
        for attempt in range(5):
            try:
                with _mysql_setup_lock(self.engine), self.engine.begin() as conn:
                    if conn.dialect.name == "postgresql":
                        conn.execute(
                            text("SELECT pg_advisory_xact_lock(:id)"), {"id": _INIT_LOCK_ID}
                        )
                    if not inspect(conn).has_table(QuotaMeta.__tablename__):
                        if not self.owns_engine:
                            raise TablesMissing(
                                "flask-quota's tables are missing from the database of "
                                "Quota(app, db=db): run `flask db migrate -m 'quota tables'` "
                                "and `flask db upgrade` (or call db.create_all())"
                            )
                        metadata.create_all(conn)
                        _stamp(conn)
                    elif self.owns_engine and _unfinished(conn):
                        metadata.create_all(conn)  # only the missing tables (checkfirst)
                        _stamp(conn)
                with Session(self.engine) as session, session.begin():
                    self._seed(session)
                break
            except DBAPIError:
                if attempt == 4 or time.monotonic() - began > 1.0:
                    raise
                time.sleep(0.05 * (attempt + 1) + random.random() * 0.05)
        self._ready = True
        self._wanted = True  # the tables exist now: requests of this process may use them

    def _seed(self, session: Session) -> None:
        if session.scalar(select(func.count()).select_from(PlanRecord)) == 0:
            seed = self.settings.plans  # QUOTA_PLANS, or DEFAULT_PLANS
            for position, name in enumerate(seed):
                session.add(plan_record(seed[name], position))
        if session.get(QuotaMeta, 1) is None:
            session.add(QuotaMeta(id=1, version=1))

    # -- reading ------------------------------------------------------------

    def load(self) -> SqlCatalog:
        """Read every table into a new snapshot.

        The version is read first: a change committed meanwhile has a newer
        version, so the next poll reloads again and nothing is missed.
        """
        self.ensure_ready()
        with Session(self.engine) as session:
            version = session.scalar(select(QuotaMeta.version).where(QuotaMeta.id == 1)) or 0
            records = session.scalars(
                select(PlanRecord)
                .options(selectinload(PlanRecord.limits))
                .order_by(PlanRecord.position, PlanRecord.id)
            ).all()
            plans = [plan_from_record(record) for record in records]
            keys: dict[str, list[KeyEntry]] = defaultdict(list)
            clients: dict[str, str] = {}
            live = session.execute(
                select(
                    Client.id, Client.key_prefix, Client.key_salt, Client.key_hash, PlanRecord.name
                )
                .join(PlanRecord, Client.plan_id == PlanRecord.id)
                .where(Client.revoked_at.is_(None))
            ).all()
            for client_id, prefix, salt, digest, plan_name in live:
                keys[prefix].append(KeyEntry(str(client_id), plan_name, salt, digest))
                clients[str(client_id)] = plan_name
            overrides: dict[str, list[OverrideRule]] = defaultdict(list)
            for row in session.scalars(
                select(Override).join(Client).where(Client.revoked_at.is_(None))
            ):
                rule = _rule(row)
                if rule is not None and rule.live(time.time()):
                    overrides[str(row.client_id)].append(rule)
        if not plans:
            configured = list(self.settings.plans.values())
            return SqlCatalog(configured, upgrade_url=self.settings.upgrade_url, version=-1)
        for key in ("default_plan", "anonymous_plan"):
            name = getattr(self.settings, key)
            if name not in {plan.name for plan in plans}:
                log.warning(
                    "flask-quota: QUOTA_%s=%r is not a plan in the database; using %r",
                    key.upper(), name, plans[0].name,
                )  # fmt: skip
        return SqlCatalog(
            plans,
            upgrade_url=self.settings.upgrade_url,
            version=version,
            keys={prefix: tuple(entries) for prefix, entries in keys.items()},
            overrides={client: tuple(rules) for client, rules in overrides.items()},
            clients=clients,
        )

    def version(self) -> int:
        """The version number every change bumps."""
        self.ensure_ready()
        with self.engine.connect() as conn:
            return conn.scalar(select(QuotaMeta.version).where(QuotaMeta.id == 1)) or 0

    def refresh(self) -> bool:
        """Reload the snapshot if the database's version moved; True if it did.

        Then every ``on_change`` listener runs (the deny cache forgets its denials).
        """
        last = self._last
        if last is not None and self.version() == last.version:
            return False
        self._swap(self.load())
        return True

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` in each process whenever it sees the version move."""
        self._listeners.append(listener)

    def _swap(self, snapshot: SqlCatalog) -> None:
        # One attribute store: requests see the old or the new snapshot, whole. A
        # slow load may end after a newer one (the sync's and a change's): keep the newer.
        with self._swap_lock:
            last = self._last
            if last is not None and snapshot.version < last.version:
                return
            moved = last is not None and snapshot.version != last.version
            self._last = snapshot
            if self._sync is not None:
                self._current = snapshot
        if moved:
            for listener in self._listeners:
                listener()

    # -- writing ------------------------------------------------------------

    @contextmanager
    def change(self) -> Iterator[Session]:
        """A transaction for a change; it bumps ``quota_meta.version`` before committing.

        Every writer (CLI, dashboard) goes through here, so every process sees
        the change at its next poll; this process, if it serves, sees it at once.
        """
        self.ensure_ready()
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            _sqlite_write_lock(session)
            yield session
            session.flush()
            session.execute(
                update(QuotaMeta).where(QuotaMeta.id == 1).values(version=QuotaMeta.version + 1)
            )
        if self._sync is not None:
            try:
                self.refresh()
            except Exception as exc:  # the change is committed: the next poll brings it
                log.warning(
                    "flask-quota: change saved, but reloading it failed (%s); "
                    "it applies at the next sync",
                    _one_line(exc),
                )

    def bump(self) -> None:
        """Tell every process that quotas changed outside the tables (a reset, an unblock).

        Each process reloads at its next poll and runs its ``on_change`` listeners,
        so no worker keeps answering from a local denial the change made stale.
        """
        with self.change():
            pass

    def session(self) -> Session:
        """A session for reading the tables (``with store.session() as s: ...``)."""
        self.ensure_ready()
        return Session(self.engine)

    # -- lifecycle ----------------------------------------------------------

    @property
    def display_url(self) -> str:
        """The database's URL without its password, for messages."""
        if not self.owns_engine:
            return "the database of Quota(app, db=db)"
        return make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        """Stop the sync and release our own engine (tests and app teardown)."""
        sync, self._sync = self._sync, None
        self._current = None
        if sync is not None:
            sync.stop.set()
            # The engine must outlive a running attempt: an in-memory SQLite's one
            # connection is closed under it otherwise. A hung one is left behind.
            for thread in (sync.thread, sync.attempt):
                if thread is not None and thread is not threading.current_thread():
                    thread.join(timeout=5)
        if self.owns_engine and self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _after_fork(self) -> None:
        # Threads do not survive fork and pooled connections must not be shared. The
        # child serves the parent's last snapshot until its own sync (started by its
        # first request) has loaded one.
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._swap_lock = threading.Lock()
        self._ready_lock = threading.Lock()
        self._sync = None
        self._current = None
        if self.owns_engine and self._engine is not None:
            self._engine.dispose(close=False)


def local_database_warning(storage_url: str, database_url: str | None) -> str | None:
    """The start-up warning for counters shared between servers (Redis) beside a quota
    database local to this server (SQLite), or ``None``. ``database_url`` is ``None``
    for the host's database (``db=``), which is the host's choice."""
    scheme = SCHEMES.get(storage_url.split("://", 1)[0].strip().lower())
    if scheme not in _SHARED_COUNTERS or database_url is None:
        return None
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        return None
    where = url.database or "in memory"
    return (
        f"flask-quota: QUOTA_STORAGE_URL shares counters between servers, but plans, clients "
        f"and overrides are in the local SQLite database {where}: a change made on one "
        "server is not seen by the others. Set QUOTA_DATABASE_URL to a database every "
        "server reaches (e.g. postgresql+psycopg2://...) or pass Quota(app, db=db)."
    )


# -- plans <-> rows ---------------------------------------------------------


def plan_record(plan: Plan, position: int) -> PlanRecord:
    """Rows for a configured plan (used to seed an empty plan table)."""
    record = PlanRecord(
        name=plan.name, description=plan.description, upgrade_hint=plan.upgrade, position=position
    )
    record.limits.extend(limit_rows(plan))
    return record


def limit_rows(plan: Plan) -> list[PlanLimit]:
    """New ``PlanLimit`` rows for every limit of ``plan``, with algorithm and shadow."""
    rows = []
    for tier, resource, rates in plan_limits(plan):
        mode = plan.mode_for(tier, resource)
        algorithm = mode.algorithm.value if mode.algorithm is not None else None
        rows.append(
            PlanLimit(
                tier=tier.value,
                resource=resource,
                rate=str(rates),
                algorithm=algorithm,
                shadow=mode.shadow,
            )
        )
    return rows


def plan_limits(plan: Plan) -> list[tuple[Tier, str, Rates]]:
    """(tier, resource or "", rates) of every limit of ``plan``."""
    limits = [(Tier.GLOBAL, "", plan.global_rate), (Tier.USER, "", plan.user_rate)]
    limits += [(Tier.ENDPOINT, resource, rates) for resource, rates in plan.resources.items()]
    return [(tier, resource, rates) for tier, resource, rates in limits if rates is not None]


def plan_from_record(record: PlanRecord) -> Plan:
    """The ``Plan`` a row and its limits describe (with each limit's algorithm and shadow)."""
    rates: dict[tuple[str, str], Rates] = {}
    modes: dict[tuple[str, str], LimitMode] = {}
    for limit in record.limits:
        where = f"plan {record.name!r} {limit.tier} {limit.resource}"
        rate = _parse_stored(limit.rate, where)
        if rate is None:
            continue
        rates[(limit.tier, limit.resource)] = rate
        mode = LimitMode(_stored_algorithm(limit.algorithm, where), bool(limit.shadow))
        if not mode.default:
            modes[(limit.tier, limit.resource)] = mode
    return Plan(
        record.name,
        rates.get((Tier.GLOBAL.value, "")),
        rates.get((Tier.USER.value, "")),
        {res: rate for (tier, res), rate in rates.items() if tier == Tier.ENDPOINT.value},
        record.description or "",
        record.upgrade_hint,
        modes,
    )


def _stored_algorithm(name: str | None, where: str) -> Algorithm | None:
    # Validated on write; a row edited by hand into nonsense falls back to QUOTA_ALGORITHM.
    if name is None:
        return None
    try:
        return Algorithm(name)
    except ValueError:
        log.error("flask-quota: %s has unknown algorithm %r; using QUOTA_ALGORITHM", where, name)
        return None


def _rule(row: Override) -> OverrideRule | None:
    rate = _parse_stored(row.rate, f"override {row.id}")
    if rate is None:
        return None
    expires = row.expires_at.timestamp() if row.expires_at is not None else None
    return OverrideRule(Tier(row.tier), row.resource, rate, expires)


def _parse_stored(text_: str, what: str) -> Rates | None:
    # Rates are validated on write; a row edited by hand into nonsense is skipped, not fatal.
    try:
        return parse_rates(text_)
    except ValueError as exc:
        log.error("flask-quota: ignoring %s: %s", what, exc)
        return None


# -- engine, stamp, poller ----------------------------------------------------


def _default_url(instance_path: str) -> str:
    return f"sqlite:///{Path(instance_path) / DEFAULT_DATABASE_FILE}"


def _own_engine(url: str) -> Engine:
    """An engine whose every call is bounded in time (see the module docstring)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(
            url,
            pool_pre_ping=True,
            pool_size=2,
            max_overflow=4,
            pool_timeout=POOL_TIMEOUT,
            connect_args=_libpq_bounds(parsed) | _pymysql_bounds(parsed),
        )
    sqlite_args = {"timeout": SQLITE_BUSY_TIMEOUT, "check_same_thread": False}
    database = parsed.database or ""
    if database in ("", ":memory:"):
        # One shared in-memory database for every thread of this process.
        return create_engine(url, poolclass=StaticPool, connect_args=sqlite_args)
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _libpq_bounds(url: URL) -> dict[str, Any]:
    """Connect, statement and TCP timeouts for libpq drivers; the URL's own settings win.

    ``statement_timeout`` goes in the startup ``options``; a URL that names its own
    ``options`` (e.g. for a pooler that refuses them) keeps exactly those.
    """
    driver = url.get_driver_name()
    if url.get_backend_name() != "postgresql" or driver not in ("psycopg2", "psycopg"):
        return {}
    bounds: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT,
        # A dead peer is noticed on an idle connection after 10 + 3 x 5 s ...
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
    }
    if _libpq_version(driver) >= 120000:
        bounds["tcp_user_timeout"] = 10_000  # ... and on a busy one after 10 s (ms)
    return {key: value for key, value in bounds.items() if key not in url.query}


def _pymysql_bounds(url: URL) -> dict[str, Any]:
    """Connect, read and write timeouts and a short lock wait for PyMySQL; the URL's
    own settings win. A read timeout also ends a call to a server that went silent."""
    if url.get_backend_name() not in ("mysql", "mariadb") or url.get_driver_name() != "pymysql":
        return {}
    # PyMySQL reads the server's greeting under read_timeout: it bounds connecting too.
    bounds: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT,
        "read_timeout": CONNECT_TIMEOUT,
        "write_timeout": CONNECT_TIMEOUT,
        "init_command": f"SET SESSION innodb_lock_wait_timeout = {MYSQL_LOCK_WAIT}",
    }
    return {key: value for key, value in bounds.items() if key not in url.query}


def _libpq_version(driver: str) -> int:
    """The libpq the driver runs on, e.g. 170000; 0 if unknown."""
    try:
        if driver == "psycopg2":
            return int(importlib.import_module("psycopg2.extensions").libpq_version())
        return int(importlib.import_module("psycopg").pq.version())
    except (ImportError, AttributeError):
        return 0


def _sqlite_write_lock(session: Session) -> None:
    """On SQLite, take the write lock when a change begins (``BEGIN IMMEDIATE``).

    The driver would begin at the first write, after the change has read the state it
    audits as "before": two changes could both read it, and the later one would
    overwrite the earlier unseen. Other databases lock the rows a change reads.
    """
    conn = session.connection()
    if conn.dialect.name != "sqlite":
        return
    raw = conn.connection.dbapi_connection
    if raw is not None and not getattr(raw, "in_transaction", True):
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # waits up to the busy timeout


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL: readers (every worker's poller) never block the writer (the CLI).
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _unfinished(conn: Any) -> bool:
    """A fresh setup cut short: some tables and no revision stamp yet.

    SQLite runs DDL outside the transaction, so a worker whose creation failed part way
    (a racer held the write lock) leaves the first tables behind; the stamp comes last.
    A stamped database with a table missing is a migration's business, not ours.
    """
    names = set(inspect(conn).get_table_names())
    if set(metadata.tables) <= names:
        return False
    if VERSION_TABLE not in names:
        return True
    return bool(conn.scalar(text(f"SELECT COUNT(*) FROM {VERSION_TABLE}")) == 0)


def _stamp(conn: Any) -> None:
    """Record the Alembic revision the new tables correspond to (see models.SCHEMA_REVISION)."""
    table = Table(
        VERSION_TABLE,
        MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
    )
    table.create(conn, checkfirst=True)
    if conn.scalar(select(func.count()).select_from(table)) == 0:
        conn.execute(table.insert().values(version_num=SCHEMA_REVISION))


@contextmanager
def _mysql_setup_lock(engine: Engine) -> Iterator[None]:
    """On MySQL / MariaDB, one process at a time creates and stamps a fresh database.

    Their DDL commits as it goes, so a racer could see half the tables; and they have
    no transaction-scoped advisory lock (PostgreSQL's), so a named lock (one per
    database) is held, on a connection of its own, until the setup has committed.
    """
    if engine.dialect.name != "mysql":
        yield
        return
    with engine.connect() as holder:
        # 0 after the timeout: go on regardless, a loser then retries like on SQLite.
        holder.execute(
            text("SELECT GET_LOCK(CONCAT(:name, SHA1(DATABASE())), :timeout)"),
            {"name": _INIT_LOCK_NAME, "timeout": CONNECT_TIMEOUT},
        )
        try:
            yield
        finally:
            holder.execute(
                text("SELECT RELEASE_LOCK(CONCAT(:name, SHA1(DATABASE())))"),
                {"name": _INIT_LOCK_NAME},
            )


def _supervise(ref: weakref.ref[SqlStore], sync: _Sync, interval: float) -> None:
    """Body of each process's sync thread; it ends when its store is closed or collected.

    Each attempt runs in a short-lived thread of its own, one at a time: an attempt
    stuck on a hung database delays no other work, and is seen and logged here.
    """
    attempt_began = 0.0
    while True:
        store = ref()
        if store is None:
            return
        try:
            if sync.attempt is None or not sync.attempt.is_alive():
                sync.attempt = threading.Thread(
                    target=store._attempt,
                    args=(sync,),
                    name="flask-quota-sync-attempt",
                    daemon=True,
                )
                attempt_began = time.monotonic()
                sync.attempt.start()
            store._observe(sync, time.monotonic() - attempt_began)
        except Exception:  # the thread must outlive anything
            log.exception("flask-quota: the quota sync thread hit an error")
        finally:
            del store
        if sync.stop.wait(interval):
            return


def sql_reason(exc: BaseException) -> str:
    """What a database error says, on one line: the driver's own message (``orig``)
    when there is one, its first line (a driver's message may span several), or ""."""
    reason = str(getattr(exc, "orig", None) or exc).strip()
    return reason.splitlines()[0] if reason else ""


def _one_line(exc: BaseException) -> str:
    """An error as one short line with its type, for logs and the sync status."""
    return f"{type(exc).__name__}: {sql_reason(exc)}"[:300]


_STORES: weakref.WeakSet[SqlStore] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for store in list(_STORES):
        store._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
