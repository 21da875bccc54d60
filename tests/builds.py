"""Commands run as a user runs them, outside this checkout's import path, and the package
built from this checkout (conftest's ``dists``): for the packaging tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.servers import ROOT

__all__ = ["Dists", "ok", "run", "source_copy"]


def run(*args: str | Path, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """A command outside this checkout's import path: no PYTHONPATH, no QUOTA_/FLASK_ vars."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONPATH" and not k.startswith(("QUOTA_", "FLASK_"))
    }
    return subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@dataclass
class Dists:
    sdist: Path
    wheel: Path


def source_copy(directory: Path) -> Path:
    """This checkout's files (git's, uncommitted ones included; nothing it ignores), symlinks
    kept, in ``directory``: a build writes its egg-info into the tree it builds, and the nox
    sessions scripts/test.sh installs meanwhile write the checkout's."""
    listed = ok(run("git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                    "--exclude-standard"))  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source, target = ROOT / name, directory / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted, not yet committed
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return directory
