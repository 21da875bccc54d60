"""`flask quota networks deny|allow|list|remove` on SQLite, PostgreSQL and MariaDB: each
change is one audited row change, bad input exits 1 with one line and changes nothing,
and a second rule for a network replaces the first."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flask import Flask
from sqlalchemy import func, select

from flask_quota import Quota
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.models import AuditEntry, NetworkRecord, utcnow
from flask_quota.storage import MemoryStorage
from tests.sqldb import sql_store


@pytest.fixture
def app(tmp_path: Path, database_url: str) -> Iterator[Flask]:
    """An app keeping the quota tables in ``database_url`` (once per database)."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(TESTING=True, QUOTA_DATABASE_URL=database_url)
    Quota(app, storage=MemoryStorage())
    yield app
    sql_store(app).close()


def cli(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(args=["quota", "networks", *args])
    return result.exit_code, result.output


def audit(app: Flask) -> list[tuple[str, str, str]]:
    entries = QuotaAdmin(sql_store(app), actor="t").audit_log()
    return [(e.actor, e.action, e.target) for e in reversed(entries)]


def rows(app: Flask) -> int:
    with sql_store(app).session() as session:
        return session.scalar(select(func.count()).select_from(NetworkRecord)) or 0


def test_deny_allow_list_and_remove(app: Flask) -> None:
    """Each command says what it did in one line; `list` shows every rule with its
    action, expiry, reason and author; `remove` deletes one; each change is audited
    under --actor with the rule before and after."""
    code, out = cli(app, "deny", "203.0.113.7/24", "--reason", "scrapers", "--actor", "kim")
    assert (code, out) == (0, "denied 203.0.113.0/24 until removed\n")
    code, out = cli(app, "deny", "2001:DB8::/32", "--for", "600", "--actor", "kim")
    assert code == 0 and re.fullmatch(r"denied 2001:db8::/32 until \d{4}-\d\d-\d\d \S+ UTC\n", out)
    code, out = cli(app, "allow", "10.0.0.0/8", "--reason", "office", "--actor", "lee")
    assert (code, out) == (0, "allowed 10.0.0.0/8 until removed\n")
    code, out = cli(app, "allow", "192.0.2.1", "--for", "2h", "--actor", "lee")
    assert code == 0 and out.startswith("allowed 192.0.2.1/32 until ")

    code, out = cli(app, "list")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["NETWORK", "ACTION", "EXPIRES", "REASON", "BY", "CREATED"]
    listed = [line.split()[:2] for line in lines[1:]]
    assert listed == [  # IPv4 by address, then IPv6
        ["10.0.0.0/8", "allow"], ["192.0.2.1/32", "allow"], ["203.0.113.0/24", "deny"],
        ["2001:db8::/32", "deny"],
    ]  # fmt: skip
    assert re.search(r"203\.0\.113\.0/24 +deny +until removed +scrapers +kim ", out), out
    assert re.search(r"10\.0\.0\.0/8 +allow +until removed +office +lee ", out), out

    code, out = cli(app, "remove", "203.0.113.0/24", "--actor", "kim")
    assert (code, out) == (0, "removed the deny rule of 203.0.113.0/24\n")
    assert "203.0.113.0/24" not in cli(app, "list")[1]
    assert audit(app) == [
        ("kim", "network.deny", "network:203.0.113.0/24"),
        ("kim", "network.deny", "network:2001:db8::/32"),
        ("lee", "network.allow", "network:10.0.0.0/8"),
        ("lee", "network.allow", "network:192.0.2.1/32"),
        ("kim", "network.remove", "network:203.0.113.0/24"),
    ]
    [removal] = QuotaAdmin(sql_store(app), actor="t").audit_log(limit=1)
    assert removal.after is None and removal.before is not None
    assert removal.before["reason"] == "scrapers" and removal.before["action"] == "deny"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["deny", "300.1.2.3/8"], "Octet 300"),
        (["deny", "10.0.0.0/33"], "'33' is not a valid netmask"),
        (["allow", "abc"], "Expected 4 octets"),
        (["deny", "2001:db8::/129"], "is not a valid netmask"),
        (["deny", "-1"], "is not an IPv4 or IPv6 network"),
        (["deny", "10.0.0.0/8", "--for", "soon"], "malformed duration"),
        (["deny", "10.0.0.0/8", "--for", "0"], "must be positive"),
        (["deny", "10.0.0.0/8", "--reason", "x" * 201], "at most 200"),
        (["remove", "10.0.0.0/8"], "no rule for network 10.0.0.0/8"),
        (["remove", "nonsense"], "is not an IPv4 or IPv6 network"),
    ],
)
def test_bad_input_exits_1_with_one_line_and_changes_nothing(
    app: Flask, args: list[str], message: str
) -> None:
    """A malformed network, duration or reason, or removing a rule that is not there:
    exit status 1, one `Error:` line naming the problem, no row and no audit entry."""
    code, out = cli(app, *args, "--actor", "kim")
    assert code == 1, out
    assert out.startswith("Error: ") and out.count("\n") == 1 and message in out, out
    assert "Traceback" not in out
    assert rows(app) == 0 and audit(app) == []


def test_a_second_rule_for_a_network_replaces_the_first(app: Flask) -> None:
    """One rule per network: deny again updates it (reason, expiry, author), allow turns
    it into an allowance; still one row, each change audited with before and after."""
    assert cli(app, "deny", "198.51.100.0/24", "--for", "10m", "--actor", "kim")[0] == 0
    code, out = cli(app, "deny", "198.51.100.9/24", "--reason", "again", "--actor", "lee")
    assert (code, out) == (0, "denied 198.51.100.0/24 until removed\n")
    [info] = QuotaAdmin(sql_store(app), actor="t").networks()
    assert (info.action, info.reason, info.created_by, info.expires_at) == (
        "deny", "again", "lee", None,
    )  # fmt: skip
    assert cli(app, "allow", "198.51.100.0/24", "--actor", "kim")[0] == 0
    assert rows(app) == 1
    [info] = QuotaAdmin(sql_store(app), actor="t").networks()
    assert (info.action, info.reason) == ("allow", "")
    entries = QuotaAdmin(sql_store(app), actor="t").audit_log(limit=3)
    second, first = entries[1], entries[2]
    assert first.before is None and first.after is not None
    assert first.after["expires_at"] is not None
    assert second.before == first.after  # what the second change replaced
    assert second.after is not None and second.after["reason"] == "again"
    assert entries[0].action == "network.allow" and entries[0].before == second.after


def test_expired_rules_are_not_listed_and_go_with_the_next_change(app: Flask) -> None:
    """A rule past its expiry is left out of `list` and deleted by the next network
    change (without an audit entry of its own: it ended by itself)."""
    admin = QuotaAdmin(sql_store(app), actor="kim")
    admin.deny_network("192.0.2.0/24", expires_in=timedelta(hours=1))
    with sql_store(app).change() as session:  # an hour later, as far as the row goes
        row = session.scalar(select(NetworkRecord))
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=5)
    assert cli(app, "list")[1].count("192.0.2.0/24") == 0
    assert rows(app) == 1
    assert cli(app, "allow", "10.0.0.0/8", "--actor", "kim")[0] == 0
    assert [n.cidr for n in admin.networks()] == ["10.0.0.0/8"]
    assert rows(app) == 1  # the expired row went
    with sql_store(app).session() as session:
        actions = session.scalars(select(AuditEntry.action).order_by(AuditEntry.id)).all()
    assert actions == ["network.deny", "network.allow"]
