"""Tenant pages: the customer organisations SQL clients belong to.

A tenant is a name on its clients (``Client.tenant``) and on the overrides aimed
at it; its bucket is the tenant tier's, keyed by the name. The page reads that
bucket without charging (the same peek the identity page uses), resets it, and
sets or removes the tenant's overrides, each change audited by ``QuotaAdmin``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from flask import Response, redirect, render_template, request, url_for

from flask_quota import admin_api
from flask_quota.admin_api import AdminError, StorageError, get_state, parse_duration

from . import data
from .admin_views import FIELD_MAX, _status, admin, database_errors
from .session import flash

__all__ = ["TENANT_ROUTES"]


def _checks(name: str) -> list[admin_api.TierCheck]:
    return admin_api.tenant_checks(get_state(), name)


def _known(name: str) -> str:
    """The tenant as stored: a name no client or override could carry is "no such
    tenant" (404), never an error page; one with blanks around it redirects."""
    try:
        stored = admin_api.tenant_name(name)
    except ValueError:
        page = render_template("quota/not_found.html", tenant=name[:100])
        raise _NotFound(Response(page, 404, content_type="text/html")) from None
    if stored != name:
        raise _NotFound(redirect(url_for(".tenant_page", name=stored)))  # type: ignore[arg-type]
    return name


class _NotFound(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def _answers(view: Callable[..., Any]) -> Callable[..., Any]:
    """A view whose ``_NotFound`` answers its response."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return view(*args, **kwargs)
        except _NotFound as exc:
            return exc.response

    wrapper.__name__ = view.__name__
    wrapper.__doc__ = view.__doc__
    return wrapper


def tenants_page() -> str:
    a = admin()
    found = a.tenants()
    overrides: dict[str, int] = {}
    for o in a.overrides():
        if o.tenant is not None:
            overrides[o.tenant] = overrides.get(o.tenant, 0) + 1
    names = sorted(set(found) | set(overrides))
    rows = [
        {"name": n, "clients": [c.name for c in found.get(n, [])], "overrides": overrides.get(n, 0)}
        for n in names
    ]
    return render_template("quota/tenants.html", tenants=rows)


def tenant_page(name: str, error: str | None = None, status: int = 200) -> Any:
    name = _known(name)
    a = admin()
    state, reads = get_state(), data.request_reads()
    reads.health()  # first: a dead storage is found by one ping, and later reads are skipped
    checks = _checks(name)
    buckets = data.buckets(state, reads, checks)
    page = render_template(
        "quota/tenant.html",
        name=name,
        clients=a.tenants().get(name, []),
        overrides=a.overrides(tenant=name),
        buckets=None if buckets is None else [asdict(b) for b in buckets],
        storage=reads.health(),
        has_tier=bool(checks),
        tiers=["tenant", "user", "endpoint", "global"],
        error=error,
    )
    return page, status


def tenant_reset(name: str) -> Response:
    name = _known(name)
    try:
        # Audited by inspection.reset as usage.reset of the tenant's tag (t=...).
        count = admin_api.reset(get_state(), _checks(name), actor=admin().actor)
    except StorageError as exc:
        reason = data.failure_kind(exc)
        flash(f"Reset failed: storage unavailable ({reason}); nothing was reset.", "error")
    else:
        flash(f"Reset {count} buckets of tenant {name}.", "ok")
    return redirect(url_for(".tenant_page", name=name))  # type: ignore[return-value]


def _field(name: str) -> str:
    return request.form.get(name, "").strip()[:FIELD_MAX]


def tenant_override(name: str) -> Any:
    name = _known(name)
    expires = _field("expires")
    try:
        admin().add_override(
            None,
            _field("tier"),
            _field("rate"),
            resource=_field("resource") or None,
            expires_in=parse_duration(expires) if expires else None,
            tenant=name,
        )
    except AdminError as exc:
        return tenant_page(name, f"Override refused: {exc}. Nothing changed.", _status(exc))
    flash(f"Override of tenant {name} saved.", "ok")
    return redirect(url_for(".tenant_page", name=name))


def override_remove(override_id: str) -> Any:
    """Remove a tenant's override (audited as override.remove); back to its page."""
    try:
        info = admin().remove_override(override_id)
    except AdminError as exc:
        flash(f"Override not removed: {exc}", "error")
        return tenants_page(), _status(exc)
    flash(f"Override removed: {info.tier} {info.resource or ''} is the plan's again.", "ok")
    if info.tenant is not None and info.client_id is None:
        return redirect(url_for(".tenant_page", name=info.tenant))
    return redirect(url_for(".identity_page", tag=f"id={info.client_id}"))


_VIEWS: list[tuple[str, Callable[..., Any], list[str]]] = [
    ("/tenants", tenants_page, ["GET"]),
    ("/tenant/<path:name>/reset", tenant_reset, ["POST"]),
    ("/tenant/<path:name>/override", tenant_override, ["POST"]),
    ("/tenant/<path:name>", tenant_page, ["GET"]),
    ("/overrides/<override_id>/remove", override_remove, ["POST"]),
]
TENANT_ROUTES: list[tuple[str, Any, list[str]]] = [
    (rule, database_errors(_answers(view)), methods) for rule, view, methods in _VIEWS
]
