"""Dashboard pages that change quotas: plans, clients, overrides, and the audit log.

Every change goes through ``flask_quota.sql.admin.QuotaAdmin``: validated before
anything is written, audited with the operator's name, and propagated to all
workers by the SQL store's version poll. Bad input re-renders the form with
the message and a 400; nothing is saved. A database that fails answers 503 (409
for a change that collided with another writer's twice) with a page saying so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import (
    Response,
    current_app,
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from flask_quota import Algorithm, Tier
from flask_quota.admin_api import (
    PLANS_READ_ONLY,
    AdminError,
    ChangeConflict,
    ClientInfo,
    PlanInfo,
    PlansReadOnly,
    QuotaAdmin,
    TablesMissing,
    Tag,
    get_state,
    parse_duration,
    sql_reason,
)

from . import session
from .session import flash

__all__ = ["ADMIN_ROUTES", "admin", "client_id_of", "database_errors"]

log = logging.getLogger("flask_quota")

FIELD_MAX = 200
DEFAULT_UNIT_CHOICE = "default"  # set_plan_limit(unit=...): the decorator's unit, else requests
RETRY_AFTER = 5  # seconds, for a database that did not answer


def database_errors(view: Callable[..., Any]) -> Callable[..., Any]:
    """A database failure answers a page that says so (503, or 409 for a collision),
    never a 500: every change is one transaction, so nothing was saved."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return view(*args, **kwargs)
        except (SQLAlchemyError, TablesMissing) as exc:
            reason = sql_reason(exc)
            log.warning(
                "flask-quota dashboard: %s %s failed: %s", request.method, request.path, reason
            )
            conflict = isinstance(exc, IntegrityError)
            if conflict:
                message = "Someone else changed this at the same moment: nothing was saved."
            elif request.method == "POST":
                message = "The quota database did not complete the change: nothing was saved."
            else:
                message = "The quota database did not answer: this page cannot be shown now."
            page = render_template(
                "quota/unavailable.html",
                message=f"{message} Try again in a moment.",
                reason=reason[:300],
                back=url_for(".overview_page"),
            )
            headers = {} if conflict else {"Retry-After": str(RETRY_AFTER)}
            return page, 409 if conflict else 503, headers

    return wrapper


def _status(exc: AdminError) -> int:
    """Refused input: 400; a change that collided with another writer's: 409; a plan
    edit while QUOTA_PLANS owns the plans: 403."""
    if isinstance(exc, PlansReadOnly):
        return 403
    return 409 if isinstance(exc, ChangeConflict) else 400


def admin() -> QuotaAdmin:
    return QuotaAdmin(get_state().sql, actor=f"dashboard:{g.quota_operator}")


def _field(name: str) -> str:
    return request.form.get(name, "").strip()[:FIELD_MAX]


def client_id_of(tag: str) -> str | None:
    """The SQL client behind an identity tag (``id=<client id>``), if it is one."""
    client_id = Tag(tag).client_id
    if client_id is None:
        return None
    return client_id if get_state().catalog().client_plan(client_id) else None


def plans_page(error: str | None = None, status: int = 200) -> tuple[str, int]:
    a = admin()
    plans = a.plans()
    settings = get_state().settings
    return render_template(
        "quota/plans.html",
        plans=plans,
        rows=plan_matrix(plans),
        tiers=[t.value for t in Tier if t is not Tier.CONCURRENT],  # the tiers with rates
        algorithms=[x.value for x in Algorithm],
        app_algorithm=settings.algorithm.value,
        protected={settings.default_plan, settings.anonymous_plan},
        # QUOTA_PLANS_SOURCE=config: plans follow QUOTA_PLANS; the page says so, edits refused
        read_only=a.plans_read_only,
        read_only_reason=PLANS_READ_ONLY,
        error=error,
    ), status


CONCURRENT = "concurrent"  # the matrix row of each plan's bound on requests in flight


def plan_matrix(plans: list[PlanInfo]) -> list[dict[str, Any]]:
    """The plans as a table, like the seed's: one row per tier (global, tenant, user, then each
    resource of the endpoint tier), one cell per plan in upgrade order (``None``: no rate);
    then the ``concurrent`` row, whose cells are each plan's bound (``None``: none)."""
    cells = {(p.name, x.tier, x.resource): x for p in plans for x in p.limits}
    resources = sorted({x.resource for p in plans for x in p.limits if x.resource})
    rows = [(Tier.GLOBAL.value, ""), (Tier.TENANT.value, ""), (Tier.USER.value, "")]
    rows += [(Tier.ENDPOINT.value, r) for r in resources]
    return [
        {
            "tier": tier,
            "resource": resource,
            "key": f"{tier}:{resource}" if resource else tier,
            "label": f"{tier} {resource}" if resource else tier,
            "cells": [cells.get((p.name, tier, resource)) for p in plans],
        }
        for tier, resource in rows
    ] + [
        {
            "tier": CONCURRENT,
            "resource": "",
            "key": CONCURRENT,
            "label": CONCURRENT,
            "cells": [p.concurrent for p in plans],
        }
    ]


def _plan_change(change: Callable[[QuotaAdmin], str]) -> Any:
    """Run one plan change and flash its message; a refusal re-renders the page (400,
    409 for a collision, 403 while QUOTA_PLANS owns the plans; nothing saved)."""
    try:
        message = change(admin())
    except AdminError as exc:
        return plans_page(str(exc), _status(exc))
    flash(message, "ok")
    return redirect(url_for(".plans_page"))


def plan_limit(plan: str | None = None) -> Any:
    plan = (_field("plan") if plan is None else plan)[:FIELD_MAX]
    tier, resource, rate = _field("tier"), _field("resource") or None, _field("rate")
    # Forms with the algorithm select also carry the shadow checkbox, which is absent
    # when unchecked: only such forms change them (None keeps the limit's own).
    options = "algorithm" in request.form
    algorithm = _field("algorithm") if options else None
    shadow = ("shadow" in request.form) if options else None
    # A form with the unit field sets it; left empty, the resource's unit is the default.
    unit = (_field("unit") or DEFAULT_UNIT_CHOICE) if "unit" in request.form else None
    where = f"{tier} {resource}" if resource else tier

    def change(a: QuotaAdmin) -> str:
        info = a.set_plan_limit(
            plan, tier, rate, resource=resource, algorithm=algorithm, shadow=shadow, unit=unit,
            based_on=_field("based_on") or None,
        )  # fmt: skip
        limit = next(x for x in info.limits if (x.tier, x.resource) == (tier, resource or ""))
        counts = f"in {limit.unit}" if limit.unit else ""
        notes = [n for n in (counts, limit.algorithm, "shadow" if limit.shadow else "") if n]
        return f"Plan {plan}: {where} is now {limit.rate}" + (
            f" ({', '.join(notes)})." if notes else "."
        )

    return _plan_change(change)


def plan_limit_form() -> Any:
    """``plan_limit`` with the plan chosen in the form (the "add a rate" form)."""
    return plan_limit(None)


def plan_concurrency(plan: str) -> Any:
    """A plan's bound on requests of one caller in flight (an empty field: no bound)."""

    def change(a: QuotaAdmin) -> str:
        info = a.set_plan_concurrency(
            plan[:FIELD_MAX], _field(CONCURRENT) or None, based_on=_field("based_on") or None
        )
        if info.concurrent is None:
            return f"Plan {plan}: no bound on requests in flight now."
        return f"Plan {plan}: at most {info.concurrent} requests of one caller in flight at once."

    return _plan_change(change)


def plan_unset(plan: str) -> Any:
    tier, resource = _field("tier"), _field("resource") or None
    where = f"{tier} {resource}" if resource else tier

    def change(a: QuotaAdmin) -> str:
        a.delete_plan_limit(plan[:FIELD_MAX], tier, resource, based_on=_field("based_on") or None)
        return f"Plan {plan}: {where} has no rate now (that tier no longer limits it)."

    return _plan_change(change)


def plan_create() -> Any:
    def change(a: QuotaAdmin) -> str:
        info = a.create_plan(_field("name"), request.form.get("description", "")[:1000])
        return f"Plan {info.name} created, last in upgrade order: give it rates below."

    return _plan_change(change)


def plan_delete(plan: str) -> Any:
    def change(a: QuotaAdmin) -> str:
        info = a.delete_plan(plan[:FIELD_MAX], based_on=_field("based_on") or None)
        return f"Plan {info.name} deleted."

    return _plan_change(change)


def clients_page(error: str | None = None, status: int = 200) -> tuple[str, int]:
    a = admin()
    return render_template(
        "quota/clients.html",
        clients=a.clients(),
        plans=[p.name for p in a.plans()],
        error=error,
        new_key=session.current().pop_secret(),  # a client just made: its key, once
    ), status


def client_create() -> Any:
    try:
        info, key = admin().create_client(
            _field("name"),
            _field("plan"),
            tenant=_field("tenant") or None,
            billing_day=_field("billing_day") or None,
        )
    except AdminError as exc:
        return clients_page(str(exc), _status(exc))
    # Post/Redirect/Get: the key crosses the redirect encrypted in the dashboard's cookie
    # and is shown by the next page only (no-store); the database keeps its hash only.
    flash(f"Client {info.name} created (id {info.id}).", "ok")
    session.current().keep_secret(key)
    return redirect(url_for(".clients_page"))


def client_revoke(client_id: str) -> Any:
    try:
        info = admin().revoke_client(client_id)
    except AdminError as exc:
        return clients_page(str(exc), _status(exc))
    flash(f"Client {info.name} revoked.", "ok")
    return redirect(url_for(".clients_page"))


def client_plan(client_id: str) -> Any:
    return _client_edit(
        client_id, "Plan", lambda: admin().set_client_plan(client_id, _field("plan")),
        lambda info: f" is now on plan {info.plan}",
    )  # fmt: skip


def client_tenant(client_id: str) -> Any:
    """Move a client to a tenant (an empty field: no tenant); audited as client.set_tenant."""
    return _client_edit(
        client_id, "Tenant",
        lambda: admin().set_client_tenant(client_id, _field("tenant") or None),
        lambda info: f" is now in tenant {info.tenant}" if info.tenant else " is now in no tenant",
    )  # fmt: skip


def client_billing_day(client_id: str) -> Any:
    """A client's own billing day (an empty field: QUOTA_BILLING_DAY's); audited."""

    def said(info: ClientInfo) -> str:
        day = f"day {info.billing_day}" if info.billing_day else "the app's QUOTA_BILLING_DAY"
        return f": monthly quotas reset on {day}"

    return _client_edit(
        client_id, "Billing day",
        lambda: admin().set_client_billing_day(client_id, _field("billing_day") or None), said,
    )  # fmt: skip


def _client_edit(
    client_id: str, what: str, change: Callable[[], ClientInfo], said: Callable[[ClientInfo], str]
) -> Any:
    """One client edit from a form: flash what it did, or redisplay with why not."""
    try:
        info = change()
    except AdminError as exc:
        flash(f"{what} change refused: {exc}", "error")
        return _redisplay(client_id), _status(exc)
    flash(f"Client {info.name}{said(info)}.", "ok")
    return _back(client_id)


def client_override(client_id: str) -> Any:
    expires = _field("expires")
    try:
        a = admin()
        a.add_override(
            client_id,
            _field("tier"),
            _field("rate"),
            resource=_field("resource") or None,
            expires_in=parse_duration(expires) if expires else None,
        )
    except AdminError as exc:
        flash(f"Override refused: {exc}", "error")
        return _redisplay(client_id), _status(exc)
    flash("Override saved.", "ok")
    return _back(client_id)


def _redisplay(client_id: str) -> Any:
    """The page the form came from, with the flashed error, answered directly (400)."""
    if request.form.get("next", "") == "identity":
        view = current_app.view_functions["quota_dashboard.identity_page"]
        return view(tag=f"id={client_id}")
    return clients_page()[0]


def _back(client_id: str) -> Response:
    target = request.form.get("next", "")
    if target == "identity":
        return redirect(url_for(".identity_page", tag=f"id={client_id}"))  # type: ignore[return-value]
    return redirect(url_for(".clients_page"))  # type: ignore[return-value]


def audit_page() -> str:
    entries = admin().audit_log(limit=200)
    return render_template("quota/audit.html", entries=entries, dumps=_dumps, changes=changes)


def changes(before: Any, after: Any) -> tuple[Any, Any]:
    """What an entry changed: of two mappings, only the keys whose values differ, and of
    two lists under such a key, only the items not in the other (a plan's limits)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return before, after
    old, new = {}, {}
    for key in sorted(set(before) | set(after)):
        was, now = before.get(key), after.get(key)
        if was == now:
            continue
        if isinstance(was, list) and isinstance(now, list):
            was, now = [x for x in was if x not in now], [x for x in now if x not in was]
        if key in before:
            old[key] = was
        if key in after:
            new[key] = now
    return old, new


def _dumps(value: Any) -> str:
    return "" if value is None else json.dumps(value, sort_keys=True, default=str)


_VIEWS: list[tuple[str, Callable[..., Any], list[str]]] = [
    ("/plans", plans_page, ["GET"]),
    ("/plans/new", plan_create, ["POST"]),
    ("/plans/limit", plan_limit_form, ["POST"]),
    ("/plans/<path:plan>/limit", plan_limit, ["POST"]),
    ("/plans/<path:plan>/unset", plan_unset, ["POST"]),
    ("/plans/<path:plan>/concurrent", plan_concurrency, ["POST"]),
    ("/plans/<path:plan>/delete", plan_delete, ["POST"]),
    ("/clients", clients_page, ["GET"]),
    ("/clients/new", client_create, ["POST"]),
    ("/clients/<client_id>/revoke", client_revoke, ["POST"]),
    ("/clients/<client_id>/plan", client_plan, ["POST"]),
    ("/clients/<client_id>/tenant", client_tenant, ["POST"]),
    ("/clients/<client_id>/billing-day", client_billing_day, ["POST"]),
    ("/clients/<client_id>/override", client_override, ["POST"]),
    ("/audit", audit_page, ["GET"]),
]
ADMIN_ROUTES: list[tuple[str, Any, list[str]]] = [
    (rule, database_errors(view), methods) for rule, view, methods in _VIEWS
]
