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
@click.option("--tenant", help="The customer organisation it belongs to (shares its bucket).")
@click.option(
    "--billing-day",
    help="Day of the month (1-31) its N/month quotas reset on; default QUOTA_BILLING_DAY.",
)
@actor_option
@one_line_errors
def clients_create(
    name: str, plan: str, tenant: str | None, billing_day: str | None, actor: str
) -> None:
    """Create a client and print its API key (shown this once; only a hash is kept)."""
    info, key = admin_for(actor).create_client(name, plan, tenant=tenant, billing_day=billing_day)
    extra = f" of tenant {info.tenant!r}" if info.tenant is not None else ""
    click.echo(f"client {info.id} {info.name!r} on plan {info.plan!r}{extra}")
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
                c.tenant or "-",
                str(c.billing_day) if c.billing_day is not None else "-",
                c.key_prefix + "...",
                when(c.created_at),
                "revoked " + when(c.revoked_at) if c.revoked_at else "active",
            ]
            for c in admin_for("cli").clients()
        ),
        ["ID", "NAME", "PLAN", "TENANT", "BILLING DAY", "KEY", "CREATED", "STATUS"],
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


@clients_cli.command("set-tenant", context_settings=RAW)
@click.argument("client_id", metavar="ID")
@click.argument("tenant", required=False)
@click.option("--none", "no_tenant", is_flag=True, help="Take the client out of its tenant.")
@actor_option
@one_line_errors
def clients_set_tenant(client_id: str, tenant: str | None, no_tenant: bool, actor: str) -> None:
    """Move client ID to TENANT (or, with --none, out of any tenant)."""
    if (tenant is None) == (not no_tenant):
        raise click.UsageError("give a TENANT or --none")
    info = admin_for(actor).set_client_tenant(client_id, tenant)
    now = f"of tenant {info.tenant!r}" if info.tenant is not None else "of no tenant"
    click.echo(f"client {info.id} {info.name!r} is now {now}")


@clients_cli.command("set-billing-day", context_settings=RAW)
@click.argument("client_id", metavar="ID")
@click.argument("day", required=False)
@click.option("--none", "no_day", is_flag=True, help="Follow QUOTA_BILLING_DAY again.")
@actor_option
@one_line_errors
def clients_set_billing_day(client_id: str, day: str | None, no_day: bool, actor: str) -> None:
    """Make client ID's N/month quotas reset on DAY (1-31), or with --none on QUOTA_BILLING_DAY."""
    if (day is None) == (not no_day):
        raise click.UsageError("give a DAY or --none")
    info = admin_for(actor).set_client_billing_day(client_id, day)
    now = f"day {info.billing_day}" if info.billing_day is not None else "QUOTA_BILLING_DAY"
    click.echo(f"client {info.id} {info.name!r}: N/month quotas reset on {now}")
