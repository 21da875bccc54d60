"""Real SQL databases for tests: a SQLite file always, PostgreSQL and MariaDB when configured.

Set ``QUOTA_TEST_DATABASE_URL`` (e.g. ``postgresql://postgres@127.0.0.1:5432/test``)
to run the SQL tests on PostgreSQL too, and ``QUOTA_TEST_MYSQL_URL`` (e.g.
``mysql+pymysql://root@127.0.0.1:3306/test``, printed by scripts/mariadb.sh) to run
them on MariaDB / MySQL. Each test gets a database of its own, created next to the
one named and dropped afterwards, so nothing else is touched. Without a URL its
variants are skipped, loudly; under ``CI=true`` (or ``QUOTA_REQUIRE_POSTGRES=1``,
``QUOTA_REQUIRE_MYSQL=1``) they fail instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError

from flask_quota.sql.store import SqlStore

__all__ = [
    "DATABASES",
    "MYSQL_REQUIRED",
    "MYSQL_URL",
    "POSTGRES_REQUIRED",
    "POSTGRES_URL",
    "database",
    "mysql_database",
    "postgres_database",
    "sql_store",
]

DATABASES = ["sqlite", "postgresql", "mysql"]

POSTGRES_URL = os.environ.get("QUOTA_TEST_DATABASE_URL") or None
# CI sets CI=true: there a PostgreSQL variant that cannot run is a failure, not a skip.
POSTGRES_REQUIRED = os.environ.get("CI", "").lower() in ("1", "true") or bool(
    os.environ.get("QUOTA_REQUIRE_POSTGRES")
)
MYSQL_URL = os.environ.get("QUOTA_TEST_MYSQL_URL") or None
MYSQL_REQUIRED = os.environ.get("CI", "").lower() in ("1", "true") or bool(
    os.environ.get("QUOTA_REQUIRE_MYSQL")
)


def _admin_url() -> URL:
    assert POSTGRES_URL is not None
    url = make_url(POSTGRES_URL)
    if url.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None:
        # SQLAlchemy 2.1 means psycopg (3) by a bare postgresql://; we ship psycopg2.
        url = url.set(drivername="postgresql+psycopg2")
    return url


def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database; dropped (with its connections) afterwards."""
    if POSTGRES_URL is None:
        if POSTGRES_REQUIRED:
            pytest.fail("PostgreSQL is required here (CI) but QUOTA_TEST_DATABASE_URL is not set")
        pytest.skip("!!! QUOTA_TEST_DATABASE_URL not set: PostgreSQL variant SKIPPED")
    admin_url = _admin_url()
    name = f"quota_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield admin_url.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def mysql_database() -> Iterator[str]:
    """A fresh, empty MariaDB / MySQL database; dropped (its connections killed) afterwards."""
    if MYSQL_URL is None:
        if MYSQL_REQUIRED:
            pytest.fail("MariaDB is required here (CI) but QUOTA_TEST_MYSQL_URL is not set")
        pytest.skip("!!! QUOTA_TEST_MYSQL_URL not set: MariaDB / MySQL variant SKIPPED")
    admin_url = make_url(MYSQL_URL)
    name = f"quota_test_{os.getpid()}_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        yield admin_url.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            # DROP DATABASE waits for every connection holding a table lock in it.
            left = conn.scalars(
                text("SELECT id FROM information_schema.processlist WHERE db = :db"),
                {"db": name},
            ).all()
            for thread_id in left:
                with contextlib.suppress(OperationalError):  # it ended meanwhile
                    conn.execute(text(f"KILL {int(thread_id)}"))
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    finally:
        admin.dispose()


def database(kind: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh database of ``kind`` (one of ``DATABASES``), for a fixture such
    as conftest's ``database_url``, which runs a test once per database."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'quota.sqlite3'}"
    elif kind == "mysql":
        yield from mysql_database()
    else:
        yield from postgres_database()


def sql_store(app: Flask) -> SqlStore:
    """The SQL store of an app built with ``QUOTA_DATABASE_URL``."""
    sql: SqlStore | None = app.extensions["quota"].sql
    assert sql is not None
    return sql
