"""``flask quota ...``: plans, clients, overrides, usage and resets, each audited."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import Result
from flask import Flask
from flask.testing import FlaskCliRunner

from flask_quota import Quota
from flask_quota.sql.admin import QuotaAdmin
from tests.servers import ROOT, RedisServer
from tests.sqldb import sql_store

PLANS = {
    "free": {"user": "5/hour", "resources": {"search": "3/hour"}},
    "pro": {"user": "50/hour", "resources": {"search": "30/hour"}},
}


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url)
    quota = Quota(app)

    @app.get("/items")
    def items() -> str:
        return "items"

    @app.get("/search")
    @quota.limit(resource="search")
    def search() -> str:
        return "results"

    yield app
    sql_store(app).close()


def run(app: Flask, *args: str, actor: str | None = "alice") -> Result:
    runner: FlaskCliRunner = app.test_cli_runner()
    extra = ["--actor", actor] if actor is not None else []
    return runner.invoke(args=["quota", *args, *extra])


def read(app: Flask, *args: str) -> Result:
    result = app.test_cli_runner().invoke(args=["quota", *args])
    assert result.exit_code == 0, result.output
    return result


def create(app: Flask, name: str, plan: str) -> tuple[int, str]:
    result = run(app, "clients", "create", name, "--plan", plan)
    assert result.exit_code == 0, result.output
    client_id = int(re.search(r"client (\d+)", result.output).group(1))  # type: ignore[union-attr]
    key = re.search(r"API key: (\S+)", result.output).group(1)  # type: ignore[union-attr]
    return client_id, key


def audit(app: Flask) -> list[tuple[str, str, str]]:
    entries = QuotaAdmin(sql_store(app), actor="test").audit_log()
    return [(e.actor, e.action, e.target) for e in reversed(entries)]


def user_quota(app: Flask, key: str | None = None) -> int:
    headers = {"X-API-Key": key} if key else {}
    policy = app.test_client().get("/items", headers=headers).headers["RateLimit-Policy"]
    return int(policy.split('"user";q=')[1].split(";")[0])


def test_plans_list_and_set_change_what_requests_get(app: Flask) -> None:
    """`plans set` changes a plan's rate at once and `plans list` shows it."""
    assert user_quota(app) == 5
    result = run(app, "plans", "set", "free", "user", "8 per hour")
    assert result.exit_code == 0, result.output
    assert "user is now 8/hour" in result.output
    assert user_quota(app) == 8
    listing = read(app, "plans", "list").output
    assert re.search(r"free\s+user\s+-\s+8/hour", listing)
    assert re.search(r"pro\s+endpoint\s+search\s+30/hour", listing)
    result = run(app, "plans", "set", "free", "endpoint", "4/hour", "--resource", "export")
    assert result.exit_code == 0, result.output
    assert re.search(r"free\s+endpoint\s+export\s+4/hour", read(app, "plans", "list").output)
    assert audit(app) == [
        ("alice", "plan.limit.set", "plan:free"),
        ("alice", "plan.limit.set", "plan:free"),
    ]


def test_plans_create_unset_and_delete(app: Flask) -> None:
    """A created plan comes last without rates; `unset` drops a tier from it; `delete`
    is refused while a client is on it and works once none is; each change is audited."""
    result = run(app, "plans", "create", "team", "--description", "Small teams")
    assert result.exit_code == 0, result.output
    listing = read(app, "plans", "list").output
    last = listing.strip().splitlines()[-1]
    assert last.split()[0] == "team" and "no limits" in last
    assert run(app, "plans", "set", "team", "user", "20/hour").exit_code == 0
    client_id, key = create(app, "acme", "team")
    assert user_quota(app, key) == 20
    result = run(app, "plans", "unset", "team", "user")
    assert result.exit_code == 0, result.output
    assert "team': user has no rate now" in result.output
    policy = app.test_client().get("/items", headers={"X-API-Key": key}).headers
    assert '"user"' not in policy.get("RateLimit-Policy", "")  # the tier no longer applies
    refused = run(app, "plans", "delete", "team")
    assert refused.exit_code == 1 and "used by 1 client(s)" in refused.output
    assert run(app, "clients", "set-plan", str(client_id), "free").exit_code == 0
    result = run(app, "plans", "delete", "team")
    assert result.exit_code == 0, result.output
    assert "team" not in read(app, "plans", "list").output
    assert [action for _, action, _ in audit(app)] == [
        "plan.create",
        "plan.limit.set",
        "client.create",
        "plan.limit.delete",
        "client.set_plan",
        "plan.delete",
    ]


def test_clients_create_list_set_plan_and_revoke(app: Flask) -> None:
    """A client's key is printed once, listed by prefix only, and stops working when revoked."""
    client_id, key = create(app, "acme", "free")
    assert user_quota(app, key) == 5
    listing = read(app, "clients", "list").output
    assert key[:12] + "..." in listing and key not in listing
    assert run(app, "clients", "set-plan", str(client_id), "pro").exit_code == 0
    assert user_quota(app, key) == 50
    assert run(app, "clients", "revoke", str(client_id)).exit_code == 0
    assert user_quota(app, key) == 5  # anonymous again
    assert re.search(rf"{client_id}\s+acme\s+pro\s+.*revoked", read(app, "clients", "list").output)
    assert [action for _, action, _ in audit(app)] == [
        "client.create",
        "client.set_plan",
        "client.revoke",
    ]


def test_overrides_add_list_and_remove(app: Flask) -> None:
    """An override wins for its client until removed; --expires sets its end."""
    client_id, key = create(app, "acme", "free")
    result = run(app, "overrides", "add", str(client_id), "user", "12/hour", "--expires", "7d")
    assert result.exit_code == 0, result.output
    assert "until" in result.output
    assert user_quota(app, key) == 12
    listing = read(app, "overrides", "list", str(client_id)).output
    override_id = re.search(r"^(\d+)\s+\d+\s+user\s+-\s+12/hour", listing, re.M).group(1)  # type: ignore[union-attr]
    assert run(app, "overrides", "remove", override_id).exit_code == 0
    assert user_quota(app, key) == 5
    assert [action for _, action, _ in audit(app)][-2:] == ["override.set", "override.remove"]


def test_override_expiry_may_be_up_to_3650_days(app: Flask) -> None:
    """--expires takes up to 3650 days (520w is fine); the override ends that far out."""
    client_id, _ = create(app, "acme", "free")
    for lifetime, days in (("3650d", 3650), ("520w", 3640)):
        result = run(
            app, "overrides", "add", str(client_id), "user", "9/hour", "--expires", lifetime
        )
        assert result.exit_code == 0, result.output
        [info] = QuotaAdmin(sql_store(app), actor="test").overrides(str(client_id))
        assert info.expires_at is not None
        left = info.expires_at - datetime.now(UTC).replace(tzinfo=info.expires_at.tzinfo)
        assert timedelta(days=days - 1) < left <= timedelta(days=days)


def test_the_actor_defaults_to_the_user_running_the_command(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --actor, the audit log records $USER."""
    monkeypatch.setenv("USER", "operator-bob")
    assert run(app, "plans", "set", "pro", "user", "60/hour", actor=None).exit_code == 0
    assert audit(app)[-1] == ("operator-bob", "plan.limit.set", "plan:pro")


def test_plans_set_takes_several_rates(app: Flask) -> None:
    """`plans set ... "2/second, 3/minute"` stores the canonical text; both rates apply."""
    rates = "2/second,3 per minute"
    result = run(app, "plans", "set", "free", "endpoint", rates, "--resource", "search")
    assert result.exit_code == 0, result.output
    assert "endpoint search is now 2/second, 3/minute" in result.output
    http = app.test_client()
    response = http.get("/search")
    assert '"search";q=2;w=1, "search@60";q=3;w=60' in response.headers["RateLimit-Policy"]
    listing = read(app, "plans", "list").output
    assert re.search(r"free\s+endpoint\s+search\s+2/second, 3/minute", listing)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plans", "set", "gold", "user", "5/hour"], "unknown plan 'gold'"),
        (["plans", "set", "free", "user", "lots"], "malformed rate 'lots'"),
        (["plans", "set", "free", "user", "-5/hour"], "malformed rate '-5/hour'"),
        (
            ["plans", "set", "free", "endpoint", "5/hour"],
            "needs a resource, e.g. ai_inference (give --resource NAME)",
        ),
        (["plans", "set", "free", "user", "5/hour", "--resource", "x"], "drop --resource"),
        (["plans", "create", "free"], "a plan named 'free' exists already"),
        (["plans", "create", " padded"], "plan name ' padded'"),
        (["plans", "create", "x", "--description", "tab\there"], "description"),
        (["plans", "delete", "free"], "QUOTA_DEFAULT_PLAN"),
        (["plans", "delete", "gold"], "unknown plan 'gold'"),
        (["plans", "unset", "free", "endpoint", "--resource", "nothing"], "no endpoint nothing"),
        (["plans", "unset", "free", "endpoint"], "(give --resource NAME)"),
        (["plans", "unset", "gold", "user"], "unknown plan 'gold'"),
        (["clients", "create", "x", "--plan", "gold"], "unknown plan 'gold'"),
        (["clients", "revoke", "-3"], "positive integer"),
        (["clients", "revoke", "999"], "no client with id 999"),
        (["clients", "set-plan", "1", "gold"], "unknown plan 'gold'"),
        (["overrides", "add", "1", "user", "5/hour", "--expires", "-7d"], "must be positive"),
        (["overrides", "add", "1", "user", "5/hour", "--expires", "soon"], "malformed duration"),
        (["overrides", "add", "1", "user", "5/hour", "--expires", "999999999w"], "3650 days"),
        (["overrides", "add", "1", "user", "5/hour", "--expires", "3651d"], "3650 days"),
        (["overrides", "add", "1", "user", "5/hour", "--expires", "9999999999s"], "malformed"),
        (["overrides", "add", "-1", "user", "5/hour"], "positive integer"),
        (["overrides", "add", "1", "user", "0/hour"], "rate"),
        (["overrides", "remove", "0"], "positive integer"),
    ],
)
def test_bad_input_exits_non_zero_with_one_line_and_changes_nothing(
    app: Flask, args: list[str], message: str
) -> None:
    """Unknown plans, malformed rates and negative numbers: status 1, one line, no change."""
    create(app, "acme", "free")
    before = (sql_store(app).version(), audit(app), read(app, "plans", "list").output)
    result = run(app, *args)
    assert result.exit_code == 1
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert (sql_store(app).version(), audit(app), read(app, "plans", "list").output) == before


@pytest.mark.redis
def test_usage_peeks_without_charging_and_reset_clears(
    tmp_path: Path, database_url: str, own_redis: RedisServer
) -> None:
    """`usage` shows the buckets requests use without consuming; `reset` empties them."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        QUOTA_PLANS=PLANS, QUOTA_DATABASE_URL=database_url, QUOTA_STORAGE_URL=own_redis.url
    )
    quota = Quota(app)
    app.add_url_rule("/items", "items", lambda: "items")
    app.add_url_rule("/search", "search", quota.limit(resource="search")(lambda: "results"))
    try:
        client_id, key = create(app, "acme", "free")
        http = app.test_client()
        for path in ("/items", "/search", "/search"):
            assert http.get(path, headers={"X-API-Key": key}).status_code == 200
        first = read(app, "usage", str(client_id)).output
        assert re.search(r"user\s+user\s+5/hour\s+2/5", first), first
        assert re.search(r"endpoint\s+search \(GET\)\s+3/hour\s+1/3", first), first
        assert read(app, "usage", str(client_id)).output == first  # peeking charged nothing
        result = run(app, "reset", str(client_id))
        assert result.exit_code == 0 and f"reset 2 buckets of id={client_id}" in result.output
        after = read(app, "usage", str(client_id)).output
        assert re.search(r"user\s+user\s+5/hour\s+5/5", after), after
        assert audit(app)[-1] == ("alice", "usage.reset", f"id={client_id}")
        anonymous = read(app, "usage", "--ip", "127.0.0.1").output
        assert re.search(r"user\s+user\s+5/hour\s+5/5", anonymous), anonymous
    finally:
        sql_store(app).close()


def test_the_flask_command_line_works_on_the_demo_app(tmp_path: Path, database_url: str) -> None:
    """`flask --app wsgi quota ...` in a subprocess: a client is created, listed, usable."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("QUOTA_")},
        "QUOTA_DATABASE_URL": database_url,
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "flask", "--app", "wsgi", "quota"]

    def flask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )

    made = flask("clients", "create", "cli-client", "--plan", "pro", "--actor", "ci")
    assert made.returncode == 0, made.stderr
    assert "API key: fq_" in made.stdout
    assert "cli-client" in flask("clients", "list").stdout
    bad = flask("plans", "set", "pro", "user", "many")
    assert bad.returncode == 1 and bad.stderr.strip().startswith("Error: malformed rate 'many'")
