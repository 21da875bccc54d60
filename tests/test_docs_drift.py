"""The Markdown docs say what the code does, read as plain Markdown (as GitHub shows
them), without building the Sphinx site: the configuration keys, the `flask quota`
commands, `quota.limit`'s parameters, the built-in plans, the extras, every name SPEC
section 9 fixes, the pages' shape, the README's shape and figures, and every
intra-repository link and its anchor."""

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


def docs_pages() -> dict[str, str]:
    """Every Markdown page of docs/, by file name (new pages included, tracked or not)."""
    return {path.name: read(path) for path in sorted(DOCS.glob("*.md"))}


def all_docs() -> str:
    """The text of every docs page, one after the other."""
    return "\n".join(docs_pages().values())


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


def lines_naming(name: str) -> list[str]:
    """The lines of the docs pages that name the command ``name`` (`flask quota clients
    revoke`) as a whole word."""
    pattern = re.compile(rf"(^|[\s`]){re.escape(name)}([\s`]|$)")
    return [line for line in all_docs().splitlines() if pattern.search(line)]


def test_docs_name_every_flask_quota_command_with_its_options() -> None:
    """Walking the click group: each command's full name (`flask quota clients revoke`)
    is on some docs page (the reference is docs/cli.md), and each of its options
    (`--reason`, `--shadow`/`--enforce`) on a line that names it; `--actor`, common to
    every change, is explained once."""
    found = list(commands(quota_cli, "flask quota"))
    assert len(found) >= 20, [name for name, _ in found]
    for name, command in found:
        own = lines_naming(name)
        assert own, f"`{name}` is not documented on any page of docs/"
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden or "--actor" in param.opts:
                continue
            for option in (*param.opts, *param.secondary_opts):
                if option.startswith("--"):
                    assert any(option in line for line in own), (
                        f"`{name} {option}` is not on a line of docs/ naming {name}"
                    )
    assert "--actor" in read(DOCS / "cli.md")


def test_the_cli_reference_lists_every_command() -> None:
    """docs/cli.md, the command-line reference, names every leaf command of the click
    group in its list."""
    page = read(DOCS / "cli.md")
    for name, _ in commands(quota_cli, "flask quota"):
        assert re.search(rf"(^|[\s`]){re.escape(name)}([\s`]|$)", page, re.M), (
            f"docs/cli.md does not list `{name}`"
        )


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


def test_plans_md_plans_table_is_the_built_in_plans() -> None:
    """The built-in plans table in docs/plans.md has a row per plan of DEFAULT_PLANS and
    a column per resource (ai_tokens included), each with the code's rate."""
    usage = read(DOCS / "plans.md")
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
        # pip install '.[a,b]', "/path/to/flask-quota[a]", "dist/flask_quota-...whl[a]"
        named = re.findall(r"pip install [^\n#]*?(?:\.|flask-quota|\.whl)\[([\w,]+)\]", read(path))
        installs = {extra for group in named for extra in group.split(",")}
        assert installs, f"{path.name} shows no install with an extra"
        assert installs <= extras, f"{path.name} installs extras setup.cfg lacks"


# -- the README -------------------------------------------------------------------


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_readme_has_no_repeated_section_and_the_example_once() -> None:
    """README.md is a front page: no `##` heading twice, the first app's app.py block
    and its shell block once each, and the Quickstart's two commands (the demo, the
    whole test suite) and no other."""
    readme = read(ROOT / "README.md")
    headings = re.findall(r"^## (.+)$", prose(readme), re.M)
    assert {"Quickstart", "Install", "A first app", "Documentation",
            "Coming from Flask-Limiter"} <= set(headings)  # fmt: skip
    repeated = [h for h, n in Counter(headings).items() if n > 1]
    assert repeated == [], f"README.md repeats the sections {repeated}"
    blocks = [m.group(0) for m in FENCE.finditer(readme)]
    assert sum(b.startswith("```python\n# app.py\n") for b in blocks) == 1
    assert sum("flask --app app run" in b for b in blocks) == 1
    quickstart = [m.group(0) for m in FENCE.finditer(section(readme, "Quickstart"))]
    commands = [line.split("#")[0].strip() for line in quickstart[0].splitlines()[1:-1]]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert (ROOT / "scripts" / "demo.sh").is_file() and (ROOT / "scripts" / "test.sh").is_file()


def test_readme_fits_one_screen_then_150_lines() -> None:
    """The part of README.md before its first code block (what it is, why over
    Flask-Limiter, up to the Quickstart's commands) is under 30 lines, the whole
    README under 150, and its Flask-Limiter section is a summary, not a table."""
    readme = read(ROOT / "README.md")
    first_screen = readme[: readme.index("\n```")].count("\n") + 1
    assert first_screen < 30, f"the README's first screen is {first_screen} lines"
    assert "## Quickstart" in readme[: readme.index("\n```")]
    assert readme.count("\n") < 150, f"README.md is {readme.count(chr(10))} lines"
    flask_limiter = section(readme, "Coming from Flask-Limiter")
    assert "|" not in prose(flask_limiter).replace("`|`", ""), "a table in the summary"
    assert "[docs/flask-limiter.md](docs/flask-limiter.md)" in flask_limiter


def test_readme_installs_from_a_checkout_or_a_wheel_not_from_pypi() -> None:
    """flask-quota is not on the package index yet: the README says so, installs from a
    checkout and from a built wheel, and never tells anyone to `pip install flask-quota`."""
    install = section(read(ROOT / "README.md"), "Install")
    assert "not on PyPI" in install
    assert "pip install ." in install and ".whl" in install
    assert "python -m build" in install or "pip wheel" in install
    code = "".join(m.group(0) for m in FENCE.finditer(read(ROOT / "README.md")))
    assert not re.search(r"pip install ['\"]?flask-quota\b", code)


# A figure with its unit, as the README's claims quote them: 235.2 µs, 2828 req/s,
# 1.88 times, 100.0%, and the round trips ("1 for three limits", "3 (5 with ...").
FIGURE = re.compile(r"(\d[\d,]*(?:\.\d+)?) ?(?:µs|us|req/s|\u00d7|x\b|%)")


def test_readme_figures_are_the_latest_measurements() -> None:
    """Every figure with a unit in README.md is one that bench/results.md or
    bench/README.md reports (none invented, none rounded); the README names
    bench/results.md's date, so a new full run fails here until the README quotes it."""
    readme = prose(read(ROOT / "README.md"))
    results = read(ROOT / "bench" / "results.md")
    history = read(ROOT / "bench" / "README.md")
    figures = set(FIGURE.findall(readme))
    assert len(figures) >= 8, figures
    for figure in figures:
        pattern = rf"(?<![\d.]){re.escape(figure)}(?![\d])"
        assert re.search(pattern, results) or re.search(pattern, history), (
            f"the README's {figure} is in neither bench/results.md nor bench/README.md"
        )
    measured = re.search(r"^Measured (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", results, re.M)
    assert measured, "bench/results.md no longer says when it was measured"
    assert measured.group(1) in readme, f"the README does not quote the run of {measured.group(1)}"
    assert "[bench/README.md](bench/README.md)" in readme
    for stale in ("Round eight", "Round nine", "3.11.7", "7.0.15", "slower day", "afternoon"):
        assert stale not in readme, f"lab notebook in the README: {stale!r}"


# -- the pages --------------------------------------------------------------------


def test_every_docs_page_is_short_and_says_what_it_is_for() -> None:
    """No page of docs/ is over 450 lines (the goal is 400), and each opens, after its
    title, with a sentence saying what it is for (not a heading, a table, a list or
    code)."""
    for name, text in docs_pages().items():
        lines = text.count("\n")
        assert lines <= 450, f"docs/{name} is {lines} lines"
        body = [line for line in text.splitlines() if line.strip()]
        body = [line for line in body if not re.match(r"^\(\S+\)=$", line)]  # MyST labels
        assert body[0].startswith("# "), f"docs/{name} does not start with its title"
        first = body[1]
        assert re.match(r"[A-Z`*\[a-z]", first) and not first.startswith(("#", "|", "```", "- ")), (
            f"docs/{name} does not open with a sentence: {first!r}"
        )


def test_index_maps_every_page() -> None:
    """docs/index.md links every page of docs/ (and the ones others are writing:
    credits.md, waiting.md) and lists each in a toctree."""
    index = read(DOCS / "index.md")
    pages = {p.stem for p in DOCS.iterdir() if p.suffix in (".md", ".rst")} - {"index"}
    for page in pages | {"credits", "waiting"}:
        assert re.search(rf"\]\({re.escape(page)}\.(md|rst)\)", index), f"index.md lacks {page}"
        assert re.search(rf"^{re.escape(page)}$", index, re.M), f"no toctree entry for {page}"


def test_plan_changes_reach_workers_within_the_sync_interval() -> None:
    """The docs say a change reaches the workers within the sync interval
    (`QUOTA_SYNC_INTERVAL`, its real default), never "in two seconds"."""
    text = all_docs() + read(ROOT / "README.md")
    generated = read(DOCS / "configuration.md")  # its table is the code's own text
    for bad in ("two seconds", "within 2 s", "at most 2 s"):
        assert bad not in text.replace(generated, ""), f"the docs still say {bad!r}"
    default = dict((key, value) for key, value, _ in reference())["QUOTA_SYNC_INTERVAL"]
    assert f"`QUOTA_SYNC_INTERVAL`, {default} s by default" in text


def test_flask_limiter_guide_writes_a_month_as_per_month() -> None:
    """The guide gives `N/month` for a month, not `N/30 days` (which is another thing:
    30 days aligned to the epoch), and the README keeps no port table of its own."""
    guide = read(DOCS / "flask-limiter.md")
    assert '"300/month"' in guide
    assert 'write a month as "300/30 days"' not in guide
    assert "| `default_limits` |" not in read(ROOT / "README.md")


# -- SPEC section 9: every name it fixes is documented ------------------------------

# The names SPEC section 9 (round four) fixes for users to type or read, listed here
# because the tests run from a clean clone without ../shared/SPEC.md. Each must appear
# on some page of docs/ (credits and waiting are documented in docs/credits.md and
# docs/waiting.md, so these fail until those pages exist).
SPEC_9_NAMES = (
    # 9.1 overload protection
    "QUOTA_PRIORITY", "QUOTA_CAPACITY", "QUOTA_RESERVE", "QUOTA_ADAPTIVE",
    "QUOTA_MAX_QUEUE_MS", 'priority="critical"', '@quota.priority("sheddable")',
    "critical", "default", "sheddable", "503", '"tier": "capacity"', '"tier": "queue"',
    '"priority"', "Retry-After", "signals.quota_shed", "flask_quota_shed_total",
    "ratelimit.outcome", "shed", "X-Request-Start", "t=<seconds.fraction>",
    "t=<microseconds>", "<milliseconds>",
    # 9.2 ledger, alerts, webhooks
    "QUOTA_LEDGER", "QUOTA_ALERTS", "QUOTA_WEBHOOK_URL", "QUOTA_WEBHOOK_SECRET",
    "Quota-Signature", "quota_usage", "signals.quota_alert", "quota.alert",
    "quota.exceeded", "caller.blocked", "credits.low", "credits.exhausted",
    "quota_webhook_events", '"id"', '"type"', '"created"', '"data"',
    # 9.3 prepaid credits
    "quota.grant", '"credits"', "402", '"tier": "credits"', '"balance"',
    # 9.4 waiting, networks
    "quota.limited", "wait=", "delay=", "QuotaExceeded", "403", '"tier": "network"',
)  # fmt: skip

# The commands SPEC section 9 names, each with the options it gives them: each command
# must be on a docs line that also names each of its options.
SPEC_9_COMMANDS = {
    "flask quota usage report": ("--client", "--tenant", "--identity", "--period", "--from",
                                 "--to", "--format"),
    "flask quota webhooks list": ("--failed",),
    "flask quota webhooks retry": (),
    "flask quota credits grant": ("--resource", "--expires", "--note"),
    "flask quota credits show": (),
    "flask quota networks deny": ("--for", "--reason"),
    "flask quota networks allow": ("--reason",),
    "flask quota networks list": (),
    "flask quota networks remove": (),
}  # fmt: skip


def test_docs_name_every_spec_section_9_name() -> None:
    """Every setting, API name, header, body field, event and status SPEC section 9
    fixes appears on some page of docs/ (as a whole word where it starts or ends with
    one). docs/index.md does not count: it is the map, naming what other pages document."""
    text = "\n".join(body for name, body in docs_pages().items() if name != "index.md")
    missing = []
    for name in SPEC_9_NAMES:
        before = r"(?<![\w.])" if re.match(r"\w", name) else ""
        after = r"(?!\w)" if re.search(r"\w$", name) else ""
        if not re.search(before + re.escape(name) + after, text):
            missing.append(name)
    assert missing == [], f"SPEC section 9 names no docs page documents: {missing}"


def test_docs_name_every_spec_section_9_command_with_its_options() -> None:
    """Each command of SPEC section 9 (`flask quota credits grant`, `flask quota networks
    deny`, ...) is on a docs line that also names each of its options."""
    missing = []
    for name, options in SPEC_9_COMMANDS.items():
        own = [line for line in lines_naming(name) if line not in read(DOCS / "index.md")]
        if not own:
            missing.append(name)
        missing += [f"{name} {opt}" for opt in options if not any(opt in line for line in own)]
    assert missing == [], f"SPEC section 9 commands the docs lack: {missing}"


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
