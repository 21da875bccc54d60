"""A client's prepaid credits on its identity page: balances, grants, and a grant form.

A grant goes through ``Credits.grant``: ``sql.credits.new_grant`` (validated, then
written with its ``credits.grant`` audit entry in one transaction, under the operator's
name), then ``Credits.push`` adds it to the live balance, so it is spendable at once;
every worker adds it within ``QUOTA_SYNC_INTERVAL`` even when that push fails. Refused
input re-renders the page with the message and a 400, nothing written; a grant made
redirects back to the page (Post/Redirect/Get).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from flask import abort, current_app, redirect, request, url_for

from flask_quota.admin_api import AdminError, get_state, resource_units

from .admin_views import admin, database_errors
from .session import flash

__all__ = ["CREDIT_ROUTES", "client_credits"]

_UNITS = re.compile(r"[0-9]{1,13}")  # ASCII digits (str.isdigit takes "²"), at most 10^13


def client_credits(client_id: str, plan_name: str) -> dict[str, Any] | None:
    """What the identity page shows of an SQL client's credits: each balance of its
    plan's credits resources (and of any other it holds grants of), its grants newest
    first, and the resources the grant form offers. None when no plan sells credits."""
    state = get_state()
    credits = state.credits
    if credits is None or not credits.resources():
        return None
    plan = state.catalog().get(plan_name)
    offered = credits.resources(plan) if plan is not None else []
    found = credits.report(client_id, offered)
    units = resource_units(current_app, plan_name, [b["resource"] for b in found])
    grants = [
        {**g, "resource": b["resource"], "expires_text": _utc(g["expires"]),
         "created_text": _utc(g["created"])}
        for b in found
        for g in b["grants"]
    ]  # fmt: skip
    return {
        "offered": offered,
        "balances": [
            {"resource": b["resource"], "balance": b["balance"], "unit": units[b["resource"]]}
            for b in found
        ],
        "grants": sorted(grants, key=lambda g: g["id"], reverse=True),
        "zone": str(state.settings.calendar.zone),
    }


def _utc(text: str | None) -> str | None:
    """An ISO time as the dashboard shows times: UTC, to the minute."""
    if text is None:
        return None
    return datetime.fromisoformat(text).astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def credits_grant(client_id: str) -> Any:
    """The grant form: ``resource``, ``units``, optional ``expires`` (a date, midnight in
    ``QUOTA_TIMEZONE``) and ``note``."""
    state, a = get_state(), admin()
    client = next((c for c in a.clients() if str(c.id) == client_id), None)
    if client is None:
        abort(404)
    tag = f"id={client_id}"
    credits = state.credits
    if credits is None:
        abort(404)
    raw = request.form.get("units", "").strip()
    try:
        info, failed = credits.grant(
            str(client.id), request.form.get("resource", "").strip()[:100],
            # Anything but plain digits goes as text: new_grant refuses it with its rule.
            int(raw) if _UNITS.fullmatch(raw) else raw[:20],
            request.form.get("expires", "").strip()[:40] or None,
            request.form.get("note", "").strip(),  # new_grant refuses a long one
            actor=a.actor, zone=state.settings.calendar.zone,
        )  # fmt: skip
    except AdminError as exc:
        view = current_app.view_functions["quota_dashboard.identity_page"]
        return view(tag=tag, credits_error=f"Grant refused: {exc}. Nothing changed.", status=400)
    until = (
        f"until {_utc(info.expires_at.isoformat())} UTC" if info.expires_at else "without expiry"
    )
    name = f"{info.units} {info.resource} to client {client.name}"
    flash(f"Granted {name} {until} (grant {info.id}).", "ok")
    if failed is not None:
        flash(
            "The storage did not answer: the live balance gets it within the sync interval "
            f"({type(failed).__name__}).",
            "notice",
        )
    return redirect(url_for(".identity_page", tag=tag, _anchor="credits"))


CREDIT_ROUTES: list[tuple[str, Any, list[str]]] = [
    ("/clients/<client_id>/credits", database_errors(credits_grant), ["POST"]),
]
