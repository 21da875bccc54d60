"""The fast part of the test suite on every supported Python, each in a venv of its own.

    nox                      # 3.11, 3.12 and 3.13
    nox -p 3.13              # one of them
    nox -- -k migrations     # arguments after -- go to pytest

"Fast" is the marker expression ``FAST``: everything but the tests that start
gunicorn, kill servers or build the package (``slow``) and the Chromium tests
(``browser``); scripts/test.sh runs those once, on the main interpreter. The
interpreters are looked up on PATH as ``python3.X``; pyenv's installed versions
are added to it, so a machine with pyenv needs no shims.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

PYTHONS = ["3.11", "3.12", "3.13"]
FAST = "not slow and not browser"

nox.options.sessions = ["tests"]
nox.options.error_on_missing_interpreters = True  # a missing Python fails, never skips

_PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
_found = [str(p.parent) for v in PYTHONS for p in sorted(_PYENV.glob(f"{v}.*/bin/python{v}"))]
os.environ["PATH"] = os.pathsep.join([*_found, os.environ.get("PATH", "")])


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """pytest -m FAST, with the package and its test extra installed."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", FAST, "-p", "no:cacheprovider", *session.posargs)
