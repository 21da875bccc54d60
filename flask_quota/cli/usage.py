"""``flask quota usage`` and ``flask quota reset``: a caller's buckets, read or emptied."""

from __future__ import annotations

import click
from flask import current_app
from flask.cli import with_appcontext

from ..admin_api import bucket_units
from ..core.plans import Plan
from ..core.policy import TierCheck
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


@click.command("usage")
@with_appcontext
@identity_argument
@ip_option
@plan_option
@one_line_errors
def usage(identity: str | None, ip: str | None, plan: str | None) -> None:
    """Show IDENTITY's current buckets without charging them."""
    found, checks = _buckets(caller_of(identity, ip), plan)
    warn_if_memory()
    units = bucket_units(current_app, found, checks)
    rows = [
        [b.tier, b.name, b.rate, f"{b.remaining}/{b.limit}", f"{b.reset_in} s", unit]
        for b, unit in zip(inspection.peek(app_state(), checks), units, strict=True)
    ]
    table(rows, ["TIER", "NAME", "RATE", "REMAINING", "FULL IN", "UNIT"])


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
