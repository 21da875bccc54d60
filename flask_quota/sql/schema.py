"""The quota tables' first-use setup: create, stamp and seed them, once, whoever races.

With our own engine the tables are made on first use (``SqlStore.ensure_ready``);
with the host's (``Quota(app, db=db)``) the host makes them and a missing table
raises ``TablesMissing``. New tables are stamped with the Alembic revision they
correspond to, so a later ``flask quota db upgrade`` continues from there; the
plan table is seeded once from ``QUOTA_PLANS`` (or the built-in plans).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    Column,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..core.plans import Plan
from .engine import CONNECT_TIMEOUT
from .errors import TablesMissing
from .mapping import plan_record
from .models import SCHEMA_REVISION, PlanRecord, QuotaMeta, metadata

__all__ = ["VERSION_TABLE", "create_and_seed"]

# Our own Alembic version table, so that a host's ``alembic_version`` is never touched.
VERSION_TABLE = "quota_alembic_version"
_INIT_LOCK_ID = 0x71756F7461  # "quota": pg_advisory_xact_lock key for first-time setup
# MySQL GET_LOCK name for the same, + a hash of the database's name: lock names stop
# at 64 characters, database names may use all 64.
_INIT_LOCK_NAME = "flask_quota_setup:"


def create_and_seed(engine: Engine, *, owns_engine: bool, plans: Mapping[str, Plan]) -> None:
    """Make the tables if missing (``owns_engine`` only), stamp them, seed ``plans`` into
    an empty plan table and the version row; idempotent.

    Many workers may start at once on a fresh database: PostgreSQL serialises them
    with an advisory lock, MySQL with a named lock; on SQLite a loser retries after
    the winner. A slow failure is no such race (the database is down): it is not retried.
    """
    began = time.monotonic()
    for attempt in range(5):
        try:
            with _mysql_setup_lock(engine), engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _INIT_LOCK_ID})
                if not inspect(conn).has_table(QuotaMeta.__tablename__):
                    if not owns_engine:
                        raise TablesMissing(
                            "flask-quota's tables are missing from the database of "
                            "Quota(app, db=db): run `flask db migrate -m 'quota tables'` "
                            "and `flask db upgrade` (or call db.create_all())"
                        )
                    metadata.create_all(conn)
                    _stamp(conn)
                elif owns_engine and _unfinished(conn):
                    metadata.create_all(conn)  # only the missing tables (checkfirst)
                    _stamp(conn)
                else:
                    _check_revision(conn)
                # Seeded under the same lock and in the same transaction: two servers
                # seeding apart both saw an empty plan table, and the loser's retry came
                # too late on a loaded machine (a unique-name error, CI on MariaDB).
                with Session(bind=conn) as session:
                    _seed(session, plans)
                    session.flush()
            return
        except DBAPIError:
            if attempt == 4 or time.monotonic() - began > 1.0:
                raise
            time.sleep(0.05 * (attempt + 1) + random.random() * 0.05)


def _seed(session: Session, plans: Mapping[str, Plan]) -> None:
    if session.scalar(select(func.count()).select_from(PlanRecord)) == 0:
        for position, name in enumerate(plans):  # QUOTA_PLANS, or DEFAULT_PLANS
            session.add(plan_record(plans[name], position))
    if session.get(QuotaMeta, 1) is None:
        session.add(QuotaMeta(id=1, version=1))


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


def _check_revision(conn: Any) -> None:
    """Refuse tables stamped at another revision (an older flask-quota made them): their
    columns are not the models'. Without our version table (a host's own migrations)
    there is nothing to compare."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return
    stamped = conn.scalar(text(f"SELECT version_num FROM {VERSION_TABLE}"))
    if stamped is not None and stamped != SCHEMA_REVISION:
        raise TablesMissing(
            f"flask-quota's tables are at revision {stamped}, this version needs "
            f"{SCHEMA_REVISION}: run `flask quota db upgrade` (with Flask-Migrate: "
            "`flask db upgrade`)"
        )


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
