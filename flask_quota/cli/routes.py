"""``flask quota routes``: every URL rule with the limits, rates per plan and
exemptions that apply to it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import click
from flask import Flask, current_app
from flask.cli import with_appcontext
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import RequestRedirect, Rule

from ..core.plans import PlanCatalog
from ..core.policy import LimitSpec
from ..core.priority import Priority
from ..sql.errors import TablesMissing
from ..sql.store import DEFAULT_DATABASE_FILE
from ..state import QuotaState
from ..tools.routes import LimitsOf, PriorityOf, as_json, plan_tiers, route_rows
from ..views import EXEMPT_ATTR
from .common import app_state, table

__all__ = ["routes"]

STATUS_ENDPOINT = "flask_quota_status"  # the endpoint init_app gives QUOTA_STATUS_URL
_OURS = __name__.split(".")[0] + "."  # blueprints made in this package: the dashboard's


@click.command("routes")
@click.option("--json", "as_json_", is_flag=True, help="Print JSON instead of tables.")
@click.option(
    "--endpoint",
    metavar="NAME",
    help="Only the rules of this endpoint, as `flask routes` names it (e.g. infer).",
)
@click.option(
    "--path",
    metavar="PATH",
    help="Only the rules a request to PATH reaches, e.g. /v1/items/3 (any method).",
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also list the routes flask-quota registers itself (the dashboard's).",
)
@with_appcontext
def routes(as_json_: bool, endpoint: str | None, path: str | None, show_all: bool) -> None:
    """List every URL rule with the limits that apply to it: why a request got 429.

    The dashboard's own routes are left out unless --all is given (or --endpoint or
    --path names one of them).
    """
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    state = app_state()
    rules = _chosen_rules(app, endpoint, path, show_all)
    catalog = _catalog(app, state)
    priority_of = _priority_of(app, state) if state.settings.overload else None
    rows = route_rows(
        rules, _limits_of(app, state), catalog, state.settings.exempt_methods, priority_of
    )
    tiers = plan_tiers(catalog)
    if not state.settings.enabled:
        click.echo("warning: QUOTA_ENABLED is off: no limit applies to any request", err=True)
    if as_json_:
        click.echo(json.dumps(as_json(rows, tiers), indent=2))
        return
    click.echo("Every route that is not exempt counts on its caller's plan tiers:")
    concurrent = any(t.concurrent is not None for t in tiers)
    table(
        (
            [t.plan, t.global_rate or "-", t.tenant or "-", t.user or "-"]
            + ([str(t.concurrent or "-")] if concurrent else [])
            for t in tiers
        ),
        ["PLAN", "GLOBAL (PER IP)", "TENANT", "USER"] + (["CONCURRENT"] if concurrent else []),
    )
    click.echo()
    plans = [t.plan for t in tiers]
    classes = priority_of is not None  # overload protection on: a PRIORITY column
    lines = []
    for row in rows:
        head = [row.rule, ",".join(row.methods) or "-", row.endpoint]
        if classes:
            head.append(row.priority or "-")
        if row.exempt:
            lines.append([*head, f"exempt ({row.exempt})", *["-"] * (3 + len(plans))])
        elif not row.limits:
            lines.append([*head, "-", *["-"] * (3 + len(plans))])
        for limit in row.limits:
            own = [limit.resource, limit.rate or "-", str(limit.cost), ",".join(limit.flags) or "-"]
            lines.append([*head, *own, *(limit.plans[p] or "-" for p in plans)])
    table(
        lines,
        ["RULE", "METHODS", "ENDPOINT", *(["PRIORITY"] if classes else []), "LIMIT", "RATE",
         "COST", "FLAGS", *plans],
    )  # fmt: skip


def _chosen_rules(app: Flask, endpoint: str | None, path: str | None, show_all: bool) -> list[Rule]:
    """The rules to list: those ``--endpoint`` and ``--path`` name (both: those both
    name), else every rule but flask-quota's own unless ``show_all``. Says on stderr how
    many it hid; an endpoint or path that names nothing is an error."""
    every = list(app.url_map.iter_rules())
    if endpoint is None and path is None:
        if show_all:
            return every
        shown = [rule for rule in every if not _registered_by_us(app, rule)]
        if hidden := len(every) - len(shown):
            click.echo(
                f"{hidden} route{'s' if hidden != 1 else ''} of the flask-quota dashboard "
                "not listed: --all lists them",
                err=True,
            )
        return shown
    chosen = every
    if endpoint is not None:
        chosen = [rule for rule in chosen if rule.endpoint == endpoint]
        if not chosen:
            raise click.ClickException(
                f"no endpoint named {endpoint!r}: `flask quota routes --all` lists every "
                "endpoint (the ENDPOINT column)"
            )
    if path is not None:
        reached = _reached_by(app, path)
        if not reached:
            raise click.ClickException(
                f"{path} could not be matched to any rule of the app: give a URL path "
                "such as /v1/items/3, or a rule as `flask quota routes --all` prints it"
            )
        chosen = [rule for rule in chosen if rule in reached]
        if not chosen:
            raise click.ClickException(f"--endpoint {endpoint} does not match --path {path}")
    return chosen


def _registered_by_us(app: Flask, rule: Rule) -> bool:
    """Whether ``rule`` belongs to a blueprint that flask-quota itself registered (the
    dashboard), rather than to the app. The status and metrics URLs are the app's: it
    configured them, and its callers reach them."""
    blueprint = app.blueprints.get(rule.endpoint.rpartition(".")[0])
    return blueprint is not None and blueprint.import_name.startswith(_OURS)


def _reached_by(app: Flask, path: str) -> list[Rule]:
    """The rules a request to ``path`` reaches with any method (a query string is
    ignored), or the rule written exactly as ``path`` (``/items/<int:item>``)."""
    every = list(app.url_map.iter_rules())
    written = [rule for rule in every if rule.rule == path]
    if written:
        return written
    target = urlsplit(path).path or "/"
    adapter = app.url_map.bind(app.config.get("SERVER_NAME") or "localhost")
    methods = sorted({method for rule in every for method in rule.methods or ()})
    found: list[Rule] = []
    for method in methods:
        for _ in range(2):  # once more after a redirect (/quota -> /quota/)
            try:
                rule, _args = adapter.match(target, method=method, return_rule=True)
            except RequestRedirect as redirect:
                target = urlsplit(redirect.new_url).path
                continue
            except (NotFound, MethodNotAllowed):
                break
            if rule not in found:
                found.append(rule)
            break
    return found


def _catalog(app: Flask, state: QuotaState) -> PlanCatalog:
    """The plans requests are decided with: the quota tables' when the app keeps them,
    else (or with the database down) the configured ones."""
    if not _keeps_tables(app, state):
        return state.settings.plans
    try:
        return state.sql.load()  # fresh: a CLI process starts no poller
    except (SQLAlchemyError, TablesMissing) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        click.echo(
            f"warning: the quota database did not answer ({reason}); showing the configured "
            "plans, which may differ from what the servers enforce",
            err=True,
        )
        return state.settings.plans


def _keeps_tables(app: Flask, state: QuotaState) -> bool:
    """Whether the servers read the plans from SQL (as ``SqlStore.autostart`` decides).

    Without a database URL, ``db=`` or the dashboard, the default SQLite file is made
    only when something needs it; listing must not make it, or the database would own
    the plans from the next start on.
    """
    settings, store = state.settings, state.sql
    if settings.database_url is not None or not store.owns_engine or settings.dashboard_url:
        return True
    return (Path(app.instance_path) / DEFAULT_DATABASE_FILE).is_file()


def _limits_of(app: Flask, state: QuotaState) -> LimitsOf:
    def limits_of(endpoint: str, method: str) -> tuple[str | None, Sequence[LimitSpec]]:
        exempt, specs = state.view_limit(app, endpoint, method)
        if exempt:
            return _why_exempt(app, endpoint, method), ()
        return None, specs

    return limits_of


def _priority_of(app: Flask, state: QuotaState) -> PriorityOf:
    def priority_of(endpoint: str, method: str, specs: Sequence[LimitSpec]) -> str:
        found = state.priority(app, endpoint, method, tuple(specs))
        return (found or Priority.DEFAULT).value

    return priority_of


def _why_exempt(app: Flask, endpoint: str, method: str) -> str:
    """Which rule of ``views.resolve`` made ``endpoint`` exempt, in its order."""
    if endpoint.rpartition(".")[2] == "static":
        return "static files"
    if endpoint == STATUS_ENDPOINT:  # exempt from the limits, but it counts its own budget
        return "QUOTA_STATUS_URL: counts on the global tier and its own budget only"
    view = app.view_functions.get(endpoint)
    cls = getattr(view, "view_class", None)
    if getattr(getattr(cls, method.lower(), None), EXEMPT_ATTR, False):
        return f"@quota.exempt on {method.lower()}"
    if getattr(view, EXEMPT_ATTR, False) or getattr(cls, EXEMPT_ATTR, False):
        return "@quota.exempt"
    name = endpoint.rpartition(".")[0]
    while name:  # innermost first: the one whose exemption the walk met
        if getattr(app.blueprints.get(name), EXEMPT_ATTR, False):
            return f"blueprint {name.rpartition('.')[2]!r} is exempt"
        name = name.rpartition(".")[0]
    return "exempt"
