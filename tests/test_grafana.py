"""docs/grafana/flask-quota.json: a Grafana dashboard over the metrics the app serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_quota import Identity, Quota
from flask_quota.metrics import OUTCOMES
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.prom import Scrape
from tests.promql import parse

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "flask-quota.json"


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in load()["panels"] for t in p["targets"]]


def served(tmp_path: Path) -> dict[str, set[str]]:
    """Every series name the app's /metrics serves, with its labels: a real app that
    allows, denies and crosses the near-limit line, scraped."""
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config.update(
        QUOTA_METRICS_URL="/metrics",
        QUOTA_NEAR_LIMIT=0.5,
        QUOTA_PLANS={"free": {"global": "100/minute", "user": "2/minute"}},
    )
    quota = Quota(app, storage=MemoryStorage(FrozenClock()))
    quota.identity_loader(lambda: Identity("ada"))
    app.add_url_rule("/items", "items", lambda: "ok")
    http = app.test_client()
    assert [http.get("/items").status_code for _ in range(3)] == [200, 200, 429]
    scrape = Scrape.parse(http.get("/metrics").get_data(as_text=True))
    names: dict[str, set[str]] = {}
    for name, labels, _ in scrape.samples:
        names.setdefault(name, set()).update(labels)
    app.extensions["quota"].sql.close()
    return names


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    """Unique panel ids, panels inside the 24-column grid, every target a PromQL
    expression on the dashboard's own Prometheus data source variable."""
    data = load()
    assert data["uid"] == "flask-quota" and data["schemaVersion"] >= 36
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["refId"] and target["expr"].strip(), panel["title"]
            for used in re.findall(r"\$(\w+)", target["expr"]):
                assert used.startswith("__") or used in variables, (panel["title"], used)


@pytest.mark.parametrize(("title", "expr"), exprs())
def test_every_query_parses_and_reads_metrics_the_app_serves(
    title: str, expr: str, tmp_path: Path
) -> None:
    """Each panel's PromQL parses, and each metric, label and outcome it names is one
    that flask_quota/metrics.py serves (scraped from a real app)."""
    query = parse(expr)
    names = served(tmp_path)
    assert query.selectors, title
    for selector in query.selectors:
        assert selector.metric in names, (title, selector.metric, sorted(names))
        labels = names[selector.metric]
        for label, op, value in selector.matchers:
            assert label in labels, (title, selector.metric, label)
            if label == "outcome":
                wanted = value.split("|") if op in ("=~", "!~") else [value]
                assert set(wanted) <= set(OUTCOMES), (title, value)
    every_label = set().union(*(names[s.metric] for s in query.selectors if s.metric))
    assert set(query.groupings) <= every_label, (title, query.groupings)


def test_the_new_near_limit_metric_has_a_panel() -> None:
    """The dashboard shows the near-limit crossings, and every metric of metrics.py."""
    used = {s.metric for _, expr in exprs() for s in parse(expr).selectors}
    assert "flask_quota_near_limit_total" in used
    assert {
        "flask_quota_decisions_total", "flask_quota_storage_seconds_bucket",
        "flask_quota_breaker_open", "flask_quota_deny_cache_hits_total",
    } <= used  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        "sum(rate(flask_quota_decisions_total[5m])",
        "rate(flask_quota_decisions_total{outcome=}[5m])",
        "sum by outcome (flask_quota_decisions_total)",
        "flask_quota_decisions_total[5x]",
        'flask_quota_decisions_total{outcome=="denied"}',
        "1 +",
        "{}",
    ],
)
def test_the_checker_rejects_malformed_promql(bad: str) -> None:
    """The checker can fail: broken queries are refused."""
    with pytest.raises(ValueError):
        parse(bad)


def test_the_checker_reads_real_promql() -> None:
    """Precedence, subqueries, offsets, on(), bool and a right-associative ^ parse."""
    query = parse(
        'sum without (plan) (rate(a_total{x!~"y|z"}[5m] offset 1h)) / on (tier) group_left '
        "max by (tier) (b) > bool 0.5 or -c ^ 2 ^ 3 and max_over_time(d[1h:5m])"
    )
    assert [s.metric for s in query.selectors] == ["a_total", "b", "c", "d"]
    assert query.groupings == ["plan", "tier", "tier"]
