"""``flask quota plans ...``: plans, their rates, units and concurrency, and their JSON
export and import."""

from __future__ import annotations

from typing import Any

import click
from flask.cli import AppGroup

from ..core.algorithms import Algorithm
from ..core.tiers import Tier
from ..core.validators import DEFAULT_UNIT as UNIT
from ..sql import plansync
from ..sql.admin import AdminError, PlanInfo
from ..sql.inputs import DEFAULT_ALGORITHM
from .common import RAW, actor_option, admin_for, app_store, one_line_errors, table

__all__ = ["plans_cli"]

plans_cli = AppGroup("plans", help="Plans, their rates, units and concurrency.")

# `plans set PLAN concurrent N` / `plans unset PLAN concurrent`: the plan's bound on
# requests in flight sits next to its tiers, as in QUOTA_PLANS and the dashboard.
CONCURRENT = "concurrent"
LIMIT_CHOICE = click.Choice([*(t.value for t in Tier), CONCURRENT], case_sensitive=False)
_HEADER = ["PLAN", "TIER", "RESOURCE", "RATE", "ALGORITHM", "MODE", "UNIT"]


def _rows(plan: PlanInfo) -> list[list[str]]:
    """``plans list``'s rows of one plan: each limit, then its concurrency if bounded."""
    rows = []
    for limit in plan.limits:
        algorithm = limit.algorithm or "default"
        mode = "shadow" if limit.shadow else "enforce"
        # "default": the decorator's unit, else requests; the other tiers count requests.
        unit = limit.unit or (DEFAULT_ALGORITHM if limit.tier == Tier.ENDPOINT.value else UNIT)
        rows.append(
            [plan.name, limit.tier, limit.resource or "-", limit.rate, algorithm, mode, unit]
        )
    if plan.concurrent is not None:
        rows.append([plan.name, CONCURRENT, "-", f"{plan.concurrent} in flight", "-", "-", "-"])
    if not rows:
        rows.append([plan.name, "-", "-", "no limits", "-", "-", "-"])
    return rows


@plans_cli.command("list")
@one_line_errors
def plans_list() -> None:
    """Show every plan and its limits, in upgrade order."""
    table([row for plan in admin_for("cli").plans() for row in _rows(plan)], _HEADER)


@plans_cli.command("show", context_settings=RAW)
@click.argument("plan")
@one_line_errors
def plans_show(plan: str) -> None:
    """Show PLAN: its description, concurrency and every limit with its unit."""
    plans = admin_for("cli").plans()
    info = next((p for p in plans if p.name == plan), None)
    if info is None:
        known = ", ".join(p.name for p in plans)
        raise AdminError(f"unknown plan {plan!r}; known plans: {known}")
    click.echo(f"plan {info.name!r}" + (f": {info.description}" if info.description else ""))
    bound = f"at most {info.concurrent}" if info.concurrent is not None else "no bound"
    click.echo(f"concurrent: {bound} (requests of one caller in flight at once)")
    if info.upgrade_hint:
        click.echo(f"upgrade hint: {info.upgrade_hint}")
    table([row[1:] for row in _rows(info) if row[1] != CONCURRENT], _HEADER[1:])


@plans_cli.command("set", context_settings=RAW)
@click.argument("plan")
@click.argument("tier", type=LIMIT_CHOICE)
@click.argument("rate")
@click.option("--resource", help="The resource of an endpoint-tier rate, e.g. ai_inference.")
@click.option(
    "--unit",
    help="What the resource counts, e.g. tokens; 'default': the decorator's (else requests). "
    "Unset: unchanged.",
)
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
    unit: str | None,
    actor: str,
) -> None:
    """Set PLAN's RATE for TIER, e.g. `plans set free user 200/minute --shadow`, or
    `plans set free endpoint 2000/hour --resource ai_tokens --unit tokens`; `plans set
    PLAN concurrent 4`: at most 4 requests of one caller in flight at once."""
    tier = tier.lower()
    if tier == CONCURRENT:
        options = {"--resource": resource, "--algorithm": algorithm, "--unit": unit}
        given = [name for name, value in options.items() if value is not None]
        given += ["--shadow/--enforce"] if shadow is not None else []
        if given:
            raise AdminError(f"concurrent takes a number only; drop {', '.join(given)}")
        bounded = admin_for(actor).set_plan_concurrency(plan, rate)
        bound = bounded.concurrent
        said = f"at most {bound} requests" if bound is not None else "no bound on requests"
        click.echo(f"plan {bounded.name!r}: {said} of one caller in flight at once")
        return
    info = admin_for(actor).set_plan_limit(
        plan, tier, rate, resource=resource, algorithm=algorithm, shadow=shadow, unit=unit
    )
    where = f"{tier} {resource}" if resource else tier
    new = next(x for x in info.limits if (x.tier, x.resource) == (tier, resource or ""))
    mode = "shadow" if new.shadow else "enforced"
    counts = f", in {new.unit}" if new.unit else ""
    click.echo(
        f"plan {info.name!r}: {where} is now {new.rate}{counts} "
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
@click.argument("tier", type=LIMIT_CHOICE)
@click.option("--resource", help="The resource of an endpoint-tier rate, e.g. ai_inference.")
@actor_option
@one_line_errors
def plans_unset(plan: str, tier: str, resource: str | None, actor: str) -> None:
    """Remove PLAN's rate for TIER: that tier (or resource) then no longer limits the plan;
    `plans unset PLAN concurrent`: no bound on requests in flight."""
    tier = tier.lower()
    if tier == CONCURRENT:
        if resource is not None:
            raise AdminError("concurrent covers every endpoint; drop --resource")
        admin_for(actor).set_plan_concurrency(plan, None)
        click.echo(f"plan {plan!r}: no bound on requests of one caller in flight now")
        return
    info = admin_for(actor).delete_plan_limit(plan, tier, resource)
    where = f"{tier} {resource}" if resource else tier
    click.echo(f"plan {info.name!r}: {where} has no rate now")
