"""The Markdown docs say what the code does, read as plain Markdown (as GitHub shows
them), without building the Sphinx site: the configuration keys, the `flask quota`
commands, `quota.limit`'s parameters, the built-in plans, the extras, the README's
shape and figures, and every intra-repository link's anchor."""

from __future__ import annotations

import configparser
import importlib.util
import inspect
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from flask_quota import Quota
from flask_quota.cli import quota_cli
from flask_quota.core.plans import DEFAULT_PLANS
from flask_quota.settings import reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (their lines keep their place, blank)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def table_after(text: str, header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


@cache
def quota_docs() -> ModuleType:
    """docs/_ext/quota_docs.py, the generator of the configuration table."""
    spec = importlib.util.spec_from_file_location("quota_docs", DOCS / "_ext" / "quota_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- configuration ----------------------------------------------------------------


def test_configuration_md_holds_the_table_the_code_gives_now() -> None:
    """docs/configuration.md's key table is what `python docs/_ext/quota_docs.py` writes
    from settings.reference() now: a key added, removed or re-documented in the code
    fails here until the table is regenerated."""
    docs = quota_docs()
    assert docs.BEGIN in read(docs.CONFIGURATION), "the table's markers are gone"
    assert not docs.stale(), f"docs/configuration.md is stale: run `{docs.REGENERATE}`"


def test_configuration_md_names_every_quota_key_the_library_reads() -> None:
    """Read as plain Markdown, the table lists exactly reference()'s keys, in order, with
    their defaults, and every QUOTA_* name anywhere in the library's code (flask_quota/
    and dashboard/) is one of its rows: a key read with config.get(...) outside
    settings.py cannot go undocumented."""
    rows = table_after(read(DOCS / "configuration.md"), "| key | default | meaning |")
    assert [row[0] for row in rows] == [f"`{key}`" for key, _, _ in reference()]
    assert [row[1] for row in rows] == [f"`{default}`" for _, default, _ in reference()]
    documented = {row[0].strip("`") for row in rows}
    sources = {p.resolve() for d in ("flask_quota", "dashboard") for p in (ROOT / d).rglob("*.py")}
    read_by_code = {key for p in sources for key in re.findall(r"QUOTA_[A-Z0-9_]+", read(p))}
    assert {"QUOTA_STORAGE_URL", "QUOTA_DASHBOARD_USERS"} <= read_by_code  # the scan sees both
    assert read_by_code - documented == set(), "keys the code names but the table lacks"


# -- the command line -------------------------------------------------------------


def commands(group: click.Group, prefix: str) -> Iterator[tuple[str, click.Command]]:
    """(full name, command) of every leaf command under ``group``."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def test_operations_md_names_every_flask_quota_command_with_its_options() -> None:
    """Walking the click group: each command's full name (`flask quota clients revoke`)
    is in docs/operations.md, and each of its options (`--reason`, `--shadow`/`--enforce`)
    on a line that names it; `--actor`, common to every change, is explained once."""
    text = read(DOCS / "operations.md")
    lines = text.splitlines()
    found = list(commands(quota_cli, "flask quota"))
    assert len(found) >= 20, [name for name, _ in found]
    for name, command in found:
        own = [line for line in lines if re.search(rf"(^|[\s`]){re.escape(name)}([\s`]|$)", line)]
        assert own, f"`{name}` is not documented in docs/operations.md"
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden or "--actor" in param.opts:
                continue
            for option in (*param.opts, *param.secondary_opts):
                if option.startswith("--"):
                    assert any(option in line for line in own), (
                        f"`{name} {option}` is not on a line of docs/operations.md naming {name}"
                    )
    assert "--actor" in text


# -- quota.limit ------------------------------------------------------------------


def limit_signature() -> tuple[str, list[str]]:
    """``@quota.limit(rate=None, *, ...)`` as inspect.signature gives it, and its names."""
    parts, names, star = [], [], False
    for param in list(inspect.signature(Quota.limit).parameters.values())[1:]:
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        default = "" if param.default is inspect.Parameter.empty else f"={param.default!r}"
        parts.append(param.name + default)
        names.append(param.name)
    return f"@quota.limit({', '.join(parts)})", names


def test_usage_md_gives_quota_limits_real_signature_and_explains_each_parameter() -> None:
    """docs/usage.md shows inspect.signature(Quota.limit) verbatim (names, order and
    defaults), and names every parameter in prose besides: a parameter added, renamed
    or given another default fails here."""
    signature, names = limit_signature()
    assert {"key", "per_method", "charge_when", "exempt_when"} <= set(names)
    usage = read(DOCS / "usage.md")
    assert signature in usage, f"docs/usage.md lacks {signature}"
    explained = usage.replace(signature, "")
    for name in names:
        assert f"`{name}`" in explained, f"docs/usage.md never explains `{name}`"


# -- plans and extras -------------------------------------------------------------


def rate_of(entry: Any) -> str:
    """A plan limit's rate text, whether given as text or as a dict with a unit."""
    return str(entry["rate"]) if isinstance(entry, dict) else str(entry)


def test_usage_md_plans_table_is_the_built_in_plans() -> None:
    """The built-in plans table in docs/usage.md has a row per plan of DEFAULT_PLANS and
    a column per resource (ai_tokens included), each with the code's rate."""
    usage = read(DOCS / "usage.md")
    header = next(line for line in usage.splitlines() if line.startswith("| plan | global"))
    resources = [cell.strip().strip("`") for cell in header.strip("|").split("|")[3:]]
    in_code = {r for plan in DEFAULT_PLANS.values() for r in plan.get("resources", {})}
    assert "ai_tokens" in in_code and set(resources) == in_code
    rows = table_after(usage, "| plan | global")
    expected = [
        [name, plan["global"], plan["user"], *(rate_of(plan["resources"][r]) for r in resources)]
        for name, plan in DEFAULT_PLANS.items()
    ]
    assert rows == expected


def test_readme_and_quickstart_extras_tables_list_every_extra() -> None:
    """The extras tables of README.md and docs/quickstart.md have a row for each extra
    of setup.cfg (metrics and mysql included) and for no other."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    extras = set(config["options.extras_require"])
    assert {"metrics", "mysql"} <= extras
    for path in (ROOT / "README.md", DOCS / "quickstart.md"):
        rows = {row[0].strip("`") for row in table_after(read(path), "| extra | adds |")}
        assert rows - {"(none)"} == extras, f"{path.name}'s extras table is not setup.cfg's"
        installs = set(re.findall(r"pip install ['\"]flask-quota\[(\w+)\]['\"]", read(path)))
        assert installs <= extras, f"{path.name} installs extras setup.cfg lacks"


# -- the README -------------------------------------------------------------------


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_readme_has_no_repeated_section_and_the_example_once() -> None:
    """README.md is a front page: no `##` heading twice, the example's app.py block
    and its shell block once each, and the Quickstart's two commands."""
    readme = read(ROOT / "README.md")
    headings = re.findall(r"^## (.+)$", prose(readme), re.M)
    assert {"Install", "Example", "Quickstart", "Benchmarks"} <= set(headings)
    repeated = [h for h, n in Counter(headings).items() if n > 1]
    assert repeated == [], f"README.md repeats the sections {repeated}"
    blocks = [m.group(0) for m in FENCE.finditer(readme)]
    assert sum(b.startswith("```python\n# app.py\n") for b in blocks) == 1
    assert sum("flask --app app run" in b for b in blocks) == 1
    quickstart = [m.group(0) for m in FENCE.finditer(section(readme, "Quickstart"))]
    commands = [line.split("#")[0].strip() for line in quickstart[0].splitlines()[1:-1]]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_readme_benchmark_figures_are_those_of_bench_results() -> None:
    """Every figure in the README's benchmark table and its notes is one that
    bench/results.md reports: none is invented or rounded."""
    results = read(ROOT / "bench" / "results.md")
    bench = section(read(ROOT / "README.md"), "Benchmarks")
    figures = re.findall(r"\b\d[\d,]*\.\d+\b|\b\d{3,}\b", bench)
    assert len(figures) >= 10, figures
    for figure in set(figures):
        assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", results), (
            f"the README's {figure} is not in bench/results.md"
        )
    assert "[bench/README.md](bench/README.md)" in bench


# -- links ------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation but ``-`` and ``_``
    dropped, spaces to ``-`` (link syntax in the heading counts by its text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, GitHub's ``-1``, ``-2`` for repeats."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose(read(path)), re.M):
        anchor = github_anchor(heading)
        found.add(anchor if seen[anchor] == 0 else f"{anchor}-{seen[anchor]}")
        seen[anchor] += 1
    return found


def markdown_files() -> list[Path]:
    """The repository's Markdown files (tracked, or new in docs/)."""
    listed = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    files = {ROOT / name for name in listed} | set(DOCS.glob("*.md"))
    return sorted(p for p in files if p.is_file())


def test_github_anchor_matches_githubs_rules() -> None:
    """The anchor rule used below: GitHub keeps underscores and drops other punctuation."""
    heading = "Who owns the plans: `QUOTA_PLANS_SOURCE`"
    assert github_anchor(heading) == "who-owns-the-plans-quota_plans_source"
    assert github_anchor("When SQL is started, and when the database is down") == (
        "when-sql-is-started-and-when-the-database-is-down"
    )


def test_every_intra_repo_markdown_link_and_anchor_resolves_on_github() -> None:
    """Each relative link in the repository's Markdown points at a file that exists,
    and each `#anchor` into a Markdown file is one GitHub writes for a heading there
    (so `operations.md#who-owns-the-plans-quota-plans-source` fails: GitHub keeps
    the underscores)."""
    link = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
    checked, broken = 0, []
    for source in markdown_files():
        text = re.sub(r"`[^`\n]*`", "", prose(read(source)))
        for target in link.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("<"):
                continue  # another site, or mail
            path, _, anchor = target.partition("#")
            where = (source.parent / path).resolve() if path else source
            checked += 1
            if not where.exists():
                broken.append(f"{source.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{source.relative_to(ROOT)}: {target} (no such heading)")
    assert checked >= 30
    assert broken == []
