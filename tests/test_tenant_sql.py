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
from tests.sqldb import DATABASES, database, sql_store


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database(request.param, tmp_path)


PLANS = {
    "free": {"user": "5/hour"},
    "pro": {"tenant": "5/minute", "user": "100/minute"},
}


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url)
    Quota(app)

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
