"""``flask quota overrides ...``: per-client rates that win over the plan's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from flask.cli import AppGroup

from ..sql.inputs import parse_duration
from .common import RAW, TIER_CHOICE, actor_option, admin_for, one_line_errors, table, when

__all__ = ["overrides_cli"]

F = TypeVar("F", bound=Callable[..., Any])

overrides_cli = AppGroup(
    "overrides", help="Per-client and per-tenant rates that win over the plan's."
)


def _target(client_id: int | None, tenant: str | None) -> str:
    return f"tenant {tenant}" if client_id is None else f"client {client_id}"


def _set(
    client_id: str | None,
    tenant: str | None,
    tier: str,
    rate: str,
    resource: str | None,
    expires: str | None,
    actor: str,
) -> None:
    lifetime = parse_duration(expires) if expires is not None else None
    info = admin_for(actor).add_override(
        client_id, tier, rate, resource=resource, expires_in=lifetime, tenant=tenant
    )
    where = f"{info.tier} {info.resource}" if info.resource else info.tier
    until = f" until {when(info.expires_at)}" if info.expires_at else ""
    target = _target(info.client_id, info.tenant)
    click.echo(f"override {info.id}: {target} {where} {info.rate}{until}")


def _rate_arguments(command: F) -> F:
    """TIER RATE [--resource] [--expires] [--actor], shared by `set` and `add`."""
    for decorate in reversed(
        (
            click.argument("tier", type=TIER_CHOICE),
            click.argument("rate"),
            click.option("--resource", help="The resource of an endpoint-tier override."),
            click.option(
                "--expires", help="Lifetime, e.g. 30m, 12h, 7d, 2w; default: until removed."
            ),
            actor_option,
            one_line_errors,
        )
    ):
        command = decorate(command)
    return command


@overrides_cli.command("set", context_settings=RAW)
@click.option("--client", "client_id", metavar="ID", help="The client the rate is for.")
@click.option("--tenant", help="The tenant whose every caller the rate is for.")
@_rate_arguments
def overrides_set(
    client_id: str | None,
    tenant: str | None,
    tier: str,
    rate: str,
    resource: str | None,
    expires: str | None,
    actor: str,
) -> None:
    """Give a client (--client ID) or a tenant (--tenant T) its own RATE for TIER,
    replacing its earlier one; a client's own wins over its tenant's."""
    _set(client_id, tenant, tier, rate, resource, expires, actor)


@overrides_cli.command("add", context_settings=RAW)
@click.argument("client_id", metavar="CLIENT")
@_rate_arguments
def overrides_add(
    client_id: str, tier: str, rate: str, resource: str | None, expires: str | None, actor: str
) -> None:
    """Give CLIENT its own RATE for TIER (as `overrides set --client CLIENT`)."""
    _set(client_id, None, tier, rate, resource, expires, actor)


@overrides_cli.command("list", context_settings=RAW)
@click.argument("client_id", metavar="[CLIENT]", required=False)
@click.option("--tenant", help="Only the overrides of this tenant.")
@one_line_errors
def overrides_list(client_id: str | None, tenant: str | None) -> None:
    """Show overrides (of CLIENT, of a --tenant, or of everyone)."""
    table(
        (
            [
                str(o.id),
                str(o.client_id) if o.client_id is not None else f"tenant {o.tenant}",
                o.tier,
                o.resource or "-",
                o.rate,
                when(o.expires_at),
            ]
            for o in admin_for("cli").overrides(client_id, tenant=tenant)
        ),
        ["ID", "CLIENT", "TIER", "RESOURCE", "RATE", "EXPIRES"],
    )


@overrides_cli.command("remove", context_settings=RAW)
@click.argument("override_id", metavar="ID")
@actor_option
@one_line_errors
def overrides_remove(override_id: str, actor: str) -> None:
    """Delete override ID: its client (or tenant) gets its plan's rate again."""
    info = admin_for(actor).remove_override(override_id)
    click.echo(f"override {info.id} of {_target(info.client_id, info.tenant)} removed")
