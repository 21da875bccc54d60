"""Concurrent edits of one plan run one after the other: every audit entry's "before"
is the state the previous change left, no change is silently lost, and an edit based
on a page someone has changed since is refused with "reload"."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event

from flask_quota import Quota
from flask_quota.dashboard import admin_views
from flask_quota.sql.admin import ChangeConflict, QuotaAdmin, StaleEdit
from flask_quota.testing import MemoryStorage
from tests.sqldb import sql_store

PLANS = {"free": {"user": "5/hour"}, "pro": {"user": "50/hour"}}


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url)
    Quota(app, storage=MemoryStorage())
    sql_store(app).ensure_ready()
    yield app
    sql_store(app).close()


def slow_reads_of_limits(app: Flask) -> Any:
    """Every read of a plan's limits takes 30 ms longer: two edits that read the same
    state before either writes (the lost update) then happen every time they can."""

    def pause(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM QUOTA_PLAN_LIMITS" in (
            statement.upper()
        ):
            time.sleep(0.03)

    engine = sql_store(app).engine
    event.listen(engine, "before_cursor_execute", pause)
    return lambda: event.remove(engine, "before_cursor_execute", pause)


def test_simultaneous_edits_of_one_plan_leave_an_exact_audit_chain(app: Flask) -> None:
    """Must show: 20 rounds of two simultaneous edits of one plan limit leave an audit log
    whose every "before" is the previous entry's "after", and whose last "after" is the
    plan as stored: no edit overwrote another unseen."""
    sql = sql_store(app)
    undo = slow_reads_of_limits(app)
    errors: list[BaseException] = []
    try:
        for round_ in range(20):
            barrier = threading.Barrier(2)

            def edit(n: int, round_: int = round_, barrier: threading.Barrier = barrier) -> None:
                admin = QuotaAdmin(sql, actor=f"op{n}")
                barrier.wait()
                try:
                    admin.set_plan_limit("free", "user", f"{round_ * 2 + n + 1}/minute")
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=edit, args=(n,)) for n in (0, 1)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
    finally:
        undo()
    assert errors == []
    log = list(reversed(QuotaAdmin(sql, actor="t").audit_log(limit=100)))
    sets = [entry for entry in log if entry.action == "plan.limit.set"]
    assert len(sets) == 40
    broken = [
        (earlier.after, later.before)
        for earlier, later in itertools.pairwise(sets)
        if later.before != earlier.after
    ]
    assert broken == [], f"{len(broken)} entries' before is not the previous after"
    [free] = [plan for plan in QuotaAdmin(sql, actor="t").plans() if plan.name == "free"]
    assert sets[-1].after is not None
    assert [x["rate"] for x in sets[-1].after["limits"]] == [x.rate for x in free.limits]


def test_an_edit_based_on_a_stale_page_is_refused_and_saves_nothing(app: Flask) -> None:
    """An edit that carries the token of the plan as the operator saw it is refused with
    StaleEdit once someone else changed the plan: nothing saved, nothing audited; with
    the current token it goes through."""
    sql = sql_store(app)
    kim, lee = QuotaAdmin(sql, actor="kim"), QuotaAdmin(sql, actor="lee")
    seen = {plan.name: plan.token for plan in kim.plans()}
    lee.set_plan_limit("free", "user", "7/hour")
    audited = len(kim.audit_log())
    change: Callable[[], object]
    for change in (
        lambda: kim.set_plan_limit("free", "user", "9/hour", based_on=seen["free"]),
        lambda: kim.delete_plan_limit("free", "user", based_on=seen["free"]),
        lambda: kim.delete_plan("pro", based_on="0" * 16),
    ):
        with pytest.raises(StaleEdit, match="reload the page"):
            change()
    assert len(kim.audit_log()) == audited
    rates = {p.name: [x.rate for x in p.limits] for p in kim.plans()}
    assert rates == {"free": ["7/hour"], "pro": ["50/hour"]}
    current = {plan.name: plan.token for plan in kim.plans()}
    assert current["pro"] == seen["pro"]  # untouched plans keep their token
    after = kim.set_plan_limit("free", "user", "9/hour", based_on=current["free"])
    assert [x.rate for x in after.limits] == ["9/hour"]
    kim.delete_plan("pro", based_on=current["pro"])


def test_the_dashboard_shows_a_stale_edit_as_a_conflict() -> None:
    """StaleEdit is a ChangeConflict, which the dashboard already answers with 409 and
    the message on the plans page (so the operator is told to reload)."""
    assert issubclass(StaleEdit, ChangeConflict)
    assert admin_views._status(StaleEdit("reload")) == 409
