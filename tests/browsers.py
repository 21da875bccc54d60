"""Headless Chromium for the browser tests: where it is, how it starts, and what a
missing one means (a failure in CI, a skip said aloud elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package, which scripts/test.sh installs
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
CI = os.environ.get("CI", "").lower() in ("1", "true")


def require_chromium() -> None:
    """Fail the test in CI (``CI=true``) when Chromium is missing; skip it elsewhere."""
    if CHROMIUM.exists():
        return
    if CI:
        pytest.fail(f"!!! {CHROMIUM} is required in CI (CI=true) but is not installed")
    pytest.skip(f"!!! {CHROMIUM} not found: browser tests SKIPPED (apt-get install chromium)")
