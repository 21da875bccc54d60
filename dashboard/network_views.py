"""The Networks page: operators' rules for whole networks (CIDR), IPv4 and IPv6.

A denied network's requests get 403; an allowed network's skip the per-IP global tier.
Each change goes through ``QuotaAdmin`` (validated before anything is written, audited
under the operator, applied by every worker within the sync interval); bad input
re-renders the page with the message and a 400, nothing saved. A database that fails
answers the page that says so (``database_errors``), never a 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import redirect, render_template, request, url_for

from flask_quota.admin_api import NETWORK_ACTIONS, AdminError, lifetime

from .admin_views import FIELD_MAX, _status, admin, database_errors
from .session import flash

__all__ = ["NETWORK_ROUTES"]

_WHAT = {"deny": "denied (403)", "allow": "allowed (no per-IP global tier)"}


def networks_page(
    error: str | None = None, status: int = 200, form: Mapping[str, str] | None = None
) -> tuple[str, int]:
    """The rules in force and the form to add one (``form``: what was typed, to correct)."""
    return render_template(
        "quota/networks.html",
        networks=admin().networks(),
        actions=NETWORK_ACTIONS,
        error=error,
        form=form or {},
    ), status


def network_add() -> Any:
    form = request.form
    cidr = form.get("cidr", "").strip()[:FIELD_MAX]
    action = form.get("action", "").strip()[:FIELD_MAX]
    duration = form.get("duration", "").strip()[:FIELD_MAX]
    reason = form.get("reason", "").strip()[:1000]  # the admin refuses over 200
    try:
        if not cidr:
            raise AdminError("name the network: e.g. 203.0.113.0/24, 2001:db8::/32 or one address")
        expires_in = lifetime(duration) if duration else None
        info = admin().set_network(cidr, action, expires_in=expires_in, reason=reason)
    except AdminError as exc:
        return networks_page(f"Not saved: {exc}. Nothing changed.", _status(exc), form)
    until = f" until {info.expires_at:%Y-%m-%d %H:%M} UTC" if info.expires_at else ""
    flash(f"Network {info.cidr} is {_WHAT[info.action]}{until}.", "ok")
    return redirect(url_for(".networks_page"))


def network_remove() -> Any:
    cidr = request.form.get("cidr", "").strip()[:FIELD_MAX]
    try:
        info = admin().remove_network(cidr)
    except AdminError as exc:
        return networks_page(f"Not removed: {exc}.", _status(exc))
    if info is not None:  # always: without missing_ok, a missing rule raised AdminError
        flash(f"Removed the {info.action} rule of {info.cidr}.", "ok")
    return redirect(url_for(".networks_page"))


NETWORK_ROUTES: list[tuple[str, Any, list[str]]] = [
    (rule, database_errors(view), methods)
    for rule, view, methods in (
        ("/networks", networks_page, ["GET"]),
        ("/networks/new", network_add, ["POST"]),
        ("/networks/remove", network_remove, ["POST"]),
    )
]
