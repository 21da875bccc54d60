"""Usage reports from the ledger: billing periods, the report of a client, a tenant or an
identity (CSV, JSON, table), totals against calendar quotas, and refused input, from
Python and from `flask quota usage report`. The SQL ones on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from flask import Flask
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flask_quota import Quota
from flask_quota.admin_api import UsageReport as ReExported
from flask_quota.admin_api import usage_report as re_exported
from flask_quota.reports import (
    UnknownCaller,
    UsageReport,
    billing_period,
    current_period,
    period_month,
    shift_month,
    usage_report,
)
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.errors import AdminError
from flask_quota.sql.models import AuditEntry, UsageRow
from flask_quota.storage import MemoryStorage
from tests.sqldb import sql_store

PLANS = {
    "free": {
        "user": "100/minute, 3000/month",
        "tenant": "10000/month",
        "resources": {"ai": "1000/month", "search": "10/minute"},
    },
    "pro": {"user": "5000/month, 50000/year"},
}

D = date.fromisoformat


# -- billing periods (no database) -----------------------------------------------------


def test_billing_day_15_runs_from_the_15th_to_the_14th() -> None:
    """Billing day 15, period 2026-11: exactly 2026-11-15 to 2026-12-14."""
    assert billing_period("2026-11", 15) == (D("2026-11-15"), D("2026-12-14"))


def test_billing_day_1_is_the_calendar_month() -> None:
    """Billing day 1 gives the calendar month, a leap February included."""
    assert billing_period("2026-11", 1) == (D("2026-11-01"), D("2026-11-30"))
    assert billing_period("2028-02", 1) == (D("2028-02-01"), D("2028-02-29"))


@pytest.mark.parametrize(
    ("month", "first", "last"),
    [
        ("2026-01", "2026-01-31", "2026-02-27"),  # February has no 31st: it ends the 27th
        ("2026-02", "2026-02-28", "2026-03-30"),  # and starts on its last day
        ("2028-02", "2028-02-29", "2028-03-30"),  # a leap year's
        ("2026-04", "2026-04-30", "2026-05-30"),
    ],
)
def test_billing_day_31_is_clamped_to_a_short_months_last_day(
    month: str, first: str, last: str
) -> None:
    """Billing day 31 starts a short month's period on its last day, as N/month
    windows do (core.calendar)."""
    assert billing_period(month, 31) == (D(first), D(last))


def test_a_period_crosses_the_year_boundary() -> None:
    """December's period with billing day 15 ends on 2027-01-14; early January is in it,
    and the next one starts on January 15."""
    assert billing_period("2026-12", 15) == (D("2026-12-15"), D("2027-01-14"))
    assert current_period(D("2027-01-03"), 15) == (D("2026-12-15"), D("2027-01-14"))
    assert current_period(D("2027-01-15"), 15) == (D("2027-01-15"), D("2027-02-14"))
    assert shift_month("2026-12", 1) == "2027-01"
    assert shift_month("2027-01", -1) == "2026-12"


@pytest.mark.parametrize("billing_day", range(1, 32))
def test_periods_tile_the_calendar_without_gap_or_overlap(billing_day: int) -> None:
    """For every billing day, from 2025 to 2028: each period starts the day after the
    last one ends, and every day lies in the period period_month names for it (plain
    dates: nothing moves across a DST change)."""
    month = "2025-01"
    last = billing_period(month, billing_day)[1]
    for _ in range(47):
        following = shift_month(month, 1)
        next_first, next_last = billing_period(following, billing_day)
        assert next_first == last + timedelta(days=1), (month, billing_day)
        assert 28 <= (next_last - next_first).days + 1 <= 31
        for day in (next_first, next_first + timedelta(days=13), next_last):
            assert period_month(day, billing_day) == following
            assert current_period(day, billing_day) == (next_first, next_last)
        month, last = following, next_last


def test_the_day_before_the_billing_day_is_in_the_previous_period() -> None:
    """The 14th belongs to the period that started on last month's 15th."""
    assert period_month(D("2026-11-14"), 15) == "2026-10"
    assert period_month(D("2026-11-15"), 15) == "2026-11"
    assert period_month(D("2026-01-14"), 15) == "2025-12"


@pytest.mark.parametrize(
    "month", ["2026-13", "2026-00", "2026-1", "26-11", "nov", "2026-11-01", "", "0000-05"]
)
def test_a_malformed_month_is_refused(month: str) -> None:
    """Anything but YYYY-MM with a month 01-12 raises AdminError naming the form."""
    with pytest.raises(AdminError, match="period"):
        billing_period(month, 1)


# -- reports (SQL) ---------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    """An app on a fresh database, ledger on, seeded from PLANS."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url, QUOTA_LEDGER=True
    )
    Quota(app, storage=MemoryStorage())
    sql_store(app).ensure_ready()
    yield app
    sql_store(app).close()


def admin(app: Flask) -> QuotaAdmin:
    return QuotaAdmin(sql_store(app), actor="test")


def new_client(app: Flask, name: str, plan: str = "free", **fields: Any) -> str:
    """A client's id, as the ledger's caller column holds it."""
    info, _ = admin(app).create_client(name, plan, **fields)
    return str(info.id)


Row = tuple[str, str, str, str, int, int, int]  # day, caller, tenant, resource, units, req, denied


def insert(app: Flask, *rows: Row) -> None:
    """Ledger rows, written as the ledger's flush would leave them."""
    with Session(sql_store(app).engine) as session, session.begin():
        for day, caller, tenant, resource, units, requests, denied in rows:
            session.add(
                UsageRow(
                    day=D(day), caller=caller, tenant=tenant, resource=resource,
                    units=units, requests=requests, denied=denied,
                )
            )  # fmt: skip


def report(app: Flask, **selection: Any) -> UsageReport:
    """``usage_report`` with the plans read fresh (as the CLI reads them)."""
    return usage_report(app.extensions["quota"], catalog=sql_store(app).load(), **selection)


def csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_csv_of_a_billing_day_15_client_covers_exactly_the_15th_to_the_14th(app: Flask) -> None:
    """Rows on the 14th before and the 15th after are left out, and so is another
    client's; the CSV's lines are the rows inside, their sums the report's totals."""
    acme = new_client(app, "acme", billing_day=15)
    other = new_client(app, "other", billing_day=15)
    inside: list[Row] = [
        ("2026-11-15", acme, "", "", 10, 10, 1),
        ("2026-11-15", acme, "", "ai", 300, 2, 0),
        ("2026-11-30", acme, "", "", 20, 20, 0),
        ("2026-12-01", acme, "", "", 5, 5, 2),
        ("2026-12-14", acme, "", "ai", 40, 1, 3),
    ]
    outside: list[Row] = [
        ("2026-11-14", acme, "", "", 1000, 1000, 0),
        ("2026-12-15", acme, "", "", 2000, 2000, 0),
        ("2026-11-20", other, "", "", 3000, 3000, 0),
    ]
    insert(app, *inside, *outside)
    found = report(app, client="acme", period="2026-11")
    assert (found.first, found.last) == (D("2026-11-15"), D("2026-12-14"))
    rows = csv_rows(found.csv_text())
    assert rows[0] == ["day", "resource", "units", "requests", "denied"]
    assert rows[1:] == [[d, r, str(u), str(q), str(x)] for d, _, _, r, u, q, x in inside]
    totals = {t.resource: (t.units, t.requests, t.denied) for t in found.totals}
    assert totals == {"": (35, 35, 3), "ai": (340, 3, 3)}
    for resource, (units, requests, denied) in totals.items():
        mine = [r for r in rows[1:] if r[1] == resource]
        assert sum(int(r[2]) for r in mine) == units
        assert sum(int(r[3]) for r in mine) == requests
        assert sum(int(r[4]) for r in mine) == denied


def test_rows_of_one_day_under_two_tenants_are_one_line(app: Flask) -> None:
    """A client moved between tenants mid-day has two rows for the day: one CSV line."""
    acme = new_client(app, "acme")
    insert(
        app, ("2026-11-03", acme, "org-a", "", 4, 4, 0), ("2026-11-03", acme, "org-b", "", 6, 6, 1)
    )
    found = report(app, client=acme, period="2026-11")
    assert csv_rows(found.csv_text())[1:] == [["2026-11-03", "", "10", "10", "1"]]


def test_a_client_is_found_by_id_or_by_name(app: Flask) -> None:
    """``client`` takes the id (digits or an int) or the name; revoked clients too."""
    acme = new_client(app, "acme")
    admin(app).revoke_client(acme)
    insert(app, ("2026-11-03", acme, "", "", 4, 4, 0))
    by_name = report(app, client="acme", period="2026-11")
    by_id = report(app, client=int(acme), period="2026-11")
    assert by_name == by_id
    assert by_name.caller == f"client acme (id {acme})"
    assert [line.units for line in by_name.lines] == [4]


def test_the_default_is_the_billing_period_today_is_in(app: Flask) -> None:
    """Without a period or dates: the client's billing period that holds ``today``."""
    acme = new_client(app, "acme", billing_day=20)
    insert(app, ("2026-03-19", acme, "", "", 1, 1, 0), ("2026-03-20", acme, "", "", 2, 2, 0))
    found = report(app, client="acme", today=D("2026-04-02"))
    assert (found.first, found.last, found.month) == (D("2026-03-20"), D("2026-04-19"), "2026-03")
    assert [line.units for line in found.lines] == [2]
    assert found.previous_month == "2026-02"
    assert found.next_month is None  # 2026-04-20 has not come yet


def test_the_billing_day_falls_back_to_quota_billing_day(tmp_path: Path) -> None:
    """A client without a billing day of its own follows QUOTA_BILLING_DAY."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(QUOTA_PLANS=PLANS, QUOTA_BILLING_DAY=10, QUOTA_LEDGER=True)
    Quota(app, storage=MemoryStorage())
    try:
        new_client(app, "acme")
        found = report(app, client="acme", period="2026-11")
        assert (found.billing_day, found.first, found.last) == (
            10, D("2026-11-10"), D("2026-12-09"),
        )  # fmt: skip
    finally:
        sql_store(app).close()


def test_a_range_of_dates_includes_both_ends(app: Flask) -> None:
    """``start``/``end`` (dates or text) include both days; the report names no month."""
    acme = new_client(app, "acme")
    insert(app, *[(f"2026-11-0{d}", acme, "", "", d, d, 0) for d in range(1, 8)])
    found = report(app, client="acme", start="2026-11-02", end=D("2026-11-05"))
    assert [line.day.day for line in found.lines] == [2, 3, 4, 5]
    assert found.month is None and found.previous_month is None and found.next_month is None


def test_a_tenants_report_sums_every_caller_of_the_tenant(app: Flask) -> None:
    """Rows whose tenant is acme, whoever the caller (clients and identities alike), are
    summed per day; another tenant's are not; requests count against the tenant tier."""
    alice = new_client(app, "alice", tenant="acme")
    bob = new_client(app, "bob", tenant="acme")
    insert(
        app,
        ("2026-11-02", alice, "acme", "", 10, 10, 0),
        ("2026-11-02", bob, "acme", "", 5, 5, 1),
        ("2026-11-02", "loader-user", "acme", "", 1, 1, 0),
        ("2026-11-02", alice, "acme", "ai", 70, 1, 0),
        ("2026-11-02", "zed", "globex", "", 500, 500, 0),
    )
    found = report(app, tenant="acme", period="2026-11")
    assert [(x.resource, x.units, x.requests, x.denied) for x in found.lines] == [
        ("", 16, 16, 1),
        ("ai", 70, 1, 0),
    ]
    quotas = {t.resource: [(q.limit, q.per, q.used) for q in t.quotas] for t in found.totals}
    assert quotas == {"": [(10000, "month", 16)], "ai": []}  # a tenant has no endpoint quota
    assert found.caller == "tenant acme" and found.plan == "free"


def test_an_identitys_report_is_its_own_rows(app: Flask) -> None:
    """Rows whose caller is the identity, across tenants; others' rows are not counted;
    an identity no client has gets the default plan's quotas."""
    insert(
        app,
        ("2026-11-02", "u42", "acme", "", 3, 3, 0),
        ("2026-11-02", "u42", "", "", 4, 4, 2),
        ("2026-11-02", "u43", "", "", 100, 100, 0),
    )
    found = report(app, identity="u42", period="2026-11")
    assert [(x.units, x.requests, x.denied) for x in found.lines] == [(7, 7, 2)]
    assert found.plan == "free" and found.caller == "identity u42"
    assert found.totals[0].quotas[0].limit == 3000


def test_a_long_identity_is_read_under_its_digest(app: Flask) -> None:
    """An identity longer than the caller column is looked up as the ledger files it."""
    from flask_quota.ledger import caller_of

    long_id = "u" * 300
    insert(app, ("2026-11-02", caller_of(long_id), "", "", 3, 3, 0))
    found = report(app, identity=long_id, period="2026-11")
    assert [line.units for line in found.lines] == [3]
    assert found.name == long_id


def test_totals_are_set_against_the_plans_calendar_quotas(app: Flask) -> None:
    """Requests against the user tier's 3000/month, ai's units against its 1000/month;
    a resource with a calendar quota and no use is listed at 0; one without a calendar
    quota (search: 10/minute) has none; a client's override of the user tier wins."""
    acme = new_client(app, "acme")
    insert(
        app,
        ("2026-11-02", acme, "", "", 600, 600, 5),
        ("2026-11-02", acme, "", "search", 9, 9, 0),
    )
    found = report(app, client="acme", period="2026-11")
    totals = {t.resource: t for t in found.totals}
    assert set(totals) == {"", "ai", "search"}
    assert [(q.limit, q.per, q.used, q.share) for q in totals[""].quotas] == [
        (3000, "month", 600, 0.2)
    ]
    assert [(q.limit, q.used, q.share) for q in totals["ai"].quotas] == [(1000, 0, 0.0)]
    assert totals["ai"].units == 0 and totals["search"].quotas == ()
    admin(app).add_override(acme, "user", "1200/month")
    again = report(app, client="acme", period="2026-11")
    assert [(q.limit, q.share) for q in again.totals[0].quotas] == [(1200, 0.5)]


def test_a_plan_with_monthly_and_yearly_quotas_lists_both(app: Flask) -> None:
    """A pro client's requests are set against 5000/month and 50000/year."""
    acme = new_client(app, "acme", plan="pro")
    insert(app, ("2026-11-02", acme, "", "", 500, 500, 0))
    [total] = report(app, client="acme", period="2026-11").totals
    assert [(str(q), q.share) for q in total.quotas] == [("5000/month", 0.1), ("50000/year", 0.01)]


def test_json_has_the_caller_the_period_the_days_and_the_totals(app: Flask) -> None:
    """as_json(): exactly these keys and values, dates as ISO text, JSON-serialisable."""
    acme = new_client(app, "acme", billing_day=15, tenant="org")
    insert(app, ("2026-11-16", acme, "org", "ai", 250, 2, 1))
    data = report(app, client="acme", period="2026-11").as_json()
    assert json.loads(json.dumps(data)) == data
    assert data == {
        "caller": {"kind": "client", "key": acme, "name": "acme", "plan": "free",
                   "billing_day": 15},
        "period": {"first": "2026-11-15", "last": "2026-12-14", "month": "2026-11",
                   "timezone": "UTC"},
        "days": [{"day": "2026-11-16", "resource": "ai", "units": 250, "requests": 2,
                  "denied": 1}],
        "totals": [
            {"resource": "", "units": 0, "requests": 0, "denied": 0,
             "quotas": [{"limit": 3000, "per": "month", "used": 0, "share": 0.0}]},
            {"resource": "ai", "units": 250, "requests": 2, "denied": 1,
             "quotas": [{"limit": 1000, "per": "month", "used": 250, "share": 0.25}]},
        ],
    }  # fmt: skip


def test_usage_report_is_re_exported_by_admin_api() -> None:
    """The dashboard's door carries the report function and class."""
    assert re_exported is usage_report and ReExported is UsageReport


# -- refused input ---------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], str]] = [
    ({"client": "nobody", "period": "2026-11"}, "no client with id or name 'nobody'"),
    ({"client": "99", "period": "2026-11"}, "no client with id or name '99'"),
    ({"client": "acme", "period": "2026-13"}, "no month 13"),
    ({"client": "acme", "period": "11-2026"}, "is not a month: use YYYY-MM"),
    ({"client": "acme", "start": "2026-12-01", "end": "2026-11-01"}, "is after the to date"),
    ({"client": "acme", "start": "2026-01-01", "end": "2027-01-02"}, "covers 367 days"),
    ({"client": "acme", "start": "2026-02-30", "end": "2026-03-01"}, "is not a day"),
    ({"client": "acme", "start": "2026-02-01"}, "needs both a from date and a to date"),
    ({"client": "acme", "period": "2026-11", "start": "2026-11-01", "end": "2026-11-02"},
     "not both"),
    ({"client": "acme", "tenant": "org"}, "got client and tenant"),
    ({"client": "acme", "identity": "u1", "tenant": "org"}, "got client and tenant and identity"),
    ({}, "name one caller"),
    ({"tenant": "x" * 65}, "a tenant must be 1-64"),
    ({"identity": ""}, "identity must not be empty"),
]  # fmt: skip


def ledger_and_audit(app: Flask) -> tuple[int, int]:
    with Session(sql_store(app).engine) as session:
        usage = session.scalar(select(func.count()).select_from(UsageRow)) or 0
        audit = session.scalar(select(func.count()).select_from(AuditEntry)) or 0
    return usage, audit


@pytest.mark.parametrize(("selection", "message"), BAD)
def test_bad_input_raises_a_one_line_admin_error_and_changes_nothing(
    app: Flask, selection: dict[str, Any], message: str
) -> None:
    """Each refusal is an AdminError of one line saying what is wrong; the ledger and the
    audit log are as they were."""
    acme = new_client(app, "acme")
    insert(app, ("2026-11-02", acme, "", "", 1, 1, 0))
    before = ledger_and_audit(app)
    with pytest.raises(AdminError) as raised:
        report(app, **selection)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert ledger_and_audit(app) == before
    unknown = selection.get("client") in ("nobody", "99")
    assert isinstance(raised.value, UnknownCaller) == unknown


# -- the command -----------------------------------------------------------------------


def run(app: Flask, *args: str) -> Result:
    """``flask quota usage ...``, its stdout and stderr apart."""
    try:  # click < 8.2 mixes stderr into the output unless told not to; 8.2 never does
        runner = app.test_cli_runner(mix_stderr=False)
    except TypeError:
        runner = app.test_cli_runner()
    return runner.invoke(args=["quota", "usage", *args])


def test_the_commands_csv_and_json_are_the_reports_exactly(app: Flask) -> None:
    """--format csv prints the CSV and nothing else (so `> file.csv` works); --format json
    the JSON; the table names the caller, the period and each total with its quota."""
    acme = new_client(app, "acme", billing_day=15)
    insert(app, ("2026-11-15", acme, "", "", 7, 7, 1), ("2026-11-15", acme, "", "ai", 100, 1, 0))
    expected = report(app, client="acme", period="2026-11")
    csv_out = run(app, "report", "--client", "acme", "--period", "2026-11", "--format", "csv")
    assert csv_out.exit_code == 0 and csv_out.stdout == expected.csv_text()
    json_out = run(app, "report", "--client", acme, "--period", "2026-11", "--format", "json")
    assert json_out.exit_code == 0 and json.loads(json_out.stdout) == expected.as_json()
    table = run(app, "report", "--client", "acme", "--period", "2026-11")
    assert table.exit_code == 0
    assert f"client acme (id {acme}), plan free, billing day 15" in table.stdout
    assert "2026-11-15 to 2026-12-14 (UTC)" in table.stdout
    assert any(line.split() == ["ai", "100", "1", "0", "1000/month", "10.0%"]
               for line in table.stdout.splitlines())  # fmt: skip


def test_the_command_reads_a_tenant_an_identity_and_a_range(app: Flask) -> None:
    """--tenant, --identity and --from/--to select as the function does."""
    insert(
        app, ("2026-11-02", "u42", "acme", "", 3, 3, 0), ("2026-11-09", "u42", "acme", "", 4, 4, 0)
    )
    tenant = run(app, "report", "--tenant", "acme", "--from", "2026-11-01", "--to", "2026-11-05",
                 "--format", "csv")  # fmt: skip
    assert tenant.stdout.splitlines() == ["day,resource,units,requests,denied", "2026-11-02,,3,3,0"]
    identity = run(app, "report", "--identity", "u42", "--period", "2026-11", "--format", "csv")
    assert identity.stdout.splitlines()[1:] == ["2026-11-02,,3,3,0", "2026-11-09,,4,4,0"]


CLI_BAD = [
    (["--client", "nobody", "--period", "2026-11"], "no client with id or name 'nobody'"),
    (["--client", "acme", "--period", "2026-13"], "no month 13"),
    (["--client", "acme", "--from", "2026-12-01", "--to", "2026-11-01"], "is after the to date"),
    (["--client", "acme", "--from", "2025-01-01", "--to", "2026-11-01"], "at most 366"),
    (["--client", "acme", "--tenant", "org"], "got client and tenant"),
    (["--period", "2026-11"], "name one caller"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), CLI_BAD)
def test_the_command_refuses_bad_input_with_one_line_and_exit_1(
    app: Flask, args: list[str], message: str
) -> None:
    """Exit status 1, one line ``Error: ...`` on stderr, nothing on stdout."""
    new_client(app, "acme")
    result = run(app, "report", *args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_the_command_warns_on_stderr_when_the_ledger_is_off(tmp_path: Path) -> None:
    """QUOTA_LEDGER off: a warning on stderr, the CSV alone on stdout."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(QUOTA_PLANS=PLANS)
    Quota(app, storage=MemoryStorage())
    try:
        new_client(app, "acme")
        result = run(app, "report", "--client", "acme", "--period", "2026-11", "--format", "csv")
        assert result.exit_code == 0
        assert result.stdout == "day,resource,units,requests,denied\n"
        assert "QUOTA_LEDGER is off" in result.stderr
    finally:
        sql_store(app).close()


def test_usage_identity_still_shows_the_callers_buckets(app: Flask) -> None:
    """`usage IDENTITY [--plan P]` is `usage show IDENTITY`; `usage -- report` shows a
    caller named "report"; `usage --help` lists both subcommands."""
    plain = run(app, "u42", "--plan", "pro")
    assert plain.exit_code == 0 and "5000/month" in plain.stdout
    assert run(app, "show", "u42", "--plan", "pro").stdout == plain.stdout
    named = run(app, "--", "report")
    assert named.exit_code == 0 and "TIER" in named.stdout
    helped = run(app, "--help")
    assert helped.exit_code == 0
    assert "report" in helped.stdout and "show" in helped.stdout
