"""Usage pages: what a client or a tenant used in a billing period, from the ledger.

Each page shows the days of one billing period (the current one, or ``?period=YYYY-MM``)
as a bar chart, the totals against the caller's calendar quotas, and links to the
periods before and after; ``?format=csv`` answers the same CSV as
``flask quota usage report --format csv``. Nothing here writes: the pages are plain
GETs. A database that fails answers the "database unavailable" page (``database_errors``).
"""

from __future__ import annotations

import re
from typing import Any

from flask import Response, current_app, redirect, render_template, request, url_for

from flask_quota.admin_api import (
    DEFAULT_UNIT,
    AdminError,
    UnknownCaller,
    UsageReport,
    get_state,
    resource_units,
    tenant_name,
    usage_report,
)

from . import usage_chart
from .admin_views import database_errors

__all__ = ["USAGE_ROUTES"]

_PERIOD_MAX = 20  # characters of ?period= read: a month is 7
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def client_usage(client_id: str) -> Any:
    if not (client_id.isascii() and client_id.isdigit()) or len(client_id) > 18:
        return _page(None, f"No client has the id {client_id[:40]!r}.", 404)
    return _usage(client=int(client_id))


def tenant_usage(name: str) -> Any:
    try:
        stored = tenant_name(name)
    except ValueError:
        message = f"{name[:100]!r} is no tenant name: a tenant is 1 to 64 printable characters."
        return _page(None, message, 404)
    if stored != name:  # blanks around it: the tenant's own address
        query: dict[str, Any] = request.args.to_dict()
        return redirect(url_for(".tenant_usage", name=stored, **query))
    return _usage(tenant=name)


def _usage(**caller: Any) -> Any:
    period = request.args.get("period", "").strip()[:_PERIOD_MAX] or None
    try:
        report = usage_report(get_state(), period=period, **caller)
    except UnknownCaller as exc:
        return _page(None, f"{exc}.", 404)
    except AdminError as exc:  # a malformed ?period=
        return _page(None, f"{exc}.", 400)
    if request.args.get("format") == "csv":
        name = _UNSAFE.sub("_", f"usage-{report.kind}-{report.key}-{report.first}")
        return Response(
            report.csv_text(),
            content_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{name[:120]}.csv"'},
        )
    return _page(report)


def _here(**args: str) -> str:
    """This page's URL with ``args`` as its query."""
    values: dict[str, Any] = {**(request.view_args or {}), **args}
    return url_for(str(request.endpoint), **values)


def _page(report: UsageReport | None, error: str | None = None, status: int = 200) -> Any:
    links: dict[str, str | None] = {"current": _here()}
    title = "Usage"
    if report is not None:
        month = report.month or ""
        title = f"Usage of {report.kind} {report.name}"
        links.update(
            csv=_here(period=month, format="csv") if month else _here(format="csv"),
            previous=_here(period=p) if (p := report.previous_month) else None,
            next=_here(period=n) if (n := report.next_month) else None,
            owner=(
                url_for(".identity_page", tag=f"id={report.key}")
                if report.kind == "client"
                else url_for(".tenant_page", name=report.key)
            ),
        )
    units = _named_units(report) if report is not None else {}
    page = render_template(
        "quota/usage.html",
        report=report,
        title=title,
        units=units,
        chart=usage_chart.build(report, units) if report is not None else None,
        ledger=get_state().settings.ledger,
        links=links,
        error=error,
    )
    return page, status


def _named_units(report: UsageReport) -> dict[str, str]:
    """The resources of ``report`` that count a unit of their own ("tokens"), with it;
    the others count plain units (requests, weighted by their cost)."""
    resources = [t.resource for t in report.totals if t.resource]
    found = resource_units(current_app, report.plan, resources)
    return {resource: unit for resource, unit in found.items() if unit != DEFAULT_UNIT}


USAGE_ROUTES: list[tuple[str, Any, list[str]]] = [
    ("/usage/client/<client_id>", database_errors(client_usage), ["GET"]),
    ("/usage/tenant/<path:name>", database_errors(tenant_usage), ["GET"]),
]
