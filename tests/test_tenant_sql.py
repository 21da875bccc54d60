"""Tenants kept in SQL: a client's tenant column, overrides aimed at a tenant, and the
CLI that sets them. Each on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import Result
from flask import Flask

from flask_quota import Quota
from tests.projects import Project
from tests.sqldb import sql_store

PLANS = {
    "free": {"user": "5/hour"},
    "pro": {"tenant": "5/minute", "user": "100/minute"},
}


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url)
    app.config["TEST_QUOTA"] = Quota(app)

    @app.get("/items")
    def items() -> str:
        return "items"

    yield app
    sql_store(app).close()


def run(app: Flask, *args: str) -> Result:
    return app.test_cli_runner().invoke(args=["quota", *args, "--actor", "alice"])


def create(app: Flask, name: str, *options: str) -> tuple[int, str]:
    result = run(app, "clients", "create", name, *options)
    assert result.exit_code == 0, result.output
    client_id = int(re.search(r"client (\d+)", result.output).group(1))  # type: ignore[union-attr]
    key = re.search(r"API key: (\S+)", result.output).group(1)  # type: ignore[union-attr]
    return client_id, key


def statuses(app: Flask, keys: list[str]) -> list[int]:
    sql_store(app).refresh()
    http = app.test_client()
    return [http.get("/items", headers={"X-API-Key": key}).status_code for key in keys]


def test_clients_of_one_tenant_share_its_bucket(app: Flask) -> None:
    """Must-show, from SQL: alice and bob of acme alternate 200 x5, 429, 429, the 429
    naming the tenant tier; carol of globex is served."""
    _, alice = create(app, "alice", "--plan", "pro", "--tenant", "acme")
    _, bob = create(app, "bob", "--plan", "pro", "--tenant", "acme")
    _, carol = create(app, "carol", "--plan", "pro", "--tenant", "globex")
    assert statuses(app, [alice, bob] * 3 + [alice]) == [200] * 5 + [429, 429]
    denied = app.test_client().get("/items", headers={"X-API-Key": bob})
    assert denied.get_json()["tier"] == "tenant"
    assert statuses(app, [carol] * 3) == [200] * 3
    listing = app.test_cli_runner().invoke(args=["quota", "clients", "list"]).output
    assert re.search(r"alice\s+pro\s+acme", listing), listing


def test_a_client_moves_to_another_tenant(app: Flask) -> None:
    client_id, alice = create(app, "alice", "--plan", "pro", "--tenant", "acme")
    _, bob = create(app, "bob", "--plan", "pro", "--tenant", "acme")
    assert statuses(app, [bob] * 5) == [200] * 5
    assert statuses(app, [alice]) == [429]
    result = run(app, "clients", "set-tenant", str(client_id), "globex")
    assert result.exit_code == 0, result.output
    assert statuses(app, [alice]) == [200]
    assert run(app, "clients", "set-tenant", str(client_id), "--none").exit_code == 0
    assert statuses(app, [alice] * 2) == [200, 200]


def test_an_override_aimed_at_a_tenant_applies_to_all_its_clients(app: Flask) -> None:
    """`overrides set --tenant T TIER RATE`: the tenant's bucket takes the rate for all
    its clients; setting it again replaces it."""
    _, alice = create(app, "alice", "--plan", "pro", "--tenant", "acme")
    _, bob = create(app, "bob", "--plan", "pro", "--tenant", "acme")
    _, carol = create(app, "carol", "--plan", "pro", "--tenant", "globex")
    result = run(app, "overrides", "set", "--tenant", "acme", "tenant", "7/minute")
    assert result.exit_code == 0, result.output
    assert statuses(app, [alice, bob] * 4) == [200] * 7 + [429]
    assert statuses(app, [carol] * 6) == [200] * 5 + [429]  # globex keeps the plan's 5
    listing = app.test_cli_runner().invoke(args=["quota", "overrides", "list"]).output
    assert re.search(r"tenant acme\s+tenant\s+-\s+7/minute", listing), listing
    # set again: replaced, not duplicated
    assert run(app, "overrides", "set", "--tenant", "acme", "tenant", "9/minute").exit_code == 0
    listing = app.test_cli_runner().invoke(args=["quota", "overrides", "list"]).output
    assert "7/minute" not in listing and "9/minute" in listing


@pytest.mark.parametrize(
    "args, message",
    [
        (["clients", "create", "x", "--plan", "pro", "--tenant", ""], "tenant"),
        (["clients", "create", "x", "--plan", "pro", "--tenant", "a\r\nb"], "tenant"),
        (["clients", "create", "x", "--plan", "pro", "--tenant", "t" * 65], "tenant"),
        (["overrides", "set", "--tenant", "acme", "tenant", "five/minute"], "rate"),
        (["overrides", "set", "tenant", "5/minute"], "--client or --tenant"),
    ],
)
def test_bad_tenant_input_is_refused_and_changes_nothing(
    app: Flask, args: list[str], message: str
) -> None:
    result = run(app, *args)
    assert result.exit_code != 0
    assert message in result.output, result.output
    listing = app.test_cli_runner().invoke(args=["quota", "clients", "list"]).output
    assert not re.search(r"^\d+\s+x\s", listing, re.M)
    assert "five" not in app.test_cli_runner().invoke(args=["quota", "overrides", "list"]).output


def test_a_clients_own_override_wins_over_its_tenants(app: Flask) -> None:
    """A tenant override of the user tier reaches every client of the tenant; a
    client's own override of that tier wins over it."""
    alice_id, alice = create(app, "alice", "--plan", "free", "--tenant", "acme")
    _, bob = create(app, "bob", "--plan", "free", "--tenant", "acme")
    assert run(app, "overrides", "set", "--tenant", "acme", "user", "2/hour").exit_code == 0
    assert run(app, "overrides", "set", "--client", str(alice_id), "user", "3/hour").exit_code == 0
    assert statuses(app, [bob] * 3) == [200, 200, 429]
    assert statuses(app, [alice] * 4) == [200, 200, 200, 429]


def test_a_clients_own_billing_day_moves_its_month(tmp_path: Path, database_url: str) -> None:
    """`clients create --billing-day 25` on a 2/month plan, on 2026-03-20 (frozen): its
    month ends on 2026-03-25, another client's on QUOTA_BILLING_DAY (April 1)."""
    from datetime import UTC, datetime

    from flask_quota.storage import MemoryStorage
    from flask_quota.testing import FrozenClock

    clock = FrozenClock(datetime(2026, 3, 20, 12, tzinfo=UTC).timestamp())
    app = Flask(__name__, instance_path=str(tmp_path / "cal"))
    app.config.update(
        TESTING=True,
        QUOTA_PLANS={"monthly": {"user": "2/month"}},
        QUOTA_DEFAULT_PLAN="monthly",
        QUOTA_ANONYMOUS_PLAN="monthly",
        QUOTA_DATABASE_URL=database_url,
        QUOTA_STATUS_URL="/rate_limit",
    )
    app.config["TEST_QUOTA"] = Quota(app, storage=MemoryStorage(clock))

    @app.get("/items")
    def items() -> str:
        return "items"

    try:
        own_id, own = create(app, "own", "--plan", "monthly", "--billing-day", "25")
        _, default = create(app, "default", "--plan", "monthly")
        assert statuses(app, [own] * 3) == [200, 200, 429]
        assert statuses(app, [default] * 3) == [200, 200, 429]
        http = app.test_client()
        reply = http.get("/items", headers={"X-API-Key": own})
        own_reset = int(reply.headers["X-RateLimit-Reset"])
        assert own_reset == int(datetime(2026, 3, 25, tzinfo=UTC).timestamp())
        status = http.get("/rate_limit", headers={"X-API-Key": own}).get_json()
        user = next(row for row in status["limits"] if row["tier"] == "user")
        left = own_reset - int(clock.now_us // 1_000_000)
        assert (user["remaining"], user["reset"]) == (0, left)  # its own month, read
        with app.app_context():  # and so does an operator's peek
            (bucket,) = app.config["TEST_QUOTA"].peek(str(own_id))
            assert (bucket.remaining, bucket.reset_in) == (0, left)
        clock.now_us = int(datetime(2026, 3, 25, 0, 0, 1, tzinfo=UTC).timestamp() * 1e6)
        assert statuses(app, [own, default]) == [200, 429]
        bad = run(app, "clients", "create", "x", "--plan", "monthly", "--billing-day", "32")
        assert bad.exit_code != 0 and "billing day" in bad.output
        listing = app.test_cli_runner().invoke(args=["quota", "clients", "list"]).output
        assert re.search(r"own\s+monthly\s+-\s+25\s", listing), listing
        assert not re.search(r"^\d+\s+x\s", listing, re.M)
    finally:
        sql_store(app).close()


def test_tables_at_an_older_revision_are_refused_until_upgraded(
    tmp_path: Path, database_url: str
) -> None:
    """Tables stamped 0001 (an older flask-quota made them) are refused with the command
    that upgrades them; `flask quota db upgrade` does, and clients get tenants then. Each
    command runs on a fresh app, as a new `flask` process would."""
    project = Project(tmp_path, database_url)
    project.ok("quota", "db", "upgrade", "0001_quota_tables")
    refused = project.run("quota", "clients", "list")
    assert refused.code != 0
    assert "0001_quota_tables" in refused.stderr and "flask quota db upgrade" in refused.stderr
    project.ok("quota", "db", "upgrade")
    made = project.ok("quota", "clients", "create", "a", "--plan", "free", "--tenant", "acme",
                      "--actor", "t")  # fmt: skip
    assert "of tenant 'acme'" in made


def test_peek_and_reset_see_what_the_tenant_overrides_make(app: Flask) -> None:
    """A tenant tier that only a tenant override gives (plan `free` has none) is peeked
    and reset like a plan's; peeking at a client shows its tenant's override of its own
    tier, read from SQL without naming the tenant."""
    alice_id, alice = create(app, "alice", "--plan", "free", "--tenant", "acme")
    assert run(app, "overrides", "set", "--tenant", "acme", "tenant", "3/minute").exit_code == 0
    assert run(app, "overrides", "set", "--tenant", "acme", "user", "4/hour").exit_code == 0
    assert statuses(app, [alice] * 4) == [200, 200, 200, 429]
    quota = app.config["TEST_QUOTA"]
    with app.app_context():
        (bucket,) = quota.peek(tenant="acme")
        assert (bucket.tier, bucket.rate, bucket.remaining) == ("tenant", "3/minute", 0)
        own = {b.tier: b for b in quota.peek(str(alice_id))}
        assert (own["user"].rate, own["user"].remaining) == ("4/hour", 1)
        assert own["tenant"].remaining == 0
        assert quota.reset(tenant="acme") == 1
    assert statuses(app, [alice]) == [200]
