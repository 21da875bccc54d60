"""The package as users get it: the built sdist and wheel, installed alone in a fresh venv.

``python -m build`` makes both from this checkout and ``twine check`` accepts
them. The wheel holds one top-level package with every data file the code
needs. In a new virtualenv holding only that wheel (and its dependencies from
the index), and in another where ``pip install .`` ran in a copy of the checkout
(the README's two ways to install), the README's example app builds its tables
with ``flask quota db upgrade``, lists its plans, serves its dashboard behind the
login, and limits its 3-per-minute route: the dashboard needs no extra.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import venv
import zipfile
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flask_quota.sql.models import metadata
from flask_quota.sql.schema import VERSION_TABLE
from tests.builds import Dists, ok, run, source_copy
from tests.servers import ROOT, free_port, wait_for_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PASSWORD = "wheel-smoke-password"


def fresh_venv(directory: Path, requirement: str, cwd: Path = ROOT) -> Path:
    """A new virtualenv with only ``requirement`` installed (``pip install`` run in
    ``cwd``); returns its bin/ folder."""
    venv.EnvBuilder(with_pip=True).create(directory)
    bin_dir = directory / "bin"
    ok(run(bin_dir / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
           requirement, cwd=cwd))  # fmt: skip
    return bin_dir


def readme_app() -> str:
    """The README's example app: the ```python block that starts with ``# app.py``."""
    blocks = re.findall(r"```python\n(# app\.py\n.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no ```python block starting with '# app.py'"
    return str(blocks[0])


@pytest.fixture(scope="module")
def project(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding only the README's app.py (one per install)."""
    directory = tmp_path_factory.mktemp("project")
    (directory / "app.py").write_text(readme_app())
    return directory


def app_env() -> dict[str, str]:
    from werkzeug.security import generate_password_hash

    return {"SECRET_KEY": "wheel-smoke", "OPS_PASSWORD_HASH": generate_password_hash(PASSWORD)}


def test_twine_accepts_both(dists: Dists) -> None:
    """`twine check --strict` passes on the sdist and the wheel (metadata, README rendering)."""
    ok(run(sys.executable, "-m", "twine", "check", "--strict", dists.sdist, dists.wheel))


def test_wheel_holds_one_package_and_its_data(dists: Dists) -> None:
    """Only flask_quota at the top; templates, static files, Lua and migrations inside it."""
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
        [top_level] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert wheel.read(top_level).decode().split() == ["flask_quota"]
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"flask_quota"}
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)

    def shipped(source: Path, target: str, pattern: str) -> set[str]:
        files = {p.relative_to(source).as_posix() for p in source.glob(pattern) if p.is_file()}
        assert files, f"nothing matches {pattern} in {source}"
        return {f"{target}/{file}" for file in files if "__pycache__" not in file}

    expected = (
        shipped(ROOT / "dashboard", "flask_quota/dashboard", "templates/**/*")
        | shipped(ROOT / "dashboard", "flask_quota/dashboard", "static/**/*")
        | shipped(ROOT / "dashboard", "flask_quota/dashboard", "*.py")
        | shipped(ROOT / "flask_quota" / "storage", "flask_quota/storage", "lua/*.lua")
        | shipped(ROOT / "migrations", "flask_quota/migrations", "**/*")
        | {"flask_quota/py.typed", "flask_quota/dashboard/templates/quota/base.html"}
    )
    assert expected - names == set()


def test_sdist_holds_real_files_not_symlinks(dists: Dists) -> None:
    """The sdist carries the dashboard and migrations as files inside flask_quota/."""
    with tarfile.open(dists.sdist) as sdist:
        members = {m.name.split("/", 1)[1]: m for m in sdist.getmembers() if "/" in m.name}
    assert not [name for name, m in members.items() if m.issym() or m.islnk()]
    for name in (
        "LICENSE",
        "setup.cfg",
        "flask_quota/dashboard/views.py",
        "flask_quota/dashboard/templates/quota/base.html",
        "flask_quota/migrations/env.py",
        "flask_quota/migrations/versions/0001_quota_tables.py",
        "flask_quota/migrations/versions/0002_tenants.py",
        "flask_quota/migrations/versions/0003_concurrency_units.py",
        "flask_quota/storage/lua/decide.lua",
    ):
        assert members[name].isfile(), name


def test_the_bare_wheel_has_no_top_level_dashboard(installed: Path, project: Path) -> None:
    """The dashboard ships inside the package: no top-level `dashboard` module appears."""
    missing = run(installed / "python", "-c", "import dashboard", cwd=project)
    assert missing.returncode == 1 and "No module named 'dashboard'" in missing.stderr


@pytest.fixture(scope="module", params=["wheel", "pip-install-dot"])
def installed(
    request: pytest.FixtureRequest, dists: Dists, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """bin/ of a fresh venv holding the wheel alone, or what ``pip install .`` in a copy of
    this checkout installed (the README's two ways): the dashboard needs no extra."""
    if request.param == "wheel":
        return fresh_venv(tmp_path_factory.mktemp("venv"), str(dists.wheel))
    checkout = source_copy(tmp_path_factory.mktemp("checkout"))
    return fresh_venv(tmp_path_factory.mktemp("venv"), ".", cwd=checkout)


@dataclass
class Server:
    base: str

    def get(self, path: str, auth: tuple[str, str] | None = None) -> int:
        headers = {}
        if auth is not None:
            headers["Authorization"] = "Basic " + b64encode(":".join(auth).encode()).decode()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(urllib.request.Request(self.base + path, headers=headers), timeout=10):
                return 200
        except urllib.error.HTTPError as exc:
            return exc.code


@pytest.fixture(scope="module")
def migrated(installed: Path, project: Path) -> Path:
    """The README's app after `flask quota db upgrade`, run from the installed wheel."""
    out = ok(run(installed / "flask", "--app", "app", "quota", "db", "upgrade", cwd=project,
                 **app_env()))  # fmt: skip
    assert "quota tables created at" in out
    return project


@pytest.fixture(scope="module")
def server(installed: Path, migrated: Path) -> Iterator[Server]:
    """`flask run` of the README's app, in the wheel's venv."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and "QUOTA_" not in k}
    proc = subprocess.Popen(
        [installed / "flask", "--app", "app", "run", "--port", str(port)],
        cwd=migrated,
        env={**clean, **app_env()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout=60)
        yield Server(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_it_runs_from_the_wheel_not_this_checkout(installed: Path, project: Path) -> None:
    """The venv imports flask_quota from its site-packages (neither this checkout nor the
    copy it was installed from), and no top-level dashboard."""
    where = ok(run(installed / "python", "-c", "import flask_quota; print(flask_quota.__file__)",
                   cwd=project))  # fmt: skip
    assert "site-packages" in where and str(ROOT) not in where
    missing = run(installed / "python", "-c", "import dashboard", cwd=project)
    assert missing.returncode == 1 and "No module named 'dashboard'" in missing.stderr


def test_db_upgrade_builds_the_tables(migrated: Path) -> None:
    """`flask quota db upgrade` made every quota table in the app's instance database."""
    with sqlite3.connect(migrated / "instance" / "flask_quota.sqlite3") as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert tables >= set(metadata.tables) | {VERSION_TABLE}


def test_plans_list(installed: Path, migrated: Path) -> None:
    """`flask quota plans list` prints the default plans."""
    out = ok(run(installed / "flask", "--app", "app", "quota", "plans", "list", cwd=migrated,
                 **app_env()))  # fmt: skip
    for plan in ("free", "pro", "enterprise"):
        assert plan in out


def test_dashboard_needs_the_login(server: Server) -> None:
    """The dashboard answers 200 with the configured credentials and 401 without."""
    assert server.get("/quota/") == 401
    assert server.get("/quota/", auth=("ops", "wrong")) == 401
    assert server.get("/quota/", auth=("ops", PASSWORD)) == 200


def test_three_per_minute_route(server: Server) -> None:
    """The README's 3/minute route answers 200, 200, 200, then 429."""
    assert [server.get("/v1/reports") for _ in range(4)] == [200, 200, 200, 429]
