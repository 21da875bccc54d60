"""``flask quota credits grant|show``: prepaid credits from the shell.

A grant is a row in SQL, audited under ``--actor``, then added to the live balance; every
worker adds it within ``QUOTA_SYNC_INTERVAL`` (``flask_quota.credits``). Bad input exits
with status 1 and a one-line message, having changed nothing.
"""

from __future__ import annotations

import click
from flask.cli import AppGroup

from ..sql.credits import client_caller
from .common import RAW, actor_option, app_state, one_line_errors, table, warn_if_memory

__all__ = ["credits_cli"]

credits_cli = AppGroup("credits", help="Prepaid credits: grant them, show balances.")


@credits_cli.command("grant", context_settings=RAW)
@click.argument("client")
@click.argument("units")
@click.option("--resource", required=True, help="A plan's credits resource, e.g. ai_tokens.")
@click.option(
    "--expires", default=None, help="When the grant stops counting: 2027-01-01 (midnight in "
    "QUOTA_TIMEZONE) or 2027-01-01T12:00; default: never.",
)  # fmt: skip
@click.option("--note", default="", help="Why, for the audit log and `credits show`.")
@actor_option
@one_line_errors
def credits_grant(
    client: str, units: str, resource: str, expires: str | None, note: str, actor: str
) -> None:
    """Grant UNITS of a credits resource to CLIENT (an SQL client's name or id)."""
    state = app_state()
    if not units.strip().isdigit():
        raise click.ClickException(f"UNITS must be a whole number, got {units!r}")
    assert state.credits is not None  # made by init_app
    info, failed = state.credits.grant(
        client_caller(state.sql, client), resource, int(units), expires, note,
        actor=actor, zone=state.settings.calendar.zone,
    )  # fmt: skip
    until = f"until {info.expires_at:%Y-%m-%d %H:%M UTC}" if info.expires_at else "without expiry"
    click.echo(f"granted {info.units} {info.resource} to client {client} {until} (grant {info.id})")
    if failed is not None:  # saved: every worker adds it within the sync interval
        click.echo(f"note: the live balance gets it within the sync interval ({failed})", err=True)


@credits_cli.command("show")
@click.argument("client")
@one_line_errors
def credits_show(client: str) -> None:
    """Show CLIENT's balances and grants (an SQL client's name or id)."""
    state = app_state()
    warn_if_memory()
    assert state.credits is not None
    found = state.credits.report(client_caller(state.sql, client))
    if not found:
        click.echo("no credits granted")
    for balance in found:
        shown = "unknown (the storage did not answer)" if balance["balance"] is None else (
            balance["balance"]
        )  # fmt: skip
        click.echo(f"{balance['resource']}: balance {shown}")
        table(
            (
                [
                    str(g["id"]), str(g["units"]), "-" if g["left"] is None else str(g["left"]),
                    g["expires"] or "never", g["by"], g["note"] or "-",
                ]
                for g in balance["grants"]
            ),
            ["GRANT", "UNITS", "LEFT", "EXPIRES", "BY", "NOTE"],
        )  # fmt: skip
