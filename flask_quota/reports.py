"""Usage reports: what a client, a tenant or an identity used, per day and resource.

A report reads the ledger (``quota_usage``, written when ``QUOTA_LEDGER`` is on) and
never writes anything. Its days are local days in ``QUOTA_TIMEZONE``, as the ledger
stamps them, so the period math here is plain ``date`` arithmetic: no clock, no time
zone, no DST.

A billing period is named by the month it starts in: with billing day 15, ``2026-11``
runs from 2026-11-15 to 2026-12-14; with billing day 1 it is the calendar month. A
billing day of 29-31 is clamped to a shorter month's last day, as ``N/month``
windows are (``core.calendar``), so periods follow one another without a gap.

Each total is set against the caller's calendar quotas (``N/month``, ``N/year``) in
its plan, overrides included: the user tier's for the caller's own requests
(resource ``""``), the resource's endpoint limit for a named resource, and the
tenant tier's for a tenant.
"""

from __future__ import annotations

import calendar as _calendar
import csv
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from .core import validators
from .core.plans import Plan, PlanCatalog
from .core.rates import Rates
from .ledger import caller_of
from .sql.engine import bounded
from .sql.errors import AdminError
from .sql.models import Client, PlanRecord, UsageRow
from .state import QuotaState

__all__ = [
    "CSV_HEADER",
    "MAX_DAYS",
    "CalendarQuota",
    "UnknownCaller",
    "UsageLine",
    "UsageReport",
    "UsageTotal",
    "billing_period",
    "current_period",
    "parse_day",
    "period_month",
    "shift_month",
    "usage_report",
]

MAX_DAYS = 366
"""The longest range a report covers (``start`` to ``end``, both included)."""
CSV_HEADER = ("day", "resource", "units", "requests", "denied")

_MONTH = re.compile(r"(\d{4})-(\d{2})", re.ASCII)
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
# A period needs the month after it: the last month Python's dates can follow.
_FIRST_YEAR, _LAST_YEAR = 1, 9998
_REQUESTS = "(requests)"  # how tables name resource "": the caller's requests themselves


class UnknownCaller(AdminError):
    """The client named for a report does not exist (the dashboard answers 404)."""


# -- periods -----------------------------------------------------------------------


def _billing_day(value: int) -> int:
    try:
        return validators.billing_day(value)
    except ValueError as exc:
        raise AdminError(str(exc)) from None


def _month(month: str) -> tuple[int, int]:
    """``"2026-11"`` -> ``(2026, 11)``; ``AdminError`` naming the form otherwise."""
    found = _MONTH.fullmatch(month.strip()) if isinstance(month, str) else None
    if found is None:
        raise AdminError(f"period {str(month)[:40]!r} is not a month: use YYYY-MM, e.g. 2026-11")
    year, number = int(found.group(1)), int(found.group(2))
    if not 1 <= number <= 12:
        raise AdminError(f"period {month!r} has no month {number:02d}: months run 01 to 12")
    if not _FIRST_YEAR <= year <= _LAST_YEAR:
        raise AdminError(f"period {month!r} is out of range: years {_FIRST_YEAR}-{_LAST_YEAR}")
    return year, number


def _start(year: int, month: int, billing_day: int) -> date:
    """The billing day in that month, clamped to the month's last day."""
    return date(year, month, min(billing_day, _calendar.monthrange(year, month)[1]))


def _next(year: int, month: int) -> tuple[int, int]:
    return (year + 1, 1) if month == 12 else (year, month + 1)


def billing_period(month: str, billing_day: int) -> tuple[date, date]:
    """The first and last day of the billing period that starts in ``month``
    (``"YYYY-MM"``): from the billing day in that month to the day before the billing
    day of the next month. ``billing_period("2026-11", 15)`` is 2026-11-15 to
    2026-12-14; with billing day 1 it is the calendar month. Raises ``AdminError``
    for a malformed month or a billing day outside 1-31."""
    year, number = _month(month)
    day = _billing_day(billing_day)
    first = _start(year, number, day)
    last = _start(*_next(year, number), day) - timedelta(days=1)
    return first, last


def period_month(day: date, billing_day: int) -> str:
    """The month (``"YYYY-MM"``) whose billing period holds ``day``."""
    billing_day = _billing_day(billing_day)
    year, month = day.year, day.month
    if day < _start(year, month, billing_day):
        year, month = (year - 1, 12) if month == 1 else (year, month - 1)
    return f"{year:04d}-{month:02d}"


def current_period(today: date, billing_day: int) -> tuple[date, date]:
    """The first and last day of the billing period ``today`` falls in."""
    return billing_period(period_month(today, billing_day), billing_day)


def shift_month(month: str, months: int) -> str:
    """``month`` moved by ``months`` (negative: back): the previous or next period's name."""
    year, number = _month(month)
    index = year * 12 + number - 1 + months
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def parse_day(value: date | str, what: str) -> date:
    """A day given as a ``date`` or as ``YYYY-MM-DD``; ``AdminError`` naming ``what``."""
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    text = value.strip() if isinstance(value, str) else ""
    try:
        if _DAY.fullmatch(text):
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise AdminError(f"the {what} date {str(value)[:40]!r} is not a day: use YYYY-MM-DD")


def _range(
    period: str | None,
    start: date | str | None,
    end: date | str | None,
    billing_day: int,
    today: date,
) -> tuple[date, date, str | None]:
    """The report's first and last day, and the month that names them when they are a
    billing period (``None`` for a range given by its dates)."""
    if start is None and end is None:
        if period is None:
            month = period_month(today, billing_day)
        else:
            month = "{:04d}-{:02d}".format(*_month(period))  # " 2026-11" is 2026-11
        first, last = billing_period(month, billing_day)
        return first, last, month
    if start is None or end is None:
        raise AdminError("a range needs both a from date and a to date (YYYY-MM-DD)")
    first, last = parse_day(start, "from"), parse_day(end, "to")
    if first > last:
        raise AdminError(f"the from date {first} is after the to date {last}")
    days = (last - first).days + 1
    if days > MAX_DAYS:
        raise AdminError(f"the range covers {days} days; a report covers at most {MAX_DAYS}")
    return first, last, None


# -- the report --------------------------------------------------------------------


@dataclass(frozen=True)
class UsageLine:
    """One day's use of one resource (``""``: the caller's requests themselves)."""

    day: date
    resource: str
    units: int  # admitted and kept (after refunds and settlement)
    requests: int  # admitted
    denied: int  # refused

    @property
    def used(self) -> int:
        """What a quota counts: requests for resource ``""``, units for a named one."""
        return self.requests if not self.resource else self.units


@dataclass(frozen=True)
class CalendarQuota:
    """A calendar limit of the caller's plan, and the share of it the period used."""

    limit: int
    per: str  # "month" or "year"
    used: int

    @property
    def share(self) -> float:
        return self.used / self.limit

    def __str__(self) -> str:
        return f"{self.limit}/{self.per}"


@dataclass(frozen=True)
class UsageTotal:
    """One resource's use over the whole report, against its calendar quotas."""

    resource: str
    units: int
    requests: int
    denied: int
    quotas: tuple[CalendarQuota, ...] = ()

    @property
    def used(self) -> int:
        return self.requests if not self.resource else self.units


@dataclass(frozen=True)
class UsageReport:
    """What one caller used from ``first`` to ``last`` (local days, both included).

    ``kind`` is ``client``, ``tenant`` or ``identity``; ``key`` is what the ledger files
    it under (a client's id, the tenant, the identity) and ``name`` how people call it.
    ``month`` names the billing period the days are (``None``: a range given by dates);
    ``today`` is the day the report was made on, in ``timezone``. ``lines`` holds a line
    per day and resource with use (days without any have none); ``totals``, one per
    resource used or with a calendar quota in ``plan``.
    """

    kind: str
    key: str
    name: str
    plan: str | None
    billing_day: int
    timezone: str
    first: date
    last: date
    month: str | None
    today: date
    lines: tuple[UsageLine, ...]
    totals: tuple[UsageTotal, ...]

    @property
    def caller(self) -> str:
        """``client acme (id 7)``, ``tenant acme``, ``identity u42``."""
        if self.kind == "client":
            return f"client {self.name} (id {self.key})"
        return f"{self.kind} {self.name}"

    @property
    def days(self) -> list[date]:
        """Every day of the report, first to last."""
        return [self.first + timedelta(days=n) for n in range((self.last - self.first).days + 1)]

    @property
    def previous_month(self) -> str | None:
        """The billing period before this one (``None`` for a range given by dates, or
        before the first period a date can hold)."""
        return self._neighbour(-1)

    @property
    def next_month(self) -> str | None:
        """The billing period after this one, if it has begun by ``today``."""
        following = self._neighbour(1)
        if following is None or billing_period(following, self.billing_day)[0] > self.today:
            return None
        return following

    def _neighbour(self, months: int) -> str | None:
        if self.month is None:
            return None
        month = shift_month(self.month, months)
        try:
            billing_period(month, self.billing_day)
        except AdminError:  # beyond the years a date holds
            return None
        return month

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``json.dumps`` it): ``caller``, ``period``,
        ``days`` (the lines) and ``totals`` with their ``quotas``."""
        return {
            "caller": {
                "kind": self.kind,
                "key": self.key,
                "name": self.name,
                "plan": self.plan,
                "billing_day": self.billing_day,
            },
            "period": {
                "first": self.first.isoformat(),
                "last": self.last.isoformat(),
                "month": self.month,
                "timezone": self.timezone,
            },
            "days": [
                {
                    "day": line.day.isoformat(),
                    "resource": line.resource,
                    "units": line.units,
                    "requests": line.requests,
                    "denied": line.denied,
                }
                for line in self.lines
            ],
            "totals": [
                {
                    "resource": total.resource,
                    "units": total.units,
                    "requests": total.requests,
                    "denied": total.denied,
                    "quotas": [
                        {"limit": q.limit, "per": q.per, "used": q.used, "share": q.share}
                        for q in total.quotas
                    ],
                }
                for total in self.totals
            ],
        }

    def csv_text(self) -> str:
        """``day,resource,units,requests,denied``, then one line per day and resource
        with use, oldest first (resource empty: the caller's requests). Nothing else: the
        totals are the columns' sums."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        for line in self.lines:
            row = (line.day.isoformat(), line.resource, line.units, line.requests, line.denied)
            writer.writerow(row)
        return out.getvalue()

    def table_text(self) -> str:
        """The report for a terminal: who and when, a line per day and resource, then
        the totals against the quotas."""
        plan = f", plan {self.plan}" if self.plan else ""
        head = [
            f"{self.caller}{plan}, billing day {self.billing_day}",
            f"{self.first} to {self.last} ({self.timezone})",
            "",
        ]
        days = _columns(
            ["DAY", "RESOURCE", "UNITS", "REQUESTS", "DENIED"],
            [
                [str(x.day), x.resource or _REQUESTS, str(x.units), str(x.requests), str(x.denied)]
                for x in self.lines
            ],
        )
        if not self.lines:
            days.append("no use recorded in this period")
        totals = _columns(
            ["TOTAL", "UNITS", "REQUESTS", "DENIED", "QUOTA", "USED"],
            [
                [
                    t.resource or _REQUESTS, str(t.units), str(t.requests), str(t.denied),
                    ", ".join(str(q) for q in t.quotas) or "-",
                    ", ".join(f"{q.share:.1%}" for q in t.quotas) or "-",
                ]
                for t in self.totals
            ],
        )  # fmt: skip
        return "\n".join([*head, *days, "", *totals]) + "\n"


def _columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, numbers and all."""
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]


# -- reading the ledger ------------------------------------------------------------


@dataclass(frozen=True)
class _Caller:
    """Who a report is about, as found: its rows' filter, plan and billing day."""

    kind: str
    key: str
    name: str
    where: ColumnElement[bool]
    plan: Plan | None
    billing_day: int
    quota_tier: str  # "user" (a client's or identity's own) or "tenant"


def usage_report(
    state: QuotaState,
    *,
    client: int | str | None = None,
    tenant: str | None = None,
    identity: str | None = None,
    period: str | None = None,
    start: date | str | None = None,
    end: date | str | None = None,
    today: date | None = None,
    catalog: PlanCatalog | None = None,
) -> UsageReport:
    """What one caller used, from the ledger, per day and resource, with its totals
    against the calendar quotas of its plan.

    Name exactly one caller: ``client`` (an id, or a name; an ``int`` is an id only),
    ``tenant`` (rows whose tenant it is, every caller of it together) or ``identity``
    (rows whose caller it is: an API client's identity is its id). Give a billing
    ``period`` (``"2026-11"``: the period starting in that month), or ``start`` and
    ``end`` (dates or ``YYYY-MM-DD``, both included, at most 366 days), or neither: the
    billing period ``today`` is in (default: today in ``QUOTA_TIMEZONE``).

    The billing day is the client's own, else ``QUOTA_BILLING_DAY`` (a tenant: its
    clients' day when they all share one; an identity: its client's). Plans come from
    ``catalog`` (default: the one requests use now; the CLI passes a fresh read).

    Raises ``AdminError`` (one line, nothing read or changed) for bad input,
    ``UnknownCaller`` for a client that does not exist, and SQLAlchemy's errors when
    the database fails.
    """
    named = [k for k, v in (("client", client), ("tenant", tenant), ("identity", identity))
             if v is not None]  # fmt: skip
    if len(named) != 1:
        got = f" (got {' and '.join(named)})" if named else ""
        raise AdminError(f"name one caller: a client, a tenant or an identity{got}")
    if period is not None and (start is not None or end is not None):
        raise AdminError("give a period (YYYY-MM) or a from/to range of dates, not both")
    if period is not None:
        _month(period)  # every input is checked before the database is asked anything
    elif start is not None or end is not None:
        _range(None, start, end, 1, date.min)
    settings = state.settings
    zone = settings.calendar
    today = today if today is not None else datetime.now(zone.zone).date()
    catalog = catalog if catalog is not None else state.catalog()
    with state.sql.session() as session:
        bounded(session)
        if client is not None:
            who = _client(session, client, catalog, state)
        elif tenant is not None:
            who = _tenant(session, tenant, catalog, state)
        else:
            assert identity is not None
            who = _identity(identity, catalog, state)
        first, last, month = _range(period, start, end, who.billing_day, today)
        rows = session.execute(
            select(
                UsageRow.day,
                UsageRow.resource,
                func.sum(UsageRow.units),
                func.sum(UsageRow.requests),
                func.sum(UsageRow.denied),
            )
            .where(who.where, UsageRow.day >= first, UsageRow.day <= last)
            .group_by(UsageRow.day, UsageRow.resource)
            .order_by(UsageRow.day, UsageRow.resource)
        ).all()
    lines = tuple(
        UsageLine(_as_date(day), resource, int(units or 0), int(requests or 0), int(denied or 0))
        for day, resource, units, requests, denied in rows
    )
    return UsageReport(
        kind=who.kind,
        key=who.key,
        name=who.name,
        plan=who.plan.name if who.plan is not None else None,
        billing_day=who.billing_day,
        timezone=zone.zone_name,
        first=first,
        last=last,
        month=month,
        today=today,
        lines=lines,
        totals=_totals(lines, who),
    )


def _as_date(value: Any) -> date:
    """A ``Date`` column's value (a driver may answer a ``datetime`` or text)."""
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value)[:10])


def _client(
    session: Session, wanted: int | str, catalog: PlanCatalog, state: QuotaState
) -> _Caller:
    """A client by id (an ``int``, or digits) or by name; revoked ones included."""
    text = str(wanted).strip()
    found: Client | None = None
    if text.isascii() and text.isdigit() and len(text) <= 18:
        found = session.get(Client, int(text))
    if found is None and not isinstance(wanted, int) and text:
        found = session.scalar(select(Client).where(Client.name == text))
    if found is None:
        count = session.scalar(select(func.count()).select_from(Client))
        raise UnknownCaller(
            f"no client with id or name {text[:100]!r} ({count} clients exist; "
            "flask quota clients list shows them)"
        )
    settings = state.settings
    plan_name = session.scalar(select(PlanRecord.name).where(PlanRecord.id == found.plan_id))
    plan = catalog.resolve(
        plan_name or settings.default_plan,
        str(found.id),
        fallback=settings.default_plan,
        tenant=found.tenant,
    )
    return _Caller(
        kind="client",
        key=str(found.id),
        name=found.name,
        where=UsageRow.caller == str(found.id),
        plan=plan,
        billing_day=found.billing_day or settings.calendar.billing_day,
        quota_tier="user",
    )


def _tenant(session: Session, wanted: str, catalog: PlanCatalog, state: QuotaState) -> _Caller:
    """A tenant: any valid name (an identity loader's tenants are in no table). Its plan
    and billing day are its live clients' when they all share one."""
    try:
        name = validators.tenant_name(wanted)
    except ValueError as exc:
        raise AdminError(str(exc)) from None
    settings = state.settings
    clients = session.execute(
        select(PlanRecord.name, Client.billing_day)
        .join(PlanRecord, Client.plan_id == PlanRecord.id)
        .where(Client.tenant == name, Client.revoked_at.is_(None))
    ).all()
    plans = {plan for plan, _ in clients}
    days = {day or settings.calendar.billing_day for _, day in clients}
    if len(plans) > 1:
        plan = None  # one tenant bucket per plan rate: no single quota to set totals against
    else:
        chosen = next(iter(plans), settings.default_plan)
        plan = catalog.resolve(chosen, None, fallback=settings.default_plan, tenant=name)
    return _Caller(
        kind="tenant",
        key=name,
        name=name,
        where=UsageRow.tenant == name,
        plan=plan,
        billing_day=days.pop() if len(days) == 1 else settings.calendar.billing_day,
        quota_tier="tenant",
    )


def _identity(wanted: str, catalog: PlanCatalog, state: QuotaState) -> _Caller:
    """An identity as the ledger files it (an API client: its id; a long one: its digest,
    ``ledger.caller_of``); its plan and billing day are its client's, else the defaults
    (the ledger keeps no plan)."""
    if not isinstance(wanted, str) or not wanted:
        raise AdminError("the identity must not be empty")
    settings = state.settings
    plan = catalog.resolve(
        catalog.client_plan(wanted) or settings.default_plan,
        wanted,
        fallback=settings.default_plan,
        tenant=catalog.client_tenant(wanted),
    )
    return _Caller(
        kind="identity",
        key=caller_of(wanted),
        name=wanted,
        where=UsageRow.caller == caller_of(wanted),
        plan=plan,
        billing_day=catalog.billing_day(wanted) or settings.calendar.billing_day,
        quota_tier="user",
    )


def _quotas(rates: Rates | None, used: int) -> tuple[CalendarQuota, ...]:
    return tuple(
        CalendarQuota(rate.limit, rate.calendar, used)
        for rate in rates or ()
        if rate.calendar is not None
    )


def _totals(lines: Sequence[UsageLine], who: _Caller) -> tuple[UsageTotal, ...]:
    """A total per resource used, and per resource with a calendar quota in the plan
    (unused: zero), the caller's own requests first."""
    sums: dict[str, list[int]] = {}
    for line in lines:
        acc = sums.setdefault(line.resource, [0, 0, 0])
        acc[0] += line.units
        acc[1] += line.requests
        acc[2] += line.denied
    limits: dict[str, Rates | None] = {}
    plan = who.plan
    if plan is not None:
        limits[""] = plan.tenant_rate if who.quota_tier == "tenant" else plan.user_rate
        if who.quota_tier == "user":
            limits.update(plan.resources)
    for resource, rates in limits.items():
        if _quotas(rates, 0):
            sums.setdefault(resource, [0, 0, 0])
    totals = []
    for resource in sorted(sums):
        units, requests, denied = sums[resource]
        used = requests if not resource else units
        quotas = _quotas(limits.get(resource), used)
        totals.append(UsageTotal(resource, units, requests, denied, quotas))
    return tuple(totals)
