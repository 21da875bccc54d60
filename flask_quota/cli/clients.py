"""``flask quota clients ...``: API clients, their plans and their keys."""

from __future__ import annotations

import click
from flask.cli import AppGroup

from .common import RAW, actor_option, admin_for, one_line_errors, table, when

__all__ = ["clients_cli"]

clients_cli = AppGroup("clients", help="API clients and their keys.")


@clients_cli.command("create")
@click.argument("name")
@click.option("--plan", required=True, help="The client's plan.")
@actor_option
@one_line_errors
def clients_create(name: str, plan: str, actor: str) -> None:
    """Create a client and print its API key (shown this once; only a hash is kept)."""
    info, key = admin_for(actor).create_client(name, plan)
    click.echo(f"client {info.id} {info.name!r} on plan {info.plan!r}")
    click.echo(f"API key: {key}")
    click.echo("Store the key now: it is not shown again (only its hash is kept).", err=True)


@clients_cli.command("list")
@one_line_errors
def clients_list() -> None:
    """Show every client, its plan and key prefix."""
    table(
        (
            [
                str(c.id),
                c.name,
                c.plan,
                c.key_prefix + "...",
                when(c.created_at),
                "revoked " + when(c.revoked_at) if c.revoked_at else "active",
            ]
            for c in admin_for("cli").clients()
        ),
        ["ID", "NAME", "PLAN", "KEY", "CREATED", "STATUS"],
    )


@clients_cli.command("revoke", context_settings=RAW)
@click.argument("client_id", metavar="ID")
@actor_option
@one_line_errors
def clients_revoke(client_id: str, actor: str) -> None:
    """Revoke client ID's key: it is then treated as unknown (anonymous or 401)."""
    info = admin_for(actor).revoke_client(client_id)
    click.echo(f"client {info.id} {info.name!r} revoked")


@clients_cli.command("set-plan", context_settings=RAW)
@click.argument("client_id", metavar="ID")
@click.argument("plan")
@actor_option
@one_line_errors
def clients_set_plan(client_id: str, plan: str, actor: str) -> None:
    """Move client ID to PLAN."""
    info = admin_for(actor).set_client_plan(client_id, plan)
    click.echo(f"client {info.id} {info.name!r} is now on plan {info.plan!r}")
