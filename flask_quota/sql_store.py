"""Where the quota tables live, and how each process keeps a fresh copy of them.

Requests never query SQL. The first request of a process loads a
``SqlCatalog`` snapshot; from then on a daemon thread reads one number,
``quota_meta.version``, every ``QUOTA_SYNC_INTERVAL`` seconds and reloads the
snapshot when it moved. Every change bumps that number in its own transaction
(``SqlStore.change``), so a change made by any process on any server reaches
every worker within the interval plus one reload, and costs requests nothing.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.pool import StaticPool

from .identity import Identity
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
from .plans import Plan
from .rates import Rates, parse_rates
from .settings import Settings
from .snapshot import KeyEntry, OverrideRule, SqlCatalog
from .tiers import Tier

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = ["DEFAULT_DATABASE_FILE", "VERSION_TABLE", "SqlStore", "TablesMissing"]

log = logging.getLogger("flask_quota")

DEFAULT_DATABASE_FILE = "flask_quota.sqlite3"
# Our own Alembic version table, so that a host's ``alembic_version`` is never touched.
VERSION_TABLE = "quota_alembic_version"
_INIT_LOCK_ID = 0x71756F7461  # "quota": pg_advisory_xact_lock key for first-time setup


class TablesMissing(RuntimeError):
    """The host's database has no quota tables yet."""


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
        self.settings = settings
        self._db = db
        self.owns_engine = db is None
        self.url = settings.database_url or _default_url(instance_path)
        self._engine: Engine | None = None
        self._snapshot: SqlCatalog | None = None
        self._ready = False
        self._lock = threading.Lock()  # guards the engine
        self._start_lock = threading.Lock()  # one first load per process
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._listeners: list[Callable[[], None]] = []
        if db is not None:
            # The host's `db.create_all()` and `flask db migrate` then include our tables.
            copy_tables(db.metadata)
        _STORES.add(self)

    # -- engine -------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """Our own engine, or the host's ``db.engine`` (needs an app context once)."""
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    self._engine = _own_engine(self.url) if self._db is None else self._db.engine
        return self._engine

    # -- the request path ---------------------------------------------------

    def catalog(self) -> SqlCatalog:
        """The current snapshot: an attribute read once the process has started."""
        snapshot = self._snapshot
        return snapshot if snapshot is not None else self._start()

    def identify(self, api_key: str) -> Identity | None:
        """The live client owning ``api_key`` (from the snapshot), else ``None``."""
        return self.catalog().identify(api_key)

    def _start(self) -> SqlCatalog:
        """First use in this process: load the snapshot and start the poller."""
        with self._start_lock:
            if self._snapshot is not None:
                return self._snapshot
            try:
                self.ensure_ready()
                snapshot = self.load()
            except Exception:  # a down database must not take requests down
                log.exception(
                    "flask-quota: cannot read the quota tables at %s; serving the configured "
                    "plans without API keys until the database answers",
                    self.display_url,
                )
                snapshot = self._fallback()
            self._snapshot = snapshot
            self._start_poller()
            return snapshot

    def _fallback(self) -> SqlCatalog:
        plans = self.settings.plans
        return SqlCatalog(
            [plans[name] for name in plans], upgrade_url=self.settings.upgrade_url, version=-1
        )

    def _start_poller(self) -> None:
        self._stop = threading.Event()
        self._poller = threading.Thread(
            target=_poll,
            args=(weakref.ref(self), self._stop, self.settings.sync_interval),
            name="flask-quota-sync",
            daemon=True,
        )
        self._poller.start()

    # -- schema and seed ----------------------------------------------------

    def ensure_ready(self) -> None:
        """Create the tables (own engine only), seed plans and the version row; idempotent.

        Many workers may start at once on a fresh database: PostgreSQL serialises
        them with an advisory lock; on SQLite a loser retries after the winner.
        """
        if self._ready:
            return
        for attempt in range(5):
            try:
                with self.engine.begin() as conn:
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
                with Session(self.engine) as session, session.begin():
                    self._seed(session)
                break
            except DBAPIError:
                if attempt == 4:
                    raise
                time.sleep(0.05 * (attempt + 1) + random.random() * 0.05)
        self._ready = True

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
            return self._fallback()
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
        with self.engine.connect() as conn:
            return conn.scalar(select(QuotaMeta.version).where(QuotaMeta.id == 1)) or 0

    def refresh(self) -> bool:
        """Reload the snapshot if the database's version moved; True if it did.

        Then every ``on_change`` listener runs (the deny cache forgets its denials).
        """
        current = self._snapshot
        if current is not None and self.version() == current.version:
            return False
        self._snapshot = self.load()  # one attribute store: requests see old or new, whole
        for listener in self._listeners:
            listener()
        return True

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` in each process whenever it sees the version move."""
        self._listeners.append(listener)

    # -- writing ------------------------------------------------------------

    @contextmanager
    def change(self) -> Iterator[Session]:
        """A transaction for a change; it bumps ``quota_meta.version`` before committing.

        Every writer (CLI, dashboard) goes through here, so every process sees
        the change at its next poll; this process sees it at once.
        """
        self.ensure_ready()
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session
            session.flush()
            session.execute(
                update(QuotaMeta).where(QuotaMeta.id == 1).values(version=QuotaMeta.version + 1)
            )
        if self._snapshot is not None:
            self.refresh()

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
        return make_url(self.url).render_as_string(hide_password=True) if self.owns_engine else "db"

    def close(self) -> None:
        """Stop the poller and release our own engine (tests and app teardown)."""
        self._stop.set()
        poller, self._poller = self._poller, None
        if poller is not None and poller is not threading.current_thread():
            poller.join(timeout=5)
        if self.owns_engine and self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _after_fork(self) -> None:
        # Threads do not survive fork and pooled connections must not be shared:
        # the child starts over at its first request.
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._poller = None
        self._snapshot = None
        if self.owns_engine and self._engine is not None:
            self._engine.dispose(close=False)


# -- plans <-> rows ---------------------------------------------------------


def plan_record(plan: Plan, position: int) -> PlanRecord:
    """Rows for a configured plan (used to seed an empty plan table)."""
    record = PlanRecord(
        name=plan.name, description=plan.description, upgrade_hint=plan.upgrade, position=position
    )
    if plan.global_rate is not None:
        record.limits.append(PlanLimit(tier="global", resource="", rate=str(plan.global_rate)))
    if plan.user_rate is not None:
        record.limits.append(PlanLimit(tier="user", resource="", rate=str(plan.user_rate)))
    for resource, rate in plan.resources.items():
        record.limits.append(PlanLimit(tier="endpoint", resource=resource, rate=str(rate)))
    return record


def plan_from_record(record: PlanRecord) -> Plan:
    rates: dict[tuple[str, str], Rates] = {}
    for limit in record.limits:
        rate = _parse_stored(limit.rate, f"plan {record.name!r} {limit.tier} {limit.resource}")
        if rate is not None:
            rates[(limit.tier, limit.resource)] = rate
    return Plan(
        record.name,
        rates.get((Tier.GLOBAL.value, "")),
        rates.get((Tier.USER.value, "")),
        {res: rate for (tier, res), rate in rates.items() if tier == Tier.ENDPOINT.value},
        record.description or "",
        record.upgrade_hint,
    )


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
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)
    database = parsed.database or ""
    if database in ("", ":memory:"):
        # One shared in-memory database for every thread of this process.
        return create_engine(url, poolclass=StaticPool, connect_args={"check_same_thread": False})
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 15})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL: readers (every worker's poller) never block the writer (the CLI).
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


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


def _poll(ref: weakref.ref[SqlStore], stop: threading.Event, interval: float) -> None:
    """Body of each process's sync thread; it ends when its store is closed or collected."""
    failures = 0
    while not stop.wait(interval):
        store = ref()
        if store is None:
            return
        try:
            store.ensure_ready()
            store.refresh()
            if failures:
                log.warning("flask-quota: the quota database answers again")
            failures = 0
        except Exception:  # the thread must outlive any database trouble
            failures += 1
            if failures == 1 or failures % 120 == 0:
                log.warning(
                    "flask-quota: cannot refresh quotas from %s (%d failures); "
                    "keeping the last snapshot",
                    store.display_url, failures, exc_info=True,
                )  # fmt: skip
        finally:
            del store


_STORES: weakref.WeakSet[SqlStore] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for store in list(_STORES):
        store._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)
