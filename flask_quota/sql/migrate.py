"""The quota tables' Alembic migrations, as shipped in the package (``flask_quota/migrations``).

They run on the database the app's quota extension uses (``quota_engine``) and keep
their revision in ``quota_alembic_version``, so a host's own ``alembic_version`` is
never touched; ``include_name`` keeps them to the ``quota_*`` tables of a shared
database. ``migrations/env.py`` and ``flask quota db ...`` use what is here.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any

from flask import Flask
from sqlalchemy import Connection, Engine, MetaData

from .models import copy_tables
from .schema import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "alembic_config",
    "differences",
    "include_name",
    "migration_metadata",
    "quota_engine",
    "revision",
]


def quota_engine(app: Flask) -> Engine:
    """The engine holding ``app``'s quota tables (``db.engine`` or our own)."""
    state = app.extensions.get("quota")
    if state is None:
        raise RuntimeError("flask-quota is not initialised on this app: call Quota(app) first")
    engine: Engine = state.sql.engine
    return engine


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic filter: a shared database holds the host's tables too; compare only ours."""
    return type_ != "table" or (name or "").startswith("quota_")


def migration_metadata() -> MetaData:
    """The quota tables as migrations see them: plain SQLAlchemy types, fixed names."""
    target = MetaData()
    copy_tables(target)
    return target


@contextmanager
def alembic_config(verbose: bool = False) -> Iterator[Config]:
    """The packaged migrations; Alembic's warnings on stderr meanwhile, and its INFO
    progress lines too with ``verbose`` (the commands print their own one-line result).

    No ini file: env.py then leaves the app's logging configuration alone.
    """
    from alembic.config import Config

    logger = logging.getLogger("alembic")
    handler = logging.StreamHandler(sys.stderr)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    try:
        with resources.as_file(resources.files("flask_quota") / "migrations") as directory:
            config = Config()
            config.set_main_option("script_location", str(directory))
            yield config
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def revision(conn: Connection) -> str | None:
    """The revision the quota tables are stamped with, or ``None``."""
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def differences(conn: Connection) -> list[Any]:
    """How the quota tables in ``conn`` differ from the models (Alembic's autogenerate diff)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(
        conn,
        opts={"compare_type": True, "version_table": VERSION_TABLE, "include_name": include_name},
    )
    return list(compare_metadata(context, migration_metadata()))
