"""The Sphinx docs build with warnings as errors, and their configuration
reference is the one the code reads."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flask_quota import Quota
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
    """`sphinx-build -W --keep-going -b html docs ...` succeeds and writes a page for
    every source in docs/ (each is in the toctree, or -W would have failed)."""
    sources = sorted(p.stem for p in (ROOT / "docs").iterdir() if p.suffix in (".md", ".rst"))
    assert {"index", "configuration", "operations", "usage", "api"} <= set(sources)
    for page in sources:
        assert (site / f"{page}.html").is_file(), f"{page}.html was not written"


def test_configuration_page_lists_every_key_the_code_reads(site: Path) -> None:
    """The configuration table holds exactly settings.reference(): keys, in order, with defaults."""
    page = (site / "configuration.html").read_text(encoding="utf-8")
    tables = re.findall(r"<table.*?</table>", page, re.S)
    table = next((t for t in tables if "QUOTA_ENABLED" in t), None)
    assert table is not None, "configuration.html has no table of the QUOTA_* keys"
    rows = [
        [_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)
    ]
    rows = [row for row in rows if row]  # the header row has <th> cells
    expected = reference()
    assert [row[0] for row in rows] == [key for key, _, _ in expected]
    assert [row[1] for row in rows] == [default for _, default, _ in expected]


def test_api_reference_documents_every_public_method_of_quota(site: Path) -> None:
    """Every public method and property of Quota has an entry on the API page
    (autodoc :members:, so a new one cannot be missed)."""
    page = (site / "api.html").read_text(encoding="utf-8")
    public = [name for name in vars(Quota) if not name.startswith("_")]
    assert {"limit", "charge", "block", "unblock", "blocks", "request_filter"} <= set(public)
    for name in public:
        assert f'id="flask_quota.Quota.{name}"' in page, f"Quota.{name} is not on the API page"


def test_api_reference_documents_the_public_api(site: Path) -> None:
    """The API page carries the docstrings of the names users import."""
    page = _text((site / "api.html").read_text(encoding="utf-8"))
    for name in ("Quota", "init_app", "Identity", "QuotaExceeded", "QuotaUnavailable",
                 "InvalidApiKey", "parse_rate", "PlanCatalog", "QuotaAdmin", "FrozenClock",
                 "assert_limited", "quota_clock", "quota_storage", "BucketState"):  # fmt: skip
        assert name in page, f"{name} is missing from the API reference"
    assert "Configuration keys read" in page  # init_app's generated key list
