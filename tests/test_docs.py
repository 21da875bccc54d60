"""The Sphinx docs build with warnings as errors, and their configuration
reference is the one the code reads."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flask_quota.settings import reference

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _text(fragment: str) -> str:
    """The visible text of an HTML fragment."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh build of docs/: a reused output folder would hide warnings of unchanged pages."""
    out = tmp_path_factory.mktemp("html")
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert build.returncode == 0, f"sphinx-build failed:\n{build.stdout[-3000:]}\n{build.stderr}"
    return out


def test_docs_build_without_warnings(site: Path) -> None:
    """`sphinx-build -W --keep-going -b html docs ...` succeeds and writes every page."""
    for page in ("index", "quickstart", "usage", "configuration", "operations", "testing",
                 "flask-limiter", "api", "development"):  # fmt: skip
        assert (site / f"{page}.html").is_file(), f"{page}.html was not written"


def test_configuration_page_lists_every_key_the_code_reads(site: Path) -> None:
    """The configuration table holds exactly settings.reference(): keys, in order, with defaults."""
    page = (site / "configuration.html").read_text(encoding="utf-8")
    table = re.search(r"<table[^>]*quota-config.*?</table>", page, re.S)
    assert table is not None, "configuration.html has no quota-config table"
    rows = [
        [_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(0), re.S)
    ]
    rows = [row for row in rows if row]  # the header row has <th> cells
    expected = reference()
    assert [row[0] for row in rows] == [key for key, _, _ in expected]
    assert [row[1] for row in rows] == [default for _, default, _ in expected]


def test_api_reference_documents_the_public_api(site: Path) -> None:
    """The API page carries the docstrings of the names users import."""
    page = _text((site / "api.html").read_text(encoding="utf-8"))
    for name in ("Quota", "init_app", "Identity", "QuotaExceeded", "QuotaUnavailable",
                 "InvalidApiKey", "parse_rate", "PlanCatalog", "QuotaAdmin", "FrozenClock",
                 "assert_limited", "quota_clock", "quota_storage", "BucketState"):  # fmt: skip
        assert name in page, f"{name} is missing from the API reference"
    assert "Configuration keys read" in page  # init_app's generated key list
