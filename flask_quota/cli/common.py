"""What every ``flask quota`` command shares: its error handling, options, table output
and the way it reaches the app's quota state."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar, cast

import click
from flask import current_app
from sqlalchemy.exc import SQLAlchemyError

from ..core.tiers import RATE_TIERS
from ..core.validators import ResourceError
from ..sql.admin import QuotaAdmin
from ..sql.errors import AdminError, TablesMissing, database_error
from ..sql.store import SqlStore
from ..state import QuotaState, get_state
from ..storage import StorageError
from ..tools import inspection
from ..tools.blocks import split_ip

__all__ = [
    "RAW",
    "TIER_CHOICE",
    "actor_option",
    "admin_for",
    "app_state",
    "app_store",
    "caller_of",
    "identity_argument",
    "one_line_errors",
    "refuse_if_memory",
    "table",
    "warn_if_memory",
    "when",
]

F = TypeVar("F", bound=Callable[..., Any])

TIER_CHOICE = click.Choice([t.value for t in RATE_TIERS], case_sensitive=False)

# Positional ids and rates may start with "-": let them reach validation, which
# explains the problem in one line, instead of click's "no such option".
RAW = {"ignore_unknown_options": True}


def _default_actor() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _hint(exc: Exception) -> str:
    """The command-line way to fix a resource given or missing (core's text names none)."""
    cause = exc.__cause__
    if isinstance(cause, ResourceError):
        return " (give --resource NAME)" if cause.needed else " (drop --resource)"
    return ""


def one_line_errors(command: F) -> F:
    """Known failures become ``Error: <message>`` and exit status 1."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (AdminError, TablesMissing) as exc:
            raise click.ClickException(str(exc) + _hint(exc)) from None
        except StorageError as exc:
            raise click.ClickException(f"the rate-limit storage did not answer: {exc}") from None
        except SQLAlchemyError as exc:
            raise click.ClickException(database_error(exc)) from None

    return cast(F, wrapper)


actor_option = click.option(
    "--actor",
    default=_default_actor,
    show_default="$USER",
    help="Who makes the change, for the audit log.",
)
identity_argument = click.argument("identity", required=False)


def app_state() -> QuotaState:
    return get_state(current_app)


def app_store() -> SqlStore:
    return app_state().sql


def admin_for(actor: str) -> QuotaAdmin:
    return QuotaAdmin(app_store(), actor=actor)


def table(rows: Iterable[Sequence[str]], header: Sequence[str]) -> None:
    rows = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo("  ".join(cells).rstrip())


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment is not None else "-"


def caller_of(identity: str | None, ip: str | None) -> inspection.Caller:
    """The caller of ``IDENTITY``/``--ip``; ``--ip`` is one address (its /32 or /128 too):
    a network is refused with the command that denies one."""
    try:
        address, network = split_ip(ip)
        if network is not None:
            raise AdminError(
                f"--ip takes one address, not the network {network}: deny a network with "
                f"`flask quota networks deny {network} --for 10m`"
            )
        return inspection.Caller.of(identity, address)
    except ValueError as exc:
        raise AdminError(str(exc)) from None


def warn_if_memory() -> None:
    if app_state().storage.name == "memory":
        click.echo(
            "warning: QUOTA_STORAGE_URL is memory://, so this command sees its own process's "
            "counters, not the server's",
            err=True,
        )


def refuse_if_memory(action: str, page: str) -> None:
    """Memory storage lives in each server process: a change made from this one would
    print success and reach nothing, so it is refused before anything is audited."""
    if app_state().storage.name == "memory":
        raise click.ClickException(
            f"QUOTA_STORAGE_URL is memory://: counters and blocks live inside each server "
            f"process, so a {action} from this command would not reach the server. Use the "
            f"dashboard ({page}) or call quota.{action}(...) in the app; or set "
            "QUOTA_STORAGE_URL to a Redis that every process shares"
        )
