"""``flask quota routes``: every URL rule with the limits that apply to it and why a
route is exempt, from the demo app down to each flag of a limit."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import Result
from flask import Blueprint, Flask

from flask_quota import Quota
from flask_quota.core.plans import catalog_from_config
from flask_quota.core.policy import LimitSpec
from flask_quota.core.rates import parse_rates
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.sql.store import DEFAULT_DATABASE_FILE
from flask_quota.tools.routes import plan_tiers, route_rows


def invoke(app: Flask, *args: str) -> Result:
    try:  # click < 8.2 mixes stderr into the output unless told not to; 8.2 never does
        runner = app.test_cli_runner(mix_stderr=False)
    except TypeError:
        runner = app.test_cli_runner()
    result = runner.invoke(args=["quota", "routes", *args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Flask]:
    from tests.demo import demo_app

    app = demo_app(
        {
            "QUOTA_DASHBOARD_URL": None,
            "QUOTA_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        }
    )
    yield app
    app.extensions["quota"].sql.close()


def line_of(output: str, rule: str) -> list[str]:
    """The cells of the table line that starts with ``rule``."""
    lines = [line.split() for line in output.splitlines() if line.split()[:1] == [rule]]
    assert len(lines) == 1, output
    return lines[0]


def test_the_demo_lists_its_ai_route_with_plan_rates_and_health_as_exempt(demo: Flask) -> None:
    output = invoke(demo).stdout
    infer = line_of(output, "/v1/ai/infer")
    # The demo runs with overload protection (QUOTA_CAPACITY): a PRIORITY column.
    assert infer[:5] == ["/v1/ai/infer", "POST", "infer", "default", "ai_inference"]
    assert line_of(output, "/v1/checkout")[:4] == ["/v1/checkout", "POST", "checkout", "critical"]
    assert line_of(output, "/v1/reports")[:4] == ["/v1/reports", "GET", "reports", "sheddable"]
    # Each plan's rate for the resource, in the plans' upgrade order (free, pro, enterprise,
    # and payg, the demo's prepaid plan, made last with the free plan's rates).
    assert infer[-4:] == ["5/minute", "30/minute", "120/minute", "5/minute"]
    health = line_of(output, "/healthz")
    assert health[:3] == ["/healthz", "GET", "health"]
    assert "exempt (@quota.exempt)" in " ".join(health)
    # A view without a limit of its own still counts on the plan's tiers: the header says so.
    assert line_of(output, "free")[1:3] == ["50/second", "-"]
    assert "100/minute" in line_of(output, "free")
    items = line_of(output, "/v1/items")
    assert items[4] == "-"


def test_the_demo_as_json(demo: Flask) -> None:
    found = json.loads(invoke(demo, "--json").stdout)
    assert found["plans"]["free"] == {
        "global": "50/second",
        "tenant": None,
        "user": "100/minute",
        "concurrent": None,
    }
    routes = {route["rule"]: route for route in found["routes"]}
    infer = routes["/v1/ai/infer"]
    assert (infer["methods"], infer["endpoint"], infer["exempt"]) == (["POST"], "infer", None)
    (limit,) = infer["limits"]
    assert limit["resource"] == "ai_inference"
    assert limit["rate"] is None  # the plans give the rate; the decorator gives none
    assert limit["plans"] == {
        "free": "5/minute",
        "pro": "30/minute",
        "enterprise": "120/minute",
        "payg": "5/minute",
    }
    assert routes["/healthz"]["exempt"] == "@quota.exempt"
    assert routes["/healthz"]["limits"] == []
    assert routes["/v1/items"] == {
        "rule": "/v1/items",
        "methods": ["GET"],
        "endpoint": "items",
        "exempt": None,
        "priority": "default",
        "limits": [],
    }
    assert routes["/v1/reports"]["priority"] == "sheddable"


def test_exemptions_say_why(app: Flask) -> None:
    """A view's @quota.exempt, an exempt blueprint (and one nested in it), static files."""
    app.config["QUOTA_PLANS"] = {"free": {"user": "10/minute"}}
    quota = Quota(app)
    parent, child = Blueprint("parent", __name__), Blueprint("child", __name__)
    child.add_url_rule("/c", "c", lambda: "c")
    parent.add_url_rule("/p", "p", lambda: "p")
    parent.register_blueprint(child, url_prefix="/child")
    quota.exempt(parent)
    app.register_blueprint(parent, url_prefix="/parent")
    app.add_url_rule("/free", "free", quota.exempt(lambda: "f"))
    found = {r["rule"]: r["exempt"] for r in json.loads(invoke(app, "--json").stdout)["routes"]}
    assert found == {
        "/static/<path:filename>": "static files",
        "/parent/p": "blueprint 'parent' is exempt",
        "/parent/child/c": "blueprint 'parent' is exempt",
        "/free": "@quota.exempt",
    }


def test_every_flag_of_a_limit_and_a_literal_rate_under_the_plans(app: Flask) -> None:
    app.config["QUOTA_PLANS"] = {
        "free": {"user": "10/minute", "resources": {"export": "2/minute"}},
        "pro": {"global": "100/second", "tenant": "1000/minute"},
    }
    quota = Quota(app)

    @app.route("/export", methods=["GET", "POST"])
    @quota.limit(
        "20/minute, 500/day",
        resource="export",
        cost=lambda: 3,
        key=lambda: "org",
        per_method=False,
        charge_when=lambda response: True,
        exempt_when=lambda: False,
    )
    def export() -> str:
        return "x"

    @app.get("/plain")
    @quota.limit("5/second", cost=2)
    def plain() -> str:
        return "x"

    routes = {r["rule"]: r for r in json.loads(invoke(app, "--json").stdout)["routes"]}
    (limit,) = routes["/export"]["limits"]
    assert routes["/export"]["methods"] == ["GET", "POST"]  # HEAD counts as GET
    assert limit == {
        "resource": "export",
        "rate": "20/minute, 500/day",
        "cost": "callable",
        "key": True,
        "per_method": False,
        "charge_when": True,
        "exempt_when": True,
        "concurrent": None,
        # free's own rate for the resource wins; pro has none, so the decorator's applies.
        "plans": {"free": "2/minute", "pro": "20/minute, 500/day"},
    }
    (plain_limit,) = routes["/plain"]["limits"]
    assert plain_limit["resource"] == "plain"  # the endpoint name when no resource is given
    assert (plain_limit["cost"], plain_limit["key"], plain_limit["per_method"]) == (2, False, True)
    text = invoke(app).stdout
    export_line = line_of(text, "/export")
    assert export_line[:5] == ["/export", "GET,POST", "export", "export", "20/minute,"]
    assert "callable" in export_line
    assert "key=,per_method=False,charge_when,exempt_when" in export_line
    assert line_of(text, "pro")[1:4] == ["100/second", "1000/minute", "-"]


def test_a_shadow_plan_limit_is_marked(app: Flask) -> None:
    app.config["QUOTA_PLANS"] = {
        "free": {"resources": {"search": {"rate": "3/minute", "shadow": True}}}
    }
    quota = Quota(app)
    app.add_url_rule("/s", "s", quota.limit(resource="search")(lambda: "s"))
    routes = json.loads(invoke(app, "--json").stdout)["routes"]
    assert routes[0]["limits"][0]["plans"] == {"free": "3/minute (shadow)"}


@dataclass(frozen=True, slots=True)
class _InFlight(LimitSpec):
    """A limit with ``concurrent``, as stacked/in-flight limits will record it."""

    concurrent: int | None = None


class _Rule:
    def __init__(self, rule: str, endpoint: str, methods: set[str]) -> None:
        self.rule, self.endpoint, self.methods = rule, endpoint, methods


def test_the_tool_takes_several_limits_per_endpoint_and_their_concurrency() -> None:
    """Stacked limits: one row per limit, each with its plans' rates; ``concurrent``
    printed when a limit has it."""
    catalog = catalog_from_config(
        {"free": {"resources": {"daily": "3/day"}}, "pro": {}}, upgrade_url="/p"
    )
    specs: tuple[LimitSpec, ...] = (
        _InFlight(parse_rates("2/second"), None, 1, concurrent=2),
        LimitSpec(parse_rates("100/day"), "daily", 1),
    )

    def limits_of(endpoint: str, method: str) -> tuple[str | None, tuple[LimitSpec, ...]]:
        return None, specs

    rows = route_rows([_Rule("/e", "e", {"GET", "HEAD", "OPTIONS"})], limits_of, catalog)
    (row,) = rows
    assert (row.rule, row.methods, row.endpoint, row.exempt) == ("/e", ("GET",), "e", None)
    first, second = row.limits
    assert (first.resource, first.concurrent, first.plans) == (
        "e",
        2,
        {"free": "2/second", "pro": "2/second"},
    )
    assert "concurrent=2" in first.flags
    assert (second.resource, second.concurrent) == ("daily", None)
    assert second.plans == {"free": "3/day", "pro": "100/day"}
    assert [t.plan for t in plan_tiers(catalog)] == ["free", "pro"]


def test_the_command_is_in_the_quota_group_and_says_when_limits_are_off(app: Flask) -> None:
    app.config.update(QUOTA_PLANS={"free": {}}, QUOTA_ENABLED=False)
    Quota(app)
    app.add_url_rule("/x", "x", lambda: "x")
    result = invoke(app)
    assert "QUOTA_ENABLED is off" in result.stderr
    assert line_of(result.stdout, "/x")[:3] == ["/x", "GET", "x"]


def test_an_app_without_quota_tables_gets_none_made_and_its_configured_plans(
    app: Flask,
) -> None:
    """Listing changes nothing: an app that keeps no quota tables (no QUOTA_DATABASE_URL,
    no dashboard, no file yet) is shown QUOTA_PLANS, and no SQLite file appears (one would
    make the database, not QUOTA_PLANS, own the plans at the next start)."""
    app.config["QUOTA_PLANS"] = {"solo": {"user": "7/minute"}}
    app.config.update(QUOTA_DEFAULT_PLAN="solo", QUOTA_ANONYMOUS_PLAN="solo")
    Quota(app)
    found = json.loads(invoke(app, "--json").stdout)
    assert found["plans"] == {
        "solo": {"global": None, "tenant": None, "user": "7/minute", "concurrent": None}
    }
    assert not (Path(app.instance_path) / DEFAULT_DATABASE_FILE).exists()


def test_plans_edited_in_the_quota_tables_are_the_ones_shown(tmp_path: Path) -> None:
    """With quota tables, the plans are read from them, as the servers enforce them."""
    url = f"sqlite:///{tmp_path / 'quota.sqlite3'}"
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(QUOTA_DATABASE_URL=url, QUOTA_PLANS={"free": {"user": "7/minute"}})
    quota = Quota(app)
    app.add_url_rule("/s", "s", quota.limit("1/second", resource="s")(lambda: "s"))
    try:
        with app.app_context():
            QuotaAdmin(app.extensions["quota"].sql, actor="t").set_plan_limit(
                "free", "endpoint", "9/minute", resource="s"
            )
        found = json.loads(invoke(app, "--json").stdout)
        assert found["plans"]["free"]["user"] == "7/minute"
        routes = {route["rule"]: route for route in found["routes"]}
        assert routes["/s"]["limits"][0]["plans"] == {"free": "9/minute"}
    finally:
        app.extensions["quota"].sql.close()


def test_the_operations_page_shows_the_demos_real_output(demo: Flask) -> None:
    """Every line of docs/operations.md's `flask quota routes` excerpt is a line the demo
    prints (columns compared cell by cell; the page leaves the dashboard's rows out)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text("utf-8")
    excerpt = page.split("$ flask --app wsgi quota routes", 1)[1].split("```", 1)[0]
    shown = [line.split() for line in excerpt.splitlines()[1:] if line.strip() not in ("", "...")]
    printed = [line.split() for line in invoke(demo).stdout.splitlines()]
    assert len(shown) >= 8
    for cells in shown:
        assert cells in printed, " ".join(cells)


def test_a_callable_rate_is_listed_as_callable(app: Flask) -> None:
    """A rate asked per request shows as ``callable`` where no plan sets the resource
    (it was listed as no rate at all)."""
    app.config["QUOTA_PLANS"] = {"free": {}, "pro": {"resources": {"ai": "50/minute"}}}
    quota = Quota(app)

    @app.get("/ai")
    @quota.limit(lambda: "5/minute", resource="ai")
    def ai() -> str:
        return "x"

    found = json.loads(invoke(app, "--json").output)
    [row] = [r for r in found["routes"] if r["rule"] == "/ai"]
    [limit] = row["limits"]
    assert limit["rate"] == "callable"
    assert limit["plans"] == {"free": "callable", "pro": "50/minute"}


def failing(app: Flask, *args: str) -> Result:
    """``flask quota routes ARGS`` that must fail: its result, exit code checked."""
    result = app.test_cli_runner().invoke(args=["quota", "routes", *args])
    assert result.exit_code != 0, result.output
    return result


def dashboard_app(app: Flask, close_sql: Callable[[Flask], Flask]) -> Flask:
    """A new app of three routes of its own, with the dashboard and the status mounted."""
    app.secret_key = "routes-test"
    app.config.update(
        QUOTA_PLANS={"free": {"user": "10/minute", "resources": {"ai": "5/minute"}}},
        QUOTA_DASHBOARD_URL="/quota",
        QUOTA_STATUS_URL="/rate_limit",
        QUOTA_DATABASE_URL=f"sqlite:///{Path(app.instance_path) / 'quota.sqlite3'}",
    )
    quota = Quota(close_sql(app))
    app.add_url_rule("/items", "items", lambda: "items")
    app.add_url_rule("/items/<int:item>", "item", lambda item: "item")
    app.add_url_rule("/ai", "ai", quota.limit(resource="ai")(lambda: "ai"), methods=["POST"])
    return app


def test_a_new_app_lists_only_its_own_routes(
    app: Flask, close_sql: Callable[[Flask], Flask]
) -> None:
    """The dashboard's own routes (a blueprint the extension registers) are not the app's:
    hidden by default, with a note saying how many and how to see them; ``--all`` lists
    them too. The status URL the app configured is one of its routes and stays listed."""
    app = dashboard_app(app, close_sql)
    result = invoke(app, "--json")
    rules = {route["rule"] for route in json.loads(result.stdout)["routes"]}
    assert rules == {"/items", "/items/<int:item>", "/ai", "/rate_limit", "/static/<path:filename>"}
    assert "--all" in result.stderr and "dashboard" in result.stderr
    text = invoke(app).stdout
    assert "/quota" not in text and "quota_dashboard" not in text
    every = {route["rule"] for route in json.loads(invoke(app, "--all", "--json").stdout)["routes"]}
    dashboard = every - rules
    assert "/quota/" in dashboard and "/quota/clients" in dashboard, dashboard
    assert str(len([r for r in app.url_map.iter_rules() if r.rule in dashboard])) in result.stderr
    assert "/quota/clients" in invoke(app, "--all").stdout
    assert "--all" not in invoke(app, "--all").stderr


def test_an_app_without_the_dashboard_says_nothing_is_hidden(app: Flask) -> None:
    app.config["QUOTA_PLANS"] = {"free": {"user": "10/minute"}}
    Quota(app)
    app.add_url_rule("/x", "x", lambda: "x")
    result = invoke(app)
    assert line_of(result.stdout, "/x")[:3] == ["/x", "GET", "x"]
    assert "hidden" not in result.stderr


def test_endpoint_filters_to_one_endpoint(app: Flask, close_sql: Callable[[Flask], Flask]) -> None:
    """``--endpoint NAME`` lists that endpoint's rules only (Flask-Limiter's
    ``flask limiter limits --endpoint``); the plans' tiers still head the table."""
    app = dashboard_app(app, close_sql)
    found = json.loads(invoke(app, "--endpoint", "ai", "--json").stdout)
    assert [(r["rule"], r["endpoint"]) for r in found["routes"]] == [("/ai", "ai")]
    assert found["routes"][0]["limits"][0]["plans"] == {"free": "5/minute"}
    text = invoke(app, "--endpoint", "item").stdout
    assert line_of(text, "/items/<int:item>")[:3] == ["/items/<int:item>", "GET", "item"]
    assert "/ai" not in text and "/items " not in text
    assert line_of(text, "free")[3] == "10/minute"  # the plan's user tier, still shown


def test_endpoint_names_a_dashboard_route_without_all(
    app: Flask, close_sql: Callable[[Flask], Flask]
) -> None:
    """Asking for one of the dashboard's endpoints by name shows it: the filter is explicit."""
    app = dashboard_app(app, close_sql)
    found = json.loads(invoke(app, "--endpoint", "quota_dashboard.clients_page", "--json").stdout)
    assert [r["rule"] for r in found["routes"]] == ["/quota/clients"]
    assert found["routes"][0]["exempt"] == "@quota.exempt"


def test_an_unknown_endpoint_fails_and_says_how_to_find_one(
    app: Flask, close_sql: Callable[[Flask], Flask]
) -> None:
    app = dashboard_app(app, close_sql)
    result = failing(app, "--endpoint", "nope")
    assert "no endpoint named 'nope'" in result.output
    assert "flask quota routes" in result.output


def test_path_filters_by_what_a_url_matches(
    app: Flask, close_sql: Callable[[Flask], Flask]
) -> None:
    """``--path PATH``: the rules a request to PATH would reach (any method), a URL with
    its variables filled in or the rule itself; a path nothing matches fails."""
    app = dashboard_app(app, close_sql)

    def rules(*args: str) -> list[str]:
        return [r["rule"] for r in json.loads(invoke(app, *args, "--json").stdout)["routes"]]

    assert rules("--path", "/items/42") == ["/items/<int:item>"]
    assert rules("--path", "/items/<int:item>") == ["/items/<int:item>"]
    assert rules("--path", "/ai") == ["/ai"]  # POST only: matched by its own method
    assert rules("--path", "/rate_limit?x=1") == ["/rate_limit"]
    assert rules("--path", "/quota/clients") == ["/quota/clients"]
    assert rules("--path", "/quota") == ["/quota/"]  # through its redirect
    assert "could not be matched" in failing(app, "--path", "/items/abc").output
    assert "could not be matched" in failing(app, "--path", "/nothing").output


def test_endpoint_and_path_together_must_agree(
    app: Flask, close_sql: Callable[[Flask], Flask]
) -> None:
    app = dashboard_app(app, close_sql)
    both = json.loads(invoke(app, "--endpoint", "ai", "--path", "/ai", "--json").stdout)
    assert [r["rule"] for r in both["routes"]] == ["/ai"]
    assert "does not match" in failing(app, "--endpoint", "items", "--path", "/ai").output
