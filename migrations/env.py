"""Alembic environment of flask-quota's ``quota_*`` tables.

Runs under ``flask quota db ...`` (the migrations installed with the package)
and under Flask-Migrate's ``flask db ...`` pointed at this directory (the demo:
``flask --app wsgi db upgrade``). Either way the database is the one the app's
quota extension uses: the host's Flask-SQLAlchemy ``db`` given as
``Quota(app, db=db)``, or ``QUOTA_DATABASE_URL`` (default: a SQLite file in the
instance folder). The revision is kept in ``quota_alembic_version`` and only
``quota_*`` tables are compared, so these migrations live beside a host's own
without touching them.
"""

from __future__ import annotations

import logging
from logging.config import fileConfig
from typing import Any

from alembic import context
from flask import current_app

from flask_quota.sql.migrate import include_name, migration_metadata, quota_engine
from flask_quota.sql.schema import VERSION_TABLE

config = context.config
if config.config_file_name is not None:
    # Keep the app's loggers (flask_quota's among them) alive.
    fileConfig(config.config_file_name, disable_existing_loggers=False)
logger = logging.getLogger("alembic.env")


def _options() -> dict[str, Any]:
    migrate = current_app.extensions.get("migrate")  # Flask-Migrate's, when it runs us
    options = dict(getattr(migrate, "configure_args", {}) or {})
    options.update(
        target_metadata=migration_metadata(),
        version_table=VERSION_TABLE,
        include_name=include_name,
        compare_type=True,
    )
    return options


def run_migrations_offline() -> None:
    context.configure(
        url=quota_engine(current_app).url.render_as_string(hide_password=False),
        literal_binds=True,
        **_options(),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    def skip_empty(context_: Any, revision: Any, directives: Any) -> None:
        # `flask db migrate` with no model change writes no empty revision.
        if getattr(config.cmd_opts, "autogenerate", False) and directives[0].upgrade_ops.is_empty():
            directives[:] = []
            logger.info("No changes in schema detected.")

    options = _options()
    options.setdefault("process_revision_directives", skip_empty)
    with quota_engine(current_app).connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            # A batch migration rebuilds a table by dropping it: with foreign keys on,
            # that would cascade into the rows that reference it (clients' overrides).
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        try:
            context.configure(connection=connection, **options)
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
