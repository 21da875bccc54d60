"""``flask quota ...``: plans, clients, overrides, usage and resets from the shell.

Every change is written to the audit log under ``--actor`` (default: ``$USER``)
and reaches every running worker within ``QUOTA_SYNC_INTERVAL`` plus a reload.
Bad input exits with status 1 and a one-line message, having changed nothing.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from functools import wraps
from typing import Any, TypeVar, cast

import click
from flask import current_app
from flask.cli import AppGroup
from sqlalchemy.exc import SQLAlchemyError

from . import plansync
from .admin import DEFAULT_ALGORITHM, AdminError, QuotaAdmin, parse_duration
from .core.algorithms import Algorithm
from .core.policy import TierCheck
from .core.tiers import Tier
from .dbcli import db_cli
from .sql_store import SqlStore, TablesMissing, sql_reason
from .state import QuotaState, get_state
from .storage import StorageError
from .tools import blocks, inspection

__all__ = ["quota_cli"]

F = TypeVar("F", bound=Callable[..., Any])

_TIER_CHOICE = click.Choice([t.value for t in Tier], case_sensitive=False)

# Positional ids and rates may start with "-": let them reach validation, which
# explains the problem in one line, instead of click's "no such option".
_RAW = {"ignore_unknown_options": True}

quota_cli = AppGroup("quota", help="Manage flask-quota plans, clients, overrides and usage.")
plans_cli = AppGroup("plans", help="Plans and their rates.")
clients_cli = AppGroup("clients", help="API clients and their keys.")
overrides_cli = AppGroup("overrides", help="Per-client rates that win over the plan's.")
blocks_cli = AppGroup("blocks", help="Callers refused outright for a while.")
quota_cli.add_command(plans_cli)
quota_cli.add_command(clients_cli)
quota_cli.add_command(overrides_cli)
quota_cli.add_command(blocks_cli)
quota_cli.add_command(db_cli)


def _default_actor() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _one_line_errors(command: F) -> F:
    """Known failures become ``Error: <message>`` and exit status 1."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (AdminError, TablesMissing) as exc:
            raise click.ClickException(str(exc)) from None
        except StorageError as exc:
            raise click.ClickException(f"the rate-limit storage did not answer: {exc}") from None
        except SQLAlchemyError as exc:
            raise click.ClickException(f"database error: {sql_reason(exc)}") from None

    return cast(F, wrapper)


actor_option = click.option(
    "--actor",
    default=_default_actor,
    show_default="$USER",
    help="Who makes the change, for the audit log.",
)


def _state() -> QuotaState:
    return get_state(current_app)


def _store() -> SqlStore:
    return _state().sql


def _admin(actor: str) -> QuotaAdmin:
    return QuotaAdmin(_store(), actor=actor)


def _table(rows: Iterable[Sequence[str]], header: Sequence[str]) -> None:
    rows = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo("  ".join(cells).rstrip())


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment is not None else "-"


# -- plans ------------------------------------------------------------------------


@plans_cli.command("list")
@_one_line_errors
def plans_list() -> None:
    """Show every plan and its limits, in upgrade order."""
    rows = []
    for plan in _admin("cli").plans():
        for limit in plan.limits:
            algorithm = limit.algorithm or "default"
            mode = "shadow" if limit.shadow else "enforce"
            rows.append([plan.name, limit.tier, limit.resource or "-", limit.rate, algorithm, mode])
        if not plan.limits:
            rows.append([plan.name, "-", "-", "no limits", "-", "-"])
    _table(rows, ["PLAN", "TIER", "RESOURCE", "RATE", "ALGORITHM", "MODE"])


@plans_cli.command("set", context_settings=_RAW)
@click.argument("plan")
@click.argument("tier", type=_TIER_CHOICE)
@click.argument("rate")
@click.option("--resource", help="The resource of an endpoint-tier rate, e.g. ai_inference.")
@click.option(
    "--algorithm",
    type=click.Choice([*(a.value for a in Algorithm), DEFAULT_ALGORITHM], case_sensitive=False),
    help="This limit's algorithm; 'default' follows QUOTA_ALGORITHM. Unset: unchanged.",
)
@click.option(
    "--shadow/--enforce",
    default=None,
    help="Shadow: decided and recorded, never denies. Unset: unchanged (new limits enforce).",
)
@actor_option
@_one_line_errors
def plans_set(
    plan: str,
    tier: str,
    rate: str,
    resource: str | None,
    algorithm: str | None,
    shadow: bool | None,
    actor: str,
) -> None:
    """Set PLAN's RATE for TIER, e.g. `plans set free user 200/minute --shadow`."""
    info = _admin(actor).set_plan_limit(
        plan, tier, rate, resource=resource, algorithm=algorithm, shadow=shadow
    )
    where = f"{tier} {resource}" if resource else tier
    new = next(x for x in info.limits if (x.tier, x.resource) == (tier, resource or ""))
    mode = "shadow" if new.shadow else "enforced"
    click.echo(
        f"plan {info.name!r}: {where} is now {new.rate} "
        f"({new.algorithm or 'default algorithm'}, {mode})"
    )


@plans_cli.command("export")
@click.argument("file", type=click.Path(dir_okay=False, writable=True), required=False)
@_one_line_errors
def plans_export(file: str | None) -> None:
    """Write every plan as JSON in the QUOTA_PLANS shape to FILE (default: stdout)."""
    text = plansync.export_plans(_store())
    if file is None:
        click.echo(text, nl=False)
        return
    with open(file, "w", encoding="utf-8") as out:
        out.write(text)
    click.echo(f"plans written to {file}", err=True)


@plans_cli.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@actor_option
@_one_line_errors
def plans_import(file: Any, actor: str) -> None:
    """Make the plans exactly those of FILE (JSON in the QUOTA_PLANS shape): validated
    first, then applied all or nothing. Plans that clients use cannot be removed."""
    changes = plansync.import_plans(_admin(actor), file.read())
    click.echo("\n".join(changes) if changes else "plans already match the file; nothing changed")


@plans_cli.command("create")
@click.argument("name")
@click.option("--description", default="", help="What the plan is for, shown on the dashboard.")
@actor_option
@_one_line_errors
def plans_create(name: str, description: str, actor: str) -> None:
    """Add plan NAME, last in upgrade order and without rates (add them with `plans set`)."""
    info = _admin(actor).create_plan(name, description)
    click.echo(f"plan {info.name!r} created, last in upgrade order; it has no rates yet")


@plans_cli.command("delete", context_settings=_RAW)
@click.argument("name")
@actor_option
@_one_line_errors
def plans_delete(name: str, actor: str) -> None:
    """Delete plan NAME (refused while a client is on it, or if it is the default plan)."""
    info = _admin(actor).delete_plan(name)
    click.echo(f"plan {info.name!r} deleted")


@plans_cli.command("unset", context_settings=_RAW)
@click.argument("plan")
@click.argument("tier", type=_TIER_CHOICE)
@click.option("--resource", help="The resource of an endpoint-tier rate, e.g. ai_inference.")
@actor_option
@_one_line_errors
def plans_unset(plan: str, tier: str, resource: str | None, actor: str) -> None:
    """Remove PLAN's rate for TIER: that tier (or resource) then no longer limits the plan."""
    info = _admin(actor).delete_plan_limit(plan, tier, resource)
    where = f"{tier} {resource}" if resource else tier
    click.echo(f"plan {info.name!r}: {where} has no rate now")


# -- clients ----------------------------------------------------------------------


@clients_cli.command("create")
@click.argument("name")
@click.option("--plan", required=True, help="The client's plan.")
@actor_option
@_one_line_errors
def clients_create(name: str, plan: str, actor: str) -> None:
    """Create a client and print its API key (shown this once; only a hash is kept)."""
    info, key = _admin(actor).create_client(name, plan)
    click.echo(f"client {info.id} {info.name!r} on plan {info.plan!r}")
    click.echo(f"API key: {key}")
    click.echo("Store the key now: it is not shown again (only its hash is kept).", err=True)


@clients_cli.command("list")
@_one_line_errors
def clients_list() -> None:
    """Show every client, its plan and key prefix."""
    _table(
        (
            [
                str(c.id),
                c.name,
                c.plan,
                c.key_prefix + "...",
                _when(c.created_at),
                "revoked " + _when(c.revoked_at) if c.revoked_at else "active",
            ]
            for c in _admin("cli").clients()
        ),
        ["ID", "NAME", "PLAN", "KEY", "CREATED", "STATUS"],
    )


@clients_cli.command("revoke", context_settings=_RAW)
@click.argument("client_id", metavar="ID")
@actor_option
@_one_line_errors
def clients_revoke(client_id: str, actor: str) -> None:
    """Revoke client ID's key: it is then treated as unknown (anonymous or 401)."""
    info = _admin(actor).revoke_client(client_id)
    click.echo(f"client {info.id} {info.name!r} revoked")


@clients_cli.command("set-plan", context_settings=_RAW)
@click.argument("client_id", metavar="ID")
@click.argument("plan")
@actor_option
@_one_line_errors
def clients_set_plan(client_id: str, plan: str, actor: str) -> None:
    """Move client ID to PLAN."""
    info = _admin(actor).set_client_plan(client_id, plan)
    click.echo(f"client {info.id} {info.name!r} is now on plan {info.plan!r}")


# -- overrides --------------------------------------------------------------------


@overrides_cli.command("add", context_settings=_RAW)
@click.argument("client_id", metavar="CLIENT")
@click.argument("tier", type=_TIER_CHOICE)
@click.argument("rate")
@click.option("--resource", help="The resource of an endpoint-tier override.")
@click.option("--expires", help="Lifetime, e.g. 30m, 12h, 7d, 2w; default: until removed.")
@actor_option
@_one_line_errors
def overrides_add(
    client_id: str, tier: str, rate: str, resource: str | None, expires: str | None, actor: str
) -> None:
    """Give CLIENT its own RATE for TIER (replaces its earlier one for that tier)."""
    lifetime = parse_duration(expires) if expires is not None else None
    info = _admin(actor).add_override(client_id, tier, rate, resource=resource, expires_in=lifetime)
    where = f"{info.tier} {info.resource}" if info.resource else info.tier
    until = f" until {_when(info.expires_at)}" if info.expires_at else ""
    click.echo(f"override {info.id}: client {info.client_id} {where} {info.rate}{until}")


@overrides_cli.command("list", context_settings=_RAW)
@click.argument("client_id", metavar="[CLIENT]", required=False)
@_one_line_errors
def overrides_list(client_id: str | None) -> None:
    """Show overrides (of CLIENT, or of everyone)."""
    _table(
        (
            [str(o.id), str(o.client_id), o.tier, o.resource or "-", o.rate, _when(o.expires_at)]
            for o in _admin("cli").overrides(client_id)
        ),
        ["ID", "CLIENT", "TIER", "RESOURCE", "RATE", "EXPIRES"],
    )


@overrides_cli.command("remove", context_settings=_RAW)
@click.argument("override_id", metavar="ID")
@actor_option
@_one_line_errors
def overrides_remove(override_id: str, actor: str) -> None:
    """Delete override ID: the client gets its plan's rate again."""
    info = _admin(actor).remove_override(override_id)
    click.echo(f"override {info.id} of client {info.client_id} removed")


# -- usage and resets -------------------------------------------------------------


def _caller(identity: str | None, ip: str | None) -> inspection.Caller:
    try:
        return inspection.Caller.of(identity, ip)
    except ValueError as exc:
        raise AdminError(str(exc)) from None


def _buckets(caller: inspection.Caller, plan_name: str | None) -> list[TierCheck]:
    """The cost-0 checks over every bucket the request path would use for this caller."""
    state = _state()
    try:
        # Fresh from SQL: a CLI process starts no poller.
        plan = inspection.plan_of(state, caller, plan=plan_name, catalog=_store().load())
    except ValueError as exc:
        raise AdminError(str(exc)) from None
    return inspection.caller_checks(current_app, state, caller, plan)


def _warn_if_memory() -> None:
    if _state().storage.name == "memory":
        click.echo(
            "warning: QUOTA_STORAGE_URL is memory://, so this command sees its own process's "
            "counters, not the server's",
            err=True,
        )


def _refuse_if_memory(action: str, page: str) -> None:
    """Memory storage lives in each server process: a change made from this one would
    print success and reach nothing, so it is refused before anything is audited."""
    if _state().storage.name == "memory":
        raise click.ClickException(
            f"QUOTA_STORAGE_URL is memory://: counters and blocks live inside each server "
            f"process, so a {action} from this command would not reach the server. Use the "
            f"dashboard ({page}) or call quota.{action}(...) in the app; or set "
            "QUOTA_STORAGE_URL to a Redis that every process shares"
        )


identity_argument = click.argument("identity", required=False)
ip_option = click.option("--ip", help="A client address: its global tier (and, alone, anonymous).")
plan_option = click.option("--plan", help="The plan to assume (default: the client's own).")


@quota_cli.command("usage")
@identity_argument
@ip_option
@plan_option
@_one_line_errors
def usage(identity: str | None, ip: str | None, plan: str | None) -> None:
    """Show IDENTITY's current buckets without charging them."""
    checks = _buckets(_caller(identity, ip), plan)
    _warn_if_memory()
    rows = [
        [b.tier, b.name, b.rate, f"{b.remaining}/{b.limit}", f"{b.reset_in} s"]
        for b in inspection.peek(_state(), checks)
    ]
    _table(rows, ["TIER", "NAME", "RATE", "REMAINING", "FULL IN"])


@quota_cli.command("reset")
@identity_argument
@ip_option
@actor_option
@_one_line_errors
def reset(identity: str | None, ip: str | None, actor: str) -> None:
    """Empty IDENTITY's buckets (and the global one of --ip) so its limits start afresh."""
    caller = _caller(identity, ip)
    _refuse_if_memory("reset", "Reset on the caller's identity page")
    checks = _buckets(caller, None)
    # Audited first (a failed clear is recorded as usage.reset.failed).
    count = inspection.reset(_state(), checks, actor=actor, caller=caller)
    click.echo(f"reset {count} buckets of {caller.tag}")


# -- blocks -----------------------------------------------------------------------


@quota_cli.command("block", context_settings=_RAW)
@identity_argument
@click.option("--ip", help="A client address: blocks the anonymous caller from it.")
@click.option("--for", "duration", required=True, help="How long, e.g. 10m, 12h, 7d.")
@click.option("--reason", default="", help="Why, for the audit log and the blocks list.")
@click.option(
    "--public/--private",
    default=False,
    show_default=True,
    help="Public: the blocked caller's 429 shows the reason too.",
)
@actor_option
@_one_line_errors
def block(
    identity: str | None, ip: str | None, duration: str, reason: str, public: bool, actor: str
) -> None:
    """Refuse IDENTITY (or the anonymous caller of --ip) with 429 "blocked" for a while."""
    seconds = int(parse_duration(duration).total_seconds())
    caller = _caller(identity, ip)
    _refuse_if_memory("block", "Block on the Blocks page")
    for tag in blocks.block(_state(), caller, seconds, reason, actor, public=public):
        click.echo(f"blocked {tag} for {seconds} s")


@quota_cli.command("unblock", context_settings=_RAW)
@identity_argument
@click.option("--ip", help="A client address: unblocks the anonymous caller from it.")
@actor_option
@_one_line_errors
def unblock(identity: str | None, ip: str | None, actor: str) -> None:
    """Lift the block of IDENTITY (or of --ip); every worker serves it again within 2 s."""
    caller = _caller(identity, ip)
    _refuse_if_memory("unblock", "Unblock on the Blocks page")
    lifted = blocks.unblock(_state(), caller, actor)
    for tag in caller.tags:
        click.echo(f"unblocked {tag}" if tag in lifted else f"{tag} was not blocked")


@blocks_cli.command("list")
@_one_line_errors
def blocks_list() -> None:
    """Show every live block: who, until when, by whom and why."""
    _warn_if_memory()
    rows = [
        [
            b.tag,
            datetime.fromtimestamp(b.until, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            f"{b.remaining} s",
            b.by,
            b.reason or "-",
        ]
        for b in blocks.list_blocks(_state())
    ]
    _table(rows, ["CALLER", "UNTIL", "LEFT", "BY", "REASON"])
