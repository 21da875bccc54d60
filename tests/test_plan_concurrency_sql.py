"""A plan's concurrency and its resources' units kept in SQL: seeded from QUOTA_PLANS,
set and cleared with the CLI (audited), exported, imported and compared with
QUOTA_PLANS, and counted in the 429 and in `flask quota usage`. On SQLite,
PostgreSQL and MariaDB."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from flask import Flask

from flask_quota import Quota
from flask_quota.core.plans import plans_config
from flask_quota.sql.admin import AdminError, QuotaAdmin
from flask_quota.sql.plansync import drift, import_plans, sql_plans
from flask_quota.testing import FrozenClock, MemoryStorage
from tests.sqldb import sql_store

PLANS: dict[str, Any] = {
    "free": {
        "user": "100/hour",
        "resources": {"ai_tokens": "2000/hour", "search": "10/minute"},
    },
    "pro": {
        "user": "500/minute",
        "concurrent": 4,
        "resources": {"ai_tokens": {"rate": "20000/hour", "unit": "tokens"}},
    },
}


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    """An app on a fresh database seeded from PLANS, with a metered ``ai_tokens`` view."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url)
    quota = Quota(app, storage=MemoryStorage(FrozenClock()))

    @app.post("/chat")
    @quota.limit(resource="ai_tokens", cost=1000)
    def chat() -> str:
        return "ok"

    sql_store(app).ensure_ready()
    yield app
    sql_store(app).close()


READS = {"export", "show", "list", "usage"}


def run(app: Flask, *args: str) -> Result:
    actor = [] if READS & set(args[:2]) else ["--actor", "alice"]
    return app.test_cli_runner().invoke(args=["quota", *args, *actor])


def ok(app: Flask, *args: str) -> str:
    result = run(app, *args)
    assert result.exit_code == 0, result.output
    return result.output


def refused(app: Flask, *args: str) -> str:
    result = run(app, *args)
    assert result.exit_code == 1, result.output
    return result.output


def plan(app: Flask, name: str) -> Any:
    return sql_store(app).load()[name]


def test_quota_plans_seed_concurrency_and_units_into_sql(app: Flask) -> None:
    """The seeded tables give back QUOTA_PLANS' concurrency and units, in the snapshot
    requests read and in `plans export`."""
    pro = plan(app, "pro")
    assert pro.concurrent == 4 and dict(pro.units) == {"ai_tokens": "tokens"}
    assert plan(app, "free").concurrent is None and not plan(app, "free").units
    assert json.loads(ok(app, "plans", "export")) == PLANS


def test_cli_sets_and_clears_a_plans_concurrency_audited(app: Flask) -> None:
    """`plans set free concurrent 3` bounds the plan (the snapshot has it, `plans show`
    and `plans list` say it, the audit log has before and after); `plans unset free
    concurrent` lifts it; a bound below 1, a word or an option that does not apply is
    refused and changes nothing."""
    assert "at most 3 requests" in ok(app, "plans", "set", "free", "concurrent", "3")
    assert plan(app, "free").concurrent == 3
    assert "concurrent: at most 3" in ok(app, "plans", "show", "free")
    assert re.search(r"free\s+concurrent\s+-\s+3 in flight", ok(app, "plans", "list"))
    entry = QuotaAdmin(sql_store(app), actor="t").audit_log(1)[0]
    assert (entry.actor, entry.action, entry.target) == (
        "alice",
        "plan.concurrent.set",
        "plan:free",
    )
    assert entry.before is not None and entry.after is not None
    assert (entry.before["concurrent"], entry.after["concurrent"]) == (None, 3)
    for bad, message in [
        ("0", "at least 1"),
        ("-2", "at least 1"),
        ("many", "at least 1"),
        ("1.5", "at least 1"),
    ]:
        assert message in refused(app, "plans", "set", "free", "concurrent", bad)
    assert "drop --resource" in refused(
        app, "plans", "set", "free", "concurrent", "2", "--resource", "x"
    )
    assert plan(app, "free").concurrent == 3
    assert "no bound" in ok(app, "plans", "unset", "free", "concurrent")
    assert plan(app, "free").concurrent is None
    assert "concurrent: no bound" in ok(app, "plans", "show", "free")


def test_cli_sets_and_clears_a_resources_unit(app: Flask) -> None:
    """`plans set ... --resource ai_tokens --unit tokens` gives the resource its unit
    (kept by a later edit without --unit, shown by `plans show`); `--unit default` clears
    it; a malformed unit or one on the user tier is refused and changes nothing."""
    out = ok(app, "plans", "set", "free", "endpoint", "2000/hour", "--resource", "ai_tokens",
             "--unit", "tokens")  # fmt: skip
    assert "is now 2000/hour, in tokens" in out
    assert plan(app, "free").unit_for("ai_tokens") == "tokens"
    ok(app, "plans", "set", "free", "endpoint", "3000/hour", "--resource", "ai_tokens")
    assert plan(app, "free").unit_for("ai_tokens") == "tokens"
    shown = ok(app, "plans", "show", "free")
    assert re.search(r"ai_tokens\s+3000/hour\s+default\s+enforce\s+tokens$", shown, re.M)
    assert re.search(r"search\s+10/minute\s+default\s+enforce\s+default$", shown, re.M)
    assert "lowercase words" in refused(
        app, "plans", "set", "free", "endpoint", "1/second", "--resource", "search",
        "--unit", "Tokens!",
    )  # fmt: skip
    assert "counts requests" in refused(
        app, "plans", "set", "free", "user", "5/minute", "--unit", "tokens"
    )
    assert plan(app, "free").unit_for("search") == "requests"
    assert str(plan(app, "free").user_rate) == "100/hour"
    ok(app, "plans", "set", "free", "endpoint", "3000/hour", "--resource", "ai_tokens",
       "--unit", "default")  # fmt: skip
    assert plan(app, "free").unit_for("ai_tokens") == "requests"


def test_a_unit_set_in_sql_is_the_429s_and_usages_unit(app: Flask) -> None:
    """Once the operator names ai_tokens' unit, the 429 counts tokens and `flask quota
    usage` shows the unit next to the bucket."""
    ok(app, "plans", "set", "free", "endpoint", "2000/hour", "--resource", "ai_tokens",
       "--unit", "tokens")  # fmt: skip
    sql_store(app).refresh()
    client = app.test_client()
    headers = {"X-API-Key": "x" * 20}  # unknown: anonymous, on the free plan
    assert [client.post("/chat", headers=headers).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    denied = client.post("/chat", headers=headers)
    assert denied.json is not None and "2000 tokens per 3600 s" in denied.json["detail"]
    usage = ok(app, "usage", "--ip", "127.0.0.1")
    row = next(line for line in usage.splitlines() if "ai_tokens" in line)
    assert "0/2000" in row and "tokens" in row
    assert "UNIT" in usage


def test_import_and_drift_cover_concurrency_and_units(app: Flask) -> None:
    """`plans import` writes concurrency and units (audited, exported back the same);
    `drift` names a concurrency or unit that differs from QUOTA_PLANS."""
    new = json.loads(json.dumps(PLANS))
    new["free"]["concurrent"] = 2
    new["free"]["resources"]["search"] = {"rate": "10/minute", "unit": "queries"}
    del new["pro"]["concurrent"]
    admin = QuotaAdmin(sql_store(app), actor="alice")
    assert sorted(import_plans(admin, json.dumps(new))) == [
        "changed plan 'free'",
        "changed plan 'pro'",
    ]
    assert plans_config(sql_plans(sql_store(app))) == new
    configured = list(app.extensions["quota"].settings.plans.values())
    lines = drift(configured, sql_plans(sql_store(app)))
    assert "plan 'free': concurrent none in QUOTA_PLANS, 2 in the database" in lines
    assert "plan 'pro': concurrent 4 in QUOTA_PLANS, none in the database" in lines
    assert "plan 'free' endpoint search: unit default in QUOTA_PLANS, queries in the database" in (
        lines
    )
    bad = json.loads(json.dumps(PLANS))
    bad["free"]["concurrent"] = 0
    with pytest.raises(AdminError, match="concurrent"):
        import_plans(admin, json.dumps(bad))
    assert plan(app, "free").concurrent == 2
