"""The shape of the codebase: an acyclic import graph and public doors for tools."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.storage import storage_from_url
from flask_quota.storage.url import masked

PACKAGE = Path(__file__).resolve().parents[1] / "flask_quota"


def _modules() -> dict[str, Path]:
    """Every module of the package (symlinked subpackages included) by dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(["flask_quota", *parts])] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: dict[str, Path], *, typed: bool = False) -> set[str]:
    """Modules of ours that ``name`` imports at run time, late (in-function) imports
    included; with ``typed``, the imports for annotations only too."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not typed and _type_checking_only(node):
            return  # annotations only: no run-time edge
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                full = f"{origin}.{alias.name}"
                targets.add(full if full in modules else origin)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text("utf-8")))
    return {t for t in targets if t in modules and t != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    """No module of flask_quota imports, even late or for annotations only, a module
    that imports it back."""
    modules = _modules()
    graph = {name: _imports(name, path, modules, typed=True) for name, path in modules.items()}
    assert graph["flask_quota.cli"], "the import scan found no edges: it is broken"
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_a_cycle_is_detected() -> None:
    """The detector itself finds a cycle when there is one."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_tools_do_not_import_the_extension() -> None:
    """The CLI and the inspection API reach the app's state through ``flask_quota.state``."""
    modules = _modules()
    cli = [name for name in modules if name.startswith("flask_quota.cli")]
    assert len(cli) > 1, cli  # the package and its topics
    for name in [*cli, "flask_quota.tools.inspection", "flask_quota.state"]:
        assert "flask_quota.extension" not in _imports(name, modules[name], modules), name


def test_the_sql_layer_does_not_reach_up() -> None:
    """``flask_quota.sql`` is below the CLI, the tools, the per-app state and the
    extension: none of its modules imports them, type-only imports included."""
    modules = _modules()
    above = ("flask_quota.cli", "flask_quota.tools", "flask_quota.extension", "flask_quota.state")
    sql = [name for name in modules if name.startswith("flask_quota.sql.")]
    assert len(sql) > 5, sql
    for name in sql:
        reached = _imports(name, modules[name], modules, typed=True)
        assert not [m for m in reached if m.startswith(above)], name


def test_the_dashboard_reaches_the_library_through_two_doors() -> None:
    """The dashboard imports the public face and ``flask_quota.admin_api``, nothing deeper."""
    modules = _modules()
    used: set[str] = set()
    for path in sorted((PACKAGE.parent / "dashboard").glob("*.py")):
        name = f"flask_quota.dashboard.{path.stem}"
        used |= {m for m in _imports(name, path, modules, typed=True) if "dashboard" not in m}
    assert used == {"flask_quota", "flask_quota.admin_api"}, sorted(used)


def test_the_core_knows_no_flask_redis_or_sql() -> None:
    """``flask_quota.core`` imports only itself and the standard library (and Werkzeug's
    HTTP exceptions, which ``QuotaExceeded`` is), type-only imports included."""
    allowed = {"werkzeug.exceptions"}
    for path in sorted((PACKAGE / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if not node.level else []
                assert not node.level or node.level == 1, f"{path.name} reaches outside core"
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                assert name in allowed or top in sys.stdlib_module_names, f"{path.name}: {name}"


@pytest.mark.parametrize(
    "url",
    [
        "mongodb://admin:hunter22@db:27017",
        "redis://admin:hunter22@db:notaport/0",
        "redis+sentinel://:hunter22@db:26379",
        "redis+cluster://user:hunter22@",
        "redis+sentinel://db:x/svc?sentinel_password=hunter22&x=1",
    ],
)
def test_storage_url_errors_never_show_the_password(url: str) -> None:
    """A bad QUOTA_STORAGE_URL is named in the error, its password masked."""
    with pytest.raises(ValueError, match="QUOTA_STORAGE_URL") as info:
        storage_from_url(url, timeout=0.1)
    assert "hunter22" not in str(info.value)
    assert "***" in str(info.value) or "@" not in url


def test_masked_keeps_everything_but_the_password() -> None:
    """Only the password is replaced; user, hosts, path and other options stay readable."""
    assert masked("redis://bob:pw@h:6379/2?ssl=1") == "redis://bob:***@h:6379/2?ssl=1"
    assert masked("redis://h:6379/0") == "redis://h:6379/0"
    assert masked("x://h/?sentinel_password=pw") == "x://h/?sentinel_password=***"


def test_init_app_error_masks_the_storage_password(tmp_path: Path) -> None:
    """Configuration errors reach logs: the app's own error message hides the password too."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_STORAGE_URL"] = "redis+cluster://u:hunter22@nohost"
    with pytest.raises(ValueError) as info:
        Quota(app)
    assert "hunter22" not in str(info.value)


def test_peek_and_reset_are_the_public_inspection_api(tmp_path: Path) -> None:
    """quota.peek() reads a caller's buckets without charging; quota.reset() empties them."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_PLANS"] = {"free": {"global": "10/minute", "user": "3/minute"}}
    quota = Quota(app)

    @app.get("/")
    def index() -> str:
        return "ok"

    http = app.test_client()
    for _ in range(2):
        http.get("/", environ_base={"REMOTE_ADDR": "203.0.113.9"})
    with app.app_context():
        before = {b.name: b.remaining for b in quota.peek(ip="203.0.113.9")}
        again = {b.name: b.remaining for b in quota.peek(ip="203.0.113.9")}
        assert before == again == {"global": 8, "user": 1}  # peeking charged nothing
        assert quota.reset(ip="203.0.113.9") == 2
        after = {b.name: b.remaining for b in quota.peek(ip="203.0.113.9")}
    assert after == {"global": 10, "user": 3}
    with app.app_context(), pytest.raises(ValueError, match="identity"):
        quota.peek()


def test_every_config_key_is_documented_and_listed_by_init_app() -> None:
    """The reference table covers exactly the keys Settings reads, and init_app lists them."""
    from flask_quota.settings import DEFAULTS, DOCS, reference

    assert set(DOCS) == set(DEFAULTS)
    doc = Quota.init_app.__doc__ or ""
    for key, _, meaning in reference():
        assert f"``{key}``" in doc and meaning


def test_the_dashboard_imports_no_redis() -> None:
    """Storage failures reach the dashboard as ``StorageError`` only (the usage sink
    included), so it imports neither ``redis`` nor ``redis.exceptions``."""
    for path in sorted((PACKAGE.parent / "dashboard").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            assert all(n.partition(".")[0] != "redis" for n in names), f"{path.name}: {names}"


# The layers, lowest first: a module may import its own layer's modules and those of
# the layers below it, never one above. The request path (everything up to ``edge``)
# reaches no operator's tool, CLI or dashboard; storage knows no settings.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("flask_quota.core",)),
    ("storage", ("flask_quota.storage",)),
    ("settings", ("flask_quota.settings",)),
    ("sql", ("flask_quota.sql",)),
    (
        "request path",
        (
            "flask_quota.signals", "flask_quota.otel", "flask_quota.metrics",
            "flask_quota.views", "flask_quota.recorder", "flask_quota.state",
            "flask_quota.blocking", "flask_quota.overload", "flask_quota.webhooks",
            "flask_quota.writer", "flask_quota.ledger", "flask_quota.alerts",
            "flask_quota.networks",
            "flask_quota.credits", "flask_quota.edge",
        ),
    ),
    ("tools", ("flask_quota.tools", "flask_quota.reports", "flask_quota.admin_api")),
    ("cli", ("flask_quota.cli",)),
    (
        "faces",
        (
            "flask_quota.extension", "flask_quota.testing",
            "flask_quota.pytest_plugin", "flask_quota.dashboard",
        ),
    ),
]  # fmt: skip


def _layer(module: str) -> int:
    """The index in ``LAYERS`` of ``module``'s layer (the package itself is a face)."""
    if module == "flask_quota":
        return len(LAYERS) - 1
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def test_every_import_points_down_the_layers() -> None:
    """No module imports one of a layer above its own, late and annotation-only imports
    included: so no storage module reaches the settings, and nothing under
    ``flask_quota/tools`` (nor the CLI or the extension) is on the request path."""
    modules = _modules()
    wrong = [
        f"{name} ({LAYERS[_layer(name)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for name, path in modules.items()
        for target in sorted(_imports(name, path, modules, typed=True))
        if _layer(target) > _layer(name)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_finds_an_arrow_up() -> None:
    """The check itself: a storage module importing the settings is reported."""
    assert _layer("flask_quota.storage.failover") < _layer("flask_quota.settings")
    assert _layer("flask_quota.tools.blocks") > _layer("flask_quota.edge")
