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
bounded (connect, statement and pool timeouts, TCP keepalives: ``engine``). The sync runs each
attempt in a thread of its own and watches it, so a database that hangs is noticed
and logged like one that fails, once per change of state; ``health()`` tells how
old the served snapshot is. Before the first load, requests get the configured
plans, and an API key that cannot be verified yet is served as anonymous, never
refused (``KeysUnavailable``); only keyed requests in the sync's first second wait
for the first load, and at most until that second is over.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click
from flask import Flask, has_app_context
from sqlalchemy import Engine, inspect, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as SqlTimeout
from sqlalchemy.orm import Session, selectinload

from ..core import validators
from ..core.identity import Identity
from ..core.networks import NetworkRules
from ..core.plans import PlanCatalog
from ..settings import Settings
from . import schema
from .engine import CONNECT_TIMEOUT, local_database_warning, own_engine, sqlite_write_lock
from .errors import KeysUnavailable, one_line
from .mapping import key_entry, network_rule, override_rule, plan_from_record
from .models import Client, NetworkRecord, Override, PlanRecord, QuotaMeta, copy_tables, utcnow
from .snapshot import KeyEntry, OverrideRule, SqlCatalog
from .sync import FIRST_LOAD_GRACE, STALE_AFTER, Sync, SyncHealth, supervise

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = ["DEFAULT_DATABASE_FILE", "SqlStore"]

log = logging.getLogger("flask_quota")

DEFAULT_DATABASE_FILE = "flask_quota.sqlite3"

_NetworkRows = tuple[tuple[str, str, datetime | None], ...]  # (cidr, action, expires_at)


class SqlStore:
    """Plans, clients, overrides and network rules in SQL, served to requests from a
    snapshot.

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
        # The newest snapshot's network rules, None when it has none: what the request
        # edge reads (``flask_quota.networks``), one attribute, set with ``_last``.
        self.networks: NetworkRules | None = None
        self._fresh_at: float | None = None  # monotonic time it was last confirmed current
        self._sync: Sync | None = None
        self._ready = False
        self._ready_failures = 0  # failed table setups in this process, and the last one's error
        self._ready_error: BaseException | None = None
        self._warned_local = False
        self._warned_keys = False
        self._warned_networks = False
        # The network rows last loaded, and the rules made of them (see ``_networks``).
        self._network_rows: tuple[_NetworkRows, NetworkRules | None] | None = None
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
            return own_engine(self.url)
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
            sync = Sync()
            sync.thread = threading.Thread(
                target=supervise,
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

    def _age(self, sync: Sync) -> float:
        fresh = self._fresh_at
        return time.monotonic() - (fresh if fresh is not None else sync.started_at)

    def _attempt(self, sync: Sync) -> None:
        """One sync attempt, in a thread of its own (it may hang on a hung database)."""
        began = time.monotonic()
        try:
            if sync.stop.is_set():
                return
            self.ensure_ready()
            self.refresh()
        except Exception as exc:  # the supervisor logs it; requests keep the snapshot
            sync.error = one_line(exc)
        else:
            sync.error = None
            self._fresh_at = began
        finally:
            sync.first_done.set()

    def _observe(self, sync: Sync, running_for: float) -> None:
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

        Racing workers on a fresh database are ``schema.create_and_seed``'s business.
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
                    log.error("flask-quota: start-up plan check failed: %s", one_line(exc))

    def on_ready(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` once in this process, when the tables are first ready
        (the plans-source check of ``plansync.at_start``)."""
        self._ready_listeners.append(listener)

    def _create_and_seed(self) -> None:
        schema.create_and_seed(self.engine, owns_engine=self.owns_engine, plans=self.settings.plans)
        self._ready = True
        self._wanted = True  # the tables exist now: requests of this process may use them

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
            billing_days: dict[str, int] = {}
            client_tenants: dict[str, str] = {}
            live = session.execute(
                select(
                    Client.id, Client.key_prefix, Client.key_salt, Client.key_hash,
                    PlanRecord.name, Client.tenant, Client.billing_day,
                )
                .join(PlanRecord, Client.plan_id == PlanRecord.id)
                .where(Client.revoked_at.is_(None))
            ).all()  # fmt: skip
            for client_id, prefix, salt, digest, plan_name, tenant, billing_day in live:
                keys[prefix].append(key_entry(client_id, plan_name, salt, digest, tenant))
                clients[str(client_id)] = plan_name
                if billing_day is not None:
                    billing_days[str(client_id)] = billing_day
                if tenant is not None:
                    client_tenants[str(client_id)] = tenant
            overrides: dict[str, list[OverrideRule]] = defaultdict(list)
            tenant_overrides: dict[str, list[OverrideRule]] = defaultdict(list)
            for row in session.scalars(
                select(Override)
                .outerjoin(Client)
                .where(Client.revoked_at.is_(None) | Override.client_id.is_(None))
            ):
                rule = override_rule(row)
                if rule is None or not rule.live(time.time()):
                    continue
                if row.client_id is not None:
                    overrides[str(row.client_id)].append(rule)
                elif row.tenant is not None:
                    tenant_overrides[row.tenant].append(rule)
            networks = self._networks(session)
        if not plans:
            configured = list(self.settings.plans.values())
            return SqlCatalog(
                configured, upgrade_url=self.settings.upgrade_url, version=-1, networks=networks
            )
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
            tenant_overrides={tenant: tuple(rules) for tenant, rules in tenant_overrides.items()},
            clients=clients,
            client_tenants=client_tenants,
            billing_days=billing_days,
            networks=networks,
        )

    def _networks(self, session: Session) -> NetworkRules | None:
        """The unexpired network rules, matched by requests in-process; None for none.

        The host's database (``db=``) may predate the table: its plans and keys still
        load, and the network rules are off (said once) until its migration adds it."""
        if not self.owns_engine and not inspect(session.connection()).has_table(
            NetworkRecord.__tablename__
        ):
            if not self._warned_networks:
                self._warned_networks = True
                log.warning(
                    "flask-quota: the database of Quota(app, db=db) has no %s table, so "
                    "network rules are off: run `flask db migrate -m 'quota networks'` and "
                    "`flask db upgrade`",
                    NetworkRecord.__tablename__,
                )
            return None
        now = utcnow()
        columns = (NetworkRecord.cidr, NetworkRecord.action, NetworkRecord.expires_at)
        rows = tuple(
            (cidr, action, expires_at)
            for cidr, action, expires_at in session.execute(
                select(*columns).order_by(NetworkRecord.id)
            )
            if expires_at is None or expires_at > now
        )
        # A reload for another table's change keeps the rules it has: parsing and indexing
        # 100,000 of them costs a worker about a second.
        kept = self._network_rows
        if kept is not None and kept[0] == rows:
            return kept[1]
        rules = [rule for row in rows if (rule := network_rule(*row)) is not None]
        networks = NetworkRules(rules) if rules else None
        self._network_rows = (rows, networks)
        return networks

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
            self.networks = snapshot.networks
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
            sqlite_write_lock(session)
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
                    one_line(exc),
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


def _default_url(instance_path: str) -> str:
    return f"sqlite:///{Path(instance_path) / DEFAULT_DATABASE_FILE}"


_STORES: weakref.WeakSet[SqlStore] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for store in list(_STORES):
        store._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
