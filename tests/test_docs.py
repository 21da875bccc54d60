"""The Sphinx docs build with warnings as errors, and their configuration
reference is the one the code reads."""

from __future__ import annotations

import fcntl
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


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A fresh build of docs/ (a reused output folder would hide warnings of unchanged
    pages), made once per run: the first xdist worker to ask builds it under a lock in
    the run's shared temporary folder and the others read it, where each used to build
    its own (about 18 s of both cores each)."""
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # this run's, never an older one's
    out, building = shared / "docs-html", shared / "docs-html.building"
    failed = shared / "docs-html.failed"
    with open(shared / "docs-html.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir() and not failed.exists():
            build = subprocess.run(
                [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "docs",
                 str(building)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=540,
            )  # fmt: skip
            if build.returncode == 0:
                building.rename(out)  # only a whole build is ever read
            else:
                failed.write_text(f"{build.stdout[-3000:]}\n{build.stderr}", encoding="utf-8")
        if failed.exists():
            pytest.fail(f"sphinx-build failed:\n{failed.read_text(encoding='utf-8')}")
    return out


def test_docs_build_without_warnings(site: Path) -> None:
    """`sphinx-build -W --keep-going -b html docs ...` succeeds and writes a page for
    every source in docs/ (each is in the toctree, or -W would have failed)."""
    sources = sorted(p.stem for p in (ROOT / "docs").iterdir() if p.suffix in (".md", ".rst"))
    assert {"index", "quickstart", "usage", "plans", "metering", "responses", "tenants",
            "billing", "webhooks", "overload", "blocks", "networks", "operations",
            "databases", "dashboard", "monitoring", "performance", "flask-limiter",
            "testing", "configuration", "cli", "api"} <= set(sources)  # fmt: skip
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


def test_every_internal_link_of_the_site_resolves(site: Path) -> None:
    """Every relative link of the built pages points at a page (and an anchor on it) that
    the build wrote: a link that MyST could not resolve stays a dead `.md` href."""
    broken, checked = [], 0
    for page in site.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        for href in re.findall(r'href="([^"#:]*)(?:#([^"]*))?"', text):
            path, anchor = href
            if not path or path.startswith(("_static", "_sources", "genindex", "search")):
                continue
            checked += 1
            target = (page.parent / path).resolve()
            if not target.is_file():
                broken.append(f"{page.name}: {path} (no such page)")
            elif anchor and f'id="{anchor}"' not in target.read_text(encoding="utf-8"):
                broken.append(f"{page.name}: {path}#{anchor} (no such anchor)")
    assert checked >= 100, checked
    assert broken == []
