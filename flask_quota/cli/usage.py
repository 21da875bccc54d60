"""``flask quota usage`` and ``flask quota reset``: a caller's buckets, read or emptied,
and ``flask quota usage report``: what a caller used, from the ledger."""

from __future__ import annotations

import json
from typing import Any

import click
from flask import current_app
from flask.cli import with_appcontext

from ..admin_api import bucket_units
from ..core.plans import Plan
from ..core.policy import TierCheck
from ..reports import usage_report
from ..sql.errors import AdminError
from ..tools import inspection
from .common import (
    actor_option,
    app_state,
    app_store,
    caller_of,
    identity_argument,
    one_line_errors,
    refuse_if_memory,
    table,
    warn_if_memory,
)

__all__ = ["reset", "usage"]


def _buckets(caller: inspection.Caller, plan_name: str | None) -> tuple[Plan, list[TierCheck]]:
    """The caller's plan, and the cost-0 checks over every bucket the request path would
    use for it."""
    state = app_state()
    try:
        # Fresh from SQL: a CLI process starts no poller.
        plan = inspection.plan_of(state, caller, plan=plan_name, catalog=app_store().load())
    except ValueError as exc:
        raise AdminError(str(exc)) from None
    return plan, inspection.caller_checks(current_app, state, caller, plan)


ip_option = click.option("--ip", help="A client address: its global tier (and, alone, anonymous).")
plan_option = click.option("--plan", help="The plan to assume (default: the client's own).")


class _UsageGroup(click.Group):
    """``usage`` with its subcommands, where anything else is a caller to ``show``:
    ``flask quota usage u42 --plan pro`` is ``flask quota usage show u42 --plan pro``, as
    it was before ``usage`` had subcommands (``usage -- report`` shows a caller named
    "report")."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ctx.help_option_names):
            args = ["show", *args]
        return super().parse_args(ctx, args)


@click.group("usage", cls=_UsageGroup, subcommand_metavar="[IDENTITY] | COMMAND [ARGS]...")
def usage() -> None:
    """A caller's live buckets, or what a caller used (from the ledger).

    `flask quota usage IDENTITY [--ip IP] [--plan P]` is short for `flask quota usage
    show IDENTITY ...`; `flask quota usage report` reads the ledger."""


@usage.command("show")
@with_appcontext
@identity_argument
@ip_option
@plan_option
@one_line_errors
def show(identity: str | None, ip: str | None, plan: str | None) -> None:
    """Show IDENTITY's current buckets without charging them."""
    found, checks = _buckets(caller_of(identity, ip), plan)
    warn_if_memory()
    units = bucket_units(current_app, found, checks)
    rows = [
        [b.tier, b.name, b.rate, f"{b.remaining}/{b.limit}", f"{b.reset_in} s", unit]
        for b, unit in zip(inspection.peek(app_state(), checks), units, strict=True)
    ]
    table(rows, ["TIER", "NAME", "RATE", "REMAINING", "FULL IN", "UNIT"])


@usage.command("report")
@with_appcontext
@click.option("--client", help="A client, by id or name (its rows: its own use).")
@click.option("--tenant", help="A tenant (its rows: every caller of it together).")
@click.option("--identity", help="An identity (an API client's identity is its id).")
@click.option("--period", help="The billing period starting in this month, e.g. 2026-11.")
@click.option("--from", "start", metavar="DATE", help="First day (YYYY-MM-DD), with --to.")
@click.option("--to", "end", metavar="DATE", help="Last day (YYYY-MM-DD), included.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="csv and json print nothing else, for `> file`.",
)
@one_line_errors
def report(fmt: str, **selection: Any) -> None:
    """What one caller used per day and resource, with totals against its calendar
    quotas: the current billing period unless --period or --from/--to says otherwise."""
    state = app_state()
    if not state.settings.ledger:
        click.echo("warning: QUOTA_LEDGER is off, so no new use is recorded", err=True)
    # A fresh read of the plans: a command starts no sync of its own.
    found = usage_report(state, catalog=app_store().load(), **selection)
    if fmt == "csv":
        click.echo(found.csv_text(), nl=False)
    elif fmt == "json":
        click.echo(json.dumps(found.as_json(), indent=2))
    else:
        click.echo(found.table_text(), nl=False)


@click.command("reset")
@with_appcontext
@identity_argument
@ip_option
@actor_option
@one_line_errors
def reset(identity: str | None, ip: str | None, actor: str) -> None:
    """Empty IDENTITY's buckets (and the global one of --ip) so its limits start afresh."""
    caller = caller_of(identity, ip)
    refuse_if_memory("reset", "Reset on the caller's identity page")
    _, checks = _buckets(caller, None)
    # Audited first (a failed clear is recorded as usage.reset.failed).
    count = inspection.reset(app_state(), checks, actor=actor, caller=caller)
    click.echo(f"reset {count} buckets of {caller.tag}")
