"""Plans, clients and overrides in SQL, served to requests from an in-process snapshot."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import create_engine, event, inspect, select

from flask_quota import Quota
from flask_quota.core.plans import Plan
from flask_quota.core.rates import parse_rates
from flask_quota.core.tiers import Tier
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.apikeys import PREFIX_LENGTH
from flask_quota.sql.errors import TablesMissing
from flask_quota.sql.models import Client, PlanLimit, metadata
from flask_quota.sql.snapshot import OverrideRule, SqlCatalog
from flask_quota.sql.store import DEFAULT_DATABASE_FILE
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.sqldb import sql_store

PLANS = {
    "free": {"global": "1000/second", "user": "5/hour", "resources": {"search": "3/hour"}},
    "pro": {"global": "1000/second", "user": "50/hour", "resources": {"search": "30/hour"}},
}


@pytest.fixture
def apps(tmp_path: Path, close_sql: Callable[[Flask], Flask]) -> Callable[..., Flask]:
    """Build apps on one database; their SQL stores are closed afterwards."""

    def build(url: str | None = None, *, name: str = "app", **config: Any) -> Flask:
        app = Flask(__name__, instance_path=str(tmp_path / name))
        app.config.update({"TESTING": True, "QUOTA_PLANS": PLANS, **config})
        if url is not None:
            app.config["QUOTA_DATABASE_URL"] = url
        quota = Quota(app, storage=MemoryStorage(FrozenClock()))

        @app.get("/items")
        def items() -> str:
            return "items"

        @app.get("/search")
        @quota.limit(resource="search")
        def search() -> str:
            return "results"

        return close_sql(app)

    return build


def admin(app: Flask) -> QuotaAdmin:
    return QuotaAdmin(sql_store(app), actor="test")


def user_quota(http: FlaskClient, **headers: str) -> int:
    """The user tier's q= in RateLimit-Policy of one request to /items."""
    policy = http.get("/items", headers=headers).headers["RateLimit-Policy"]
    return int(policy.split('"user";q=')[1].split(";")[0])


def test_first_use_creates_the_tables_and_seeds_the_configured_plans(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """Without db=, the store's first load creates the quota tables and inserts QUOTA_PLANS."""
    app = apps(database_url)
    assert sql_store(app).wait_loaded(10)
    engine = create_engine(database_url)
    assert user_quota(app.test_client()) == 5
    assert {t for t in inspect(engine).get_table_names() if t.startswith("quota_")} >= set(
        metadata.tables
    )
    assert [p.name for p in admin(app).plans()] == ["free", "pro"]
    engine.dispose()


def test_seed_plans_are_inserted_only_into_an_empty_plan_table(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """A second app with other QUOTA_PLANS on the same database keeps the stored plans."""
    first = apps(database_url, name="one")
    admin(first).set_plan_limit("free", "user", "7/hour")
    second = apps(database_url, name="two", QUOTA_PLANS={"free": {"user": "1/hour"}})
    assert sql_store(second).wait_loaded(10)
    assert user_quota(second.test_client()) == 7


def test_default_database_is_a_sqlite_file_in_the_instance_folder(
    apps: Callable[..., Flask], tmp_path: Path
) -> None:
    """No QUOTA_DATABASE_URL and no db=: once something needs SQL (here an operator's
    change), the tables live in instance/flask_quota.sqlite3."""
    app = apps(None, name="inst")
    assert app.test_client().get("/items").status_code == 200
    assert not (tmp_path / "inst" / DEFAULT_DATABASE_FILE).exists()  # requests need no SQL
    admin(app).set_plan_limit("free", "user", "6/hour")
    assert (tmp_path / "inst" / DEFAULT_DATABASE_FILE).is_file()


def test_an_api_key_selects_its_client_and_plan(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """A client's key gives its plan's rates and a bucket keyed by the client id."""
    app = apps(database_url)
    info, key = admin(app).create_client("acme", "pro")
    http = app.test_client()
    assert user_quota(http, **{"X-API-Key": key}) == 50
    assert user_quota(http) == 5  # anonymous: the free plan
    identity = sql_store(app).identify(key)
    assert identity is not None and (identity.id, identity.plan) == (str(info.id), "pro")


def test_keys_are_stored_only_as_salted_hashes(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """The database holds a display prefix and a salted hash, never the key."""
    app = apps(database_url)
    _, key = admin(app).create_client("acme", "free")
    _, other = admin(app).create_client("other", "free")
    with sql_store(app).session() as session:
        rows = session.scalars(select(Client).order_by(Client.id)).all()
        stored = [(r.key_prefix, r.key_salt, r.key_hash) for r in rows]
    assert [prefix for prefix, _, _ in stored] == [key[:PREFIX_LENGTH], other[:PREFIX_LENGTH]]
    for (_, salt, digest), secret in zip(stored, [key, other], strict=True):
        assert secret[PREFIX_LENGTH:] not in salt + digest and len(digest) == 64
    assert stored[0][1] != stored[1][1]  # one salt per key


def test_overrides_win_until_they_expire(apps: Callable[..., Flask], database_url: str) -> None:
    """An unexpired override replaces the plan's rate for that client only, then lapses."""
    app = apps(database_url)
    acme, key = admin(app).create_client("acme", "free")
    _, other = admin(app).create_client("other", "free")
    admin(app).add_override(acme.id, "user", "40/hour", expires_in=timedelta(seconds=3))
    admin(app).add_override(acme.id, "endpoint", "9/hour", resource="search")
    http = app.test_client()
    assert user_quota(http, **{"X-API-Key": key}) == 40
    assert user_quota(http, **{"X-API-Key": other}) == 5
    policy = http.get("/search", headers={"X-API-Key": key}).headers["RateLimit-Policy"]
    assert '"search";q=9;' in policy
    deadline = time.monotonic() + 10
    while user_quota(http, **{"X-API-Key": key}) == 40:
        assert time.monotonic() < deadline, "the override did not expire"
        time.sleep(0.1)
    assert user_quota(http, **{"X-API-Key": key}) == 5


def test_override_expiry_is_checked_at_request_time() -> None:
    """SqlCatalog.resolve drops an override the moment its expiry passes, without a reload."""
    clock = FrozenClock()
    plan = Plan("free", None, parse_rates("5/hour"), {})
    rule = OverrideRule(Tier.USER, "", parse_rates("40/hour"), expires_at=clock.seconds + 60)
    catalog = SqlCatalog([plan], overrides={"7": (rule,)}, clock=lambda: clock.seconds)
    assert catalog.resolve("free", "7", fallback="free").user_rate == parse_rates("40/hour")
    assert catalog.resolve("free", "8", fallback="free").user_rate == parse_rates("5/hour")
    clock.advance(60)
    assert catalog.resolve("free", "7", fallback="free").user_rate == parse_rates("5/hour")


def test_random_revoked_and_malformed_keys_share_one_anonymous_budget(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """1,000 invented keys, a revoked key and malformed keys all draw on the IP's budget."""
    app = apps(database_url)
    client, key = admin(app).create_client("gone", "pro")
    admin(app).revoke_client(client.id)
    http = app.test_client()
    keys = [f"fq_{secrets.token_urlsafe(32)}" for _ in range(500)]
    keys += [secrets.token_urlsafe(24) for _ in range(497)]
    keys += [key, "short", key[:PREFIX_LENGTH] + "x" * 40]
    statuses = [http.get("/items", headers={"X-API-Key": k}).status_code for k in keys]
    assert statuses.count(200) == 5  # the free plan's user tier, keyed by 127.0.0.1
    assert http.get("/items").status_code == 429


def test_unknown_keys_get_401_when_configured(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """With QUOTA_REJECT_UNKNOWN_KEYS a revoked key is refused with a 401 problem."""
    app = apps(database_url, QUOTA_REJECT_UNKNOWN_KEYS=True)
    client, key = admin(app).create_client("gone", "free")
    http = app.test_client()
    assert http.get("/items", headers={"X-API-Key": key}).status_code == 200
    admin(app).revoke_client(client.id)
    response = http.get("/items", headers={"X-API-Key": key})
    assert response.status_code == 401
    assert response.content_type == "application/problem+json"


def test_requests_run_no_sql_in_steady_state(apps: Callable[..., Flask], database_url: str) -> None:
    """After the first request, requests (keyed, overridden, anonymous) issue zero queries."""
    app = apps(database_url, QUOTA_SYNC_INTERVAL=0.1)
    acme, key = admin(app).create_client("acme", "pro")
    admin(app).add_override(acme.id, "user", "45/hour")
    http = app.test_client()
    http.get("/items")  # first use: loads the snapshot
    mine, others = 0, 0
    me = threading.get_ident()

    def count(*_: Any) -> None:
        nonlocal mine, others
        if threading.get_ident() == me:
            mine += 1
        else:
            others += 1

    engine = sql_store(app).engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        for i in range(300):
            headers = {"X-API-Key": key} if i % 3 == 0 else {}
            http.get("/search" if i % 2 else "/items", headers=headers)
        deadline = time.monotonic() + 10
        while others == 0:  # the listener does see the poller's version checks
            assert time.monotonic() < deadline, "the poller issued no query"
            time.sleep(0.05)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert mine == 0


def test_a_change_reaches_another_process_within_two_seconds(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """A second store on the same database (another process) sees a change within 2 s."""
    serving = apps(database_url, name="serving")
    http = serving.test_client()
    assert user_quota(http) == 5
    operator = apps(database_url, name="operator")
    admin(operator).set_plan_limit("free", "user", "17/hour")
    changed = time.monotonic()
    while user_quota(http) != 17:
        assert time.monotonic() - changed < 2.0, "the change took longer than 2 s"
        time.sleep(0.02)


def test_an_unreachable_database_serves_the_configured_plans(apps: Callable[..., Flask]) -> None:
    """A database that is down at start costs no 500: the configured plans apply."""
    app = apps("postgresql+psycopg2://nobody@127.0.0.1:1/none?connect_timeout=2")
    http = app.test_client()
    assert user_quota(http) == 5
    assert http.get("/items", headers={"X-API-Key": "fq_" + "x" * 40}).status_code == 200


def test_host_flask_sqlalchemy_keeps_the_tables(tmp_path: Path, database_url: str) -> None:
    """Quota(app, db=db): the tables join db.metadata, db.create_all() makes them."""
    app = Flask(__name__, instance_path=str(tmp_path / "host"))
    app.config.update(SQLALCHEMY_DATABASE_URI=database_url, QUOTA_PLANS=PLANS)
    db = SQLAlchemy(app)
    Quota(app, db=db, storage=MemoryStorage(FrozenClock()))
    app.add_url_rule("/items", "items", lambda: "items")
    assert set(metadata.tables) <= set(db.metadata.tables)
    try:
        with app.app_context():
            with pytest.raises(TablesMissing, match="flask db migrate"):
                sql_store(app).ensure_ready()
            db.create_all()
            _, key = admin(app).create_client("acme", "pro")
        assert user_quota(app.test_client(), **{"X-API-Key": key}) == 50
    finally:
        sql_store(app).close()
        with app.app_context():
            db.drop_all()
            db.engine.dispose()


def test_db_and_database_url_together_are_refused(tmp_path: Path) -> None:
    """Naming two homes for the tables fails at init_app, saying which to drop."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config.update(
        SQLALCHEMY_DATABASE_URI="sqlite://", QUOTA_DATABASE_URL=f"sqlite:///{tmp_path}/q.db"
    )
    with pytest.raises(ValueError, match="remove QUOTA_DATABASE_URL or the db= argument"):
        Quota(app, db=SQLAlchemy(app))


@pytest.mark.parametrize(
    ("value", "message"),
    [("mysql+nodriver://x/y", "QUOTA_DATABASE_URL"), ("not a url", "QUOTA_DATABASE_URL")],
)
def test_bad_database_url_fails_at_init(tmp_path: Path, value: str, message: str) -> None:
    """An unusable QUOTA_DATABASE_URL raises ValueError at init_app, naming the key."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_DATABASE_URL"] = value
    with pytest.raises(ValueError, match=message):
        Quota(app)


def test_malformed_rates_are_refused_on_write() -> None:
    """The models validate rates with parse_rate before anything reaches the database."""
    with pytest.raises(ValueError, match="malformed rate"):
        PlanLimit(tier="user", resource="", rate="lots/minute")
    with pytest.raises(ValueError, match="resource"):
        PlanLimit(tier="endpoint", resource="", rate="5/minute")
    assert PlanLimit(tier="user", resource="", rate="10 per minute").rate == "10/minute"


def test_a_setup_cut_short_is_completed_by_the_next_process(
    apps: Callable[..., Flask], database_url: str
) -> None:
    """SQLite runs DDL outside the transaction: a worker whose table creation failed part
    way (a racer's write lock) leaves some tables and no revision stamp. The next attempt
    creates the rest instead of taking the first table for a finished setup (CI saw
    "no such table: quota_overrides" from the CLI)."""
    engine = create_engine(database_url)
    first = sorted(metadata.sorted_tables, key=lambda t: t.name != "quota_meta")[:2]
    metadata.create_all(engine, tables=first)
    app = apps(database_url)
    assert sql_store(app).wait_loaded(10)
    assert {t for t in inspect(engine).get_table_names() if t.startswith("quota_")} >= set(
        metadata.tables
    )
    assert [p.name for p in admin(app).plans()] == ["free", "pro"]
    engine.dispose()
