"""``flask quota ...``: plans, clients, overrides, usage and resets from the shell.

Every change is written to the audit log under ``--actor`` (default: ``$USER``)
and reaches every running worker within ``QUOTA_SYNC_INTERVAL`` plus a reload.
Bad input exits with status 1 and a one-line message, having changed nothing.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar, cast

import click
from flask import current_app
from flask.cli import AppGroup
from sqlalchemy.exc import SQLAlchemyError

from .admin import AdminError, QuotaAdmin, parse_duration
from .extension import QuotaState, get_state, limited_endpoints
from .identity import client_ip
from .keys import KeyBuilder
from .policy import TierCheck
from .sql_store import SqlStore, TablesMissing
from .storage import StorageError

__all__ = ["quota_cli"]

F = TypeVar("F", bound=Callable[..., Any])

# Positional ids and rates may start with "-": let them reach validation, which
# explains the problem in one line, instead of click's "no such option".
_RAW = {"ignore_unknown_options": True}

quota_cli = AppGroup("quota", help="Manage flask-quota plans, clients, overrides and usage.")
plans_cli = AppGroup("plans", help="Plans and their rates.")
clients_cli = AppGroup("clients", help="API clients and their keys.")
overrides_cli = AppGroup("overrides", help="Per-client rates that win over the plan's.")
quota_cli.add_command(plans_cli)
quota_cli.add_command(clients_cli)
quota_cli.add_command(overrides_cli)


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
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise click.ClickException(f"database error: {reason}") from None

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
    store = _state().sql
    if store is None:  # only a hand-built QuotaState lacks it
        raise click.ClickException("flask-quota has no SQL store on this app")
    return store


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
    """Show every plan and its rates, in upgrade order."""
    rows = []
    for plan in _admin("cli").plans():
        for limit in plan.limits:
            rows.append([plan.name, limit.tier, limit.resource or "-", limit.rate])
        if not plan.limits:
            rows.append([plan.name, "-", "-", "no limits"])
    _table(rows, ["PLAN", "TIER", "RESOURCE", "RATE"])


@plans_cli.command("set", context_settings=_RAW)
@click.argument("plan")
@click.argument("tier", type=click.Choice(["global", "user", "endpoint"], case_sensitive=False))
@click.argument("rate")
@click.option("--resource", help="The resource of an endpoint-tier rate, e.g. ai_inference.")
@actor_option
@_one_line_errors
def plans_set(plan: str, tier: str, rate: str, resource: str | None, actor: str) -> None:
    """Set PLAN's RATE for TIER, e.g. `plans set free user 200/minute`."""
    info = _admin(actor).set_plan_limit(plan, tier, rate, resource=resource)
    where = f"{tier} {resource}" if resource else tier
    new = next(x.rate for x in info.limits if (x.tier, x.resource) == (tier, resource or ""))
    click.echo(f"plan {info.name!r}: {where} is now {new}")


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
@click.argument("tier", type=click.Choice(["global", "user", "endpoint"], case_sensitive=False))
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


def _buckets(identity: str | None, ip: str | None, plan_name: str | None) -> list[TierCheck]:
    """The cost-0 checks over every bucket the request path would use for this caller."""
    if identity is None and ip is None:
        raise AdminError("name an IDENTITY (e.g. a client id), or --ip ADDRESS, or both")
    state = _state()
    settings = state.settings
    snapshot = _store().load()  # fresh from SQL; a CLI process starts no poller
    if plan_name is not None and plan_name not in snapshot:
        raise AdminError(f"unknown plan {plan_name!r}; known plans: {', '.join(snapshot)}")
    if identity is not None:
        name = plan_name or snapshot.client_plan(identity) or settings.default_plan
    else:
        name = plan_name or settings.anonymous_plan
    plan = snapshot.resolve(name, identity, fallback=settings.default_plan)
    endpoints = limited_endpoints(current_app)
    ip_tag = KeyBuilder.ip_tag(client_ip(ip)) if ip is not None else None
    if identity is None:
        assert ip_tag is not None
        return state.policy.inspection_checks(plan, ip_tag, endpoints)
    checks = state.policy.inspection_checks(plan, KeyBuilder.identity_tag(identity), endpoints)
    if ip_tag is not None:  # the global tier is per IP
        checks[:0] = [
            c for c in state.policy.inspection_checks(plan, ip_tag, []) if c.name == "global"
        ]
    return checks


def _warn_if_memory() -> None:
    if _state().storage.name == "memory":
        click.echo(
            "warning: QUOTA_STORAGE_URL is memory://, so this command sees its own process's "
            "counters, not the server's",
            err=True,
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
    checks = _buckets(identity, ip, plan)
    _warn_if_memory()
    storage = _state().storage
    verdict = storage.peek([c.check for c in checks])
    rows = []
    for check, outcome in zip(checks, verdict.outcomes, strict=True):
        full_in = max(0, -(-(outcome.reset_us - verdict.now_us) // 1_000_000))
        rows.append(
            [
                check.tier.value,
                check.name,
                str(check.check.rate),
                f"{outcome.remaining}/{outcome.limit}",
                f"{full_in} s",
            ]
        )
    _table(rows, ["TIER", "NAME", "RATE", "REMAINING", "FULL IN"])


@quota_cli.command("reset")
@identity_argument
@ip_option
@actor_option
@_one_line_errors
def reset(identity: str | None, ip: str | None, actor: str) -> None:
    """Empty IDENTITY's buckets (and the global one of --ip) so its limits start afresh."""
    admin = _admin(actor)
    checks = _buckets(identity, ip, None)
    _warn_if_memory()
    keys = [c.check.key for c in checks]
    target = f"identity:{identity}" if identity is not None else f"ip:{ip}"
    with admin.audited("usage.reset", target, None, {"ip": ip, "buckets": len(keys)}):
        _state().storage.clear(keys)  # audited first: no reset goes unrecorded
    click.echo(f"reset {len(keys)} buckets of {target}")
