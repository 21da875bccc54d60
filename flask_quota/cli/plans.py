"""``flask quota plans ...``: plans and their rates, and their JSON export and import."""

from __future__ import annotations

from typing import Any

import click
from flask.cli import AppGroup

from ..core.algorithms import Algorithm
from ..sql import plansync
from ..sql.inputs import DEFAULT_ALGORITHM
from .common import RAW, TIER_CHOICE, actor_option, admin_for, app_store, one_line_errors, table

__all__ = ["plans_cli"]

plans_cli = AppGroup("plans", help="Plans and their rates.")


@plans_cli.command("list")
@one_line_errors
def plans_list() -> None:
    """Show every plan and its limits, in upgrade order."""
    rows = []
    for plan in admin_for("cli").plans():
        for limit in plan.limits:
            algorithm = limit.algorithm or "default"
            mode = "shadow" if limit.shadow else "enforce"
            rows.append([plan.name, limit.tier, limit.resource or "-", limit.rate, algorithm, mode])
        if not plan.limits:
            rows.append([plan.name, "-", "-", "no limits", "-", "-"])
    table(rows, ["PLAN", "TIER", "RESOURCE", "RATE", "ALGORITHM", "MODE"])


@plans_cli.command("set", context_settings=RAW)
@click.argument("plan")
@click.argument("tier", type=TIER_CHOICE)
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
@one_line_errors
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
    info = admin_for(actor).set_plan_limit(
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
@one_line_errors
def plans_export(file: str | None) -> None:
    """Write every plan as JSON in the QUOTA_PLANS shape to FILE (default: stdout)."""
    text = plansync.export_plans(app_store())
    if file is None:
        click.echo(text, nl=False)
        return
    with open(file, "w", encoding="utf-8") as out:
        out.write(text)
    click.echo(f"plans written to {file}", err=True)


@plans_cli.command("import")
@click.argument("file", type=click.File("r", encoding="utf-8"))
@actor_option
@one_line_errors
def plans_import(file: Any, actor: str) -> None:
    """Make the plans exactly those of FILE (JSON in the QUOTA_PLANS shape): validated
    first, then applied all or nothing. Plans that clients use cannot be removed."""
    changes = plansync.import_plans(admin_for(actor), file.read())
    click.echo("\n".join(changes) if changes else "plans already match the file; nothing changed")


@plans_cli.command("create")
@click.argument("name")
@click.option("--description", default="", help="What the plan is for, shown on the dashboard.")
@actor_option
@one_line_errors
def plans_create(name: str, description: str, actor: str) -> None:
    """Add plan NAME, last in upgrade order and without rates (add them with `plans set`)."""
    info = admin_for(actor).create_plan(name, description)
    click.echo(f"plan {info.name!r} created, last in upgrade order; it has no rates yet")


@plans_cli.command("delete", context_settings=RAW)
@click.argument("name")
@actor_option
@one_line_errors
def plans_delete(name: str, actor: str) -> None:
    """Delete plan NAME (refused while a client is on it, or if it is the default plan)."""
    info = admin_for(actor).delete_plan(name)
    click.echo(f"plan {info.name!r} deleted")


@plans_cli.command("unset", context_settings=RAW)
@click.argument("plan")
@click.argument("tier", type=TIER_CHOICE)
@click.option("--resource", help="The resource of an endpoint-tier rate, e.g. ai_inference.")
@actor_option
@one_line_errors
def plans_unset(plan: str, tier: str, resource: str | None, actor: str) -> None:
    """Remove PLAN's rate for TIER: that tier (or resource) then no longer limits the plan."""
    info = admin_for(actor).delete_plan_limit(plan, tier, resource)
    where = f"{tier} {resource}" if resource else tier
    click.echo(f"plan {info.name!r}: {where} has no rate now")
