"""Our own engine for ``QUOTA_DATABASE_URL``: every call bounded in time, per driver.

A database in trouble must never reach requests, nor hold a dashboard page (an app
worker) for long: connect, statement and pool timeouts and TCP keepalives bound each
call of our engine. The host's engine (``Quota(app, db=db)``) is the host's to tune;
only operator transactions are bounded there too (``bounded``, PostgreSQL).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool

from ..storage.url import SCHEMES

__all__ = [
    "ADMIN_STATEMENT_TIMEOUT_MS",
    "CONNECT_TIMEOUT",
    "bounded",
    "local_database_warning",
    "own_engine",
    "sqlite_write_lock",
]

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


def own_engine(url: str) -> Engine:
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
        # One in-memory database lives in one connection, which every thread of this
        # process must share. A pool of exactly one lends it to one checkout at a time:
        # shared freely, the pool's rollback at one thread's checkin would end another
        # thread's running transaction (and sqlite3 may crash on concurrent cursors).
        return create_engine(
            url,
            poolclass=QueuePool,
            pool_size=1,
            max_overflow=0,
            pool_timeout=POOL_TIMEOUT,
            connect_args=sqlite_args,
        )
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


def sqlite_write_lock(session: Session) -> None:
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


def bounded(session: Session) -> None:
    """Bound this operator transaction's statements, lock waits included, to a couple of
    seconds: a dashboard page waiting on a locked table holds an app worker meanwhile.

    PostgreSQL only, with ``SET LOCAL``, so it also holds on the host's engine
    (``Quota(app, db=db)``) and ends with the transaction. Elsewhere the engine's own
    bounds apply (ours: the timeouts above; the host's: whatever it configured).
    """
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {ADMIN_STATEMENT_TIMEOUT_MS}")
