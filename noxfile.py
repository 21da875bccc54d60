"""The fast tests in fresh venvs: other Pythons, and both ends of every dependency
range we declare. Each session runs what can differ there, not the whole suite again
(the main run of scripts/test.sh has run every test once, on the python3 it found):

    nox                      # tests-3.11, tests-3.12, tests-3.13, lowest, latest
    nox -s lowest            # every runtime dependency at the lowest version setup.cfg allows
    nox -s latest            # the newest release of every dependency (redis-py 8.x today)
    nox -p 3.13              # one Python
    nox -- -k migrations     # arguments after -- go to pytest

- ``tests-3.X`` (``PER_PYTHON``): what the interpreter changes. Our code, the stdlib
  we call (threads, sockets, asyncio, sqlite3) and redis-py's and SQLAlchemy's Python
  code run on it: so every fast test on Redis and SQLite. Not the Valkey, PostgreSQL
  and MariaDB variants: those servers answer the same whatever Python sends, and the
  client code between is the same code the Redis and SQLite variants run.
- ``latest``: the newest release of everything on the newest Python (3.13). The main
  run already has the newest releases (a fresh venv), so what differs here is the
  Python: it runs ``PER_PYTHON``.
- ``lowest`` (``PER_DEPENDENCY``): what the dependency versions change, on Python
  3.12, so that scripts/test.sh covers every supported Python without a
  ``tests-3.12`` run of its own: 3.11 in the main run, 3.12 here, 3.13 in ``latest``.
  Old releases on a newer Python is the harder pairing (removals and deprecations
  hit old code), and old releases on 3.11 are their own authors' tested ground.
  Flask, Werkzeug, click, redis-py, SQLAlchemy and Alembic are under nearly every test,
  and the SQL dialects are SQLAlchemy's own code, so every fast test but the Valkey
  variants (the same redis-py calls as their Redis twins, to a server the main run
  covers), and the ``user_flow`` tests on SQLite only (Alembic's autogenerate is the
  dependency under test; the other databases' dialects run in the SQL tests).

"Fast" is the marker expression ``FAST``: everything but the tests that start
gunicorn, kill servers or build the package (``slow``), the Chromium tests
(``browser``), the ``once`` tests (bounds on our own code's memory under a
flood, the same everywhere; tracemalloc makes them the slowest of the rest) and
the ``quiet`` ones (wall-clock bounds, which need the machine to themselves: a
session runs its tests four at a time, and a quiet test among them failed on a
Redis command stretched by the others' load); scripts/test.sh runs those once,
on the main interpreter, the quiet ones alone. The interpreters are
looked up on PATH as ``python3.X``; pyenv's installed versions are added to it, so
a machine with pyenv needs no shims. Outside CI a missing interpreter skips its
sessions (nox says so); with CI=true it fails them.

The venvs are made and filled by uv when it is installed (the test extra brings it):
seconds where pip takes a minute or more a session, and far less CPU taken from the
tests running beside them.
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shutil
from pathlib import Path

import nox

PYTHONS = ["3.11", "3.12", "3.13"]
FAST = "not slow and not browser and not once and not quiet"
PER_PYTHON = f"{FAST} and not user_flow and not valkey and not postgresql and not mysql"
PER_DEPENDENCY = f"{FAST} and not valkey and not (user_flow and (postgresql or mysql))"
ROOT = Path(__file__).parent

nox.options.sessions = ["tests", "lowest", "latest"]
nox.options.error_on_missing_interpreters = os.environ.get("CI", "").lower() in ("1", "true")
if shutil.which("uv") or importlib.util.find_spec("uv") is not None:
    nox.options.default_venv_backend = "uv"

_PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
_found = [str(p.parent) for v in PYTHONS for p in sorted(_PYENV.glob(f"{v}.*/bin/python{v}"))]
os.environ["PATH"] = os.pathsep.join([*_found, os.environ.get("PATH", "")])


def lowest_pins() -> list[str]:
    """``name==X`` for each ``name>=X`` of setup.cfg's install_requires (its one source)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    pins = []
    for line in config["options"]["install_requires"].splitlines():
        found = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)\s*", line)
        if found:
            pins.append(f"{found[1]}=={found[2]}")
        elif line.strip():
            raise ValueError(f"setup.cfg: {line.strip()!r} has no lower bound to pin")
    return pins


def pytest(session: nox.Session, markers: str) -> None:
    session.run(
        "python", "-m", "pytest", "-m", markers, "-p", "no:cacheprovider", "-n", "4",
        "--dist", "loadgroup", *session.posargs,
    )  # fmt: skip


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """pytest -m PER_PYTHON, with the package and its test extra installed."""
    session.install("-e", ".[test]")
    pytest(session, PER_PYTHON)


@nox.session(python=PYTHONS[1])
def lowest(session: nox.Session) -> None:
    """pytest -m PER_DEPENDENCY with every runtime dependency at its lowest declared
    version, on Python 3.12: what a team pinned to old releases gets."""
    pins = lowest_pins()
    session.install("-e", ".[test]", *pins)
    shown = (  # the versions installed, for the log
        "import sys, importlib.metadata as m; "
        "print(*(n + '==' + m.version(n) for n in sys.argv[1:]))"
    )
    session.run("python", "-c", shown, *(pin.split("==")[0] for pin in pins), silent=False)
    pytest(session, PER_DEPENDENCY)


@nox.session(python=PYTHONS[-1])
def latest(session: nox.Session) -> None:
    """pytest -m PER_PYTHON with the newest release of everything, on the newest Python
    (the main run has the newest releases already: the Python is what differs)."""
    session.install("--upgrade", "-e", ".[test]")
    pytest(session, PER_PYTHON)
