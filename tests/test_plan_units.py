"""A plan's ``concurrent`` field and its resources' units, as QUOTA_PLANS gives them."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.core.plans import DEFAULT_PLANS, Plan, catalog_from_config, plan_config
from flask_quota.core.rates import parse_rates
from flask_quota.testing import FrozenClock, MemoryStorage

# -- concurrent ----------------------------------------------------------------------


def test_quota_plans_concurrent_reaches_the_plan_and_its_export() -> None:
    """``"concurrent": 4`` in QUOTA_PLANS is the plan's ``concurrent``, and ``plans export``
    writes it back; a plan without it has none."""
    config = {"pro": {"user": "500/minute", "concurrent": 4}, "free": {"user": "1/second"}}
    catalog = catalog_from_config(config, upgrade_url="/")
    assert catalog["pro"].concurrent == 4
    assert catalog["free"].concurrent is None
    assert plan_config(catalog["pro"]) == {"user": "500/minute", "concurrent": 4}
    assert "concurrent" not in plan_config(catalog["free"])


@pytest.mark.parametrize("value", [0, -1, "4", 2.5, True])
def test_bad_concurrent_names_the_plan(value: Any) -> None:
    """``concurrent`` must be a whole number of at least 1: anything else fails at
    configuration time with a message naming the plan and the field."""
    with pytest.raises(ValueError) as error:
        catalog_from_config({"free": {"user": "1/second", "concurrent": value}}, upgrade_url="/")
    assert "QUOTA_PLANS['free']['concurrent']" in str(error.value)
    assert "at least 1" in str(error.value)


def test_a_plan_keeps_concurrent_through_pickling() -> None:
    """A plan is a value passed between processes: ``concurrent`` survives pickling."""
    plan = Plan("pro", user_rate=parse_rates("5/second"), concurrent=3)
    assert pickle.loads(pickle.dumps(plan)).concurrent == 3


def test_overrides_keep_the_plans_concurrent() -> None:
    """A client's overrides change its rates, not how many of its requests may be in
    flight: the overridden plan keeps ``concurrent``."""
    from flask_quota.core.tiers import Tier
    from flask_quota.sql.snapshot import OverrideRule, apply_overrides

    plan = Plan("pro", user_rate=parse_rates("5/second"), concurrent=3)
    rule = OverrideRule(Tier.USER, "", parse_rates("50/second"))
    assert apply_overrides(plan, [rule]).concurrent == 3


# -- units ---------------------------------------------------------------------------

TOKENS = {"free": {"resources": {"ai_tokens": {"rate": "2000/hour", "unit": "tokens"}}}}


def test_quota_plans_unit_reaches_the_plan_and_its_export() -> None:
    """``{"rate": ..., "unit": "tokens"}`` gives the resource its unit; ``plans export``
    writes the same dict back, and a resource without one counts requests."""
    config = {
        "free": {
            "resources": {
                "ai_tokens": {"rate": "2000/hour", "unit": "tokens"},
                "search": "10/minute",
            }
        }
    }
    plan = catalog_from_config(config, upgrade_url="/")["free"]
    assert dict(plan.units) == {"ai_tokens": "tokens"}
    assert plan.unit_for("ai_tokens") == "tokens"
    assert plan.unit_for("search") == "requests"
    assert plan.unit_for("search", "credits") == "credits"  # the decorator's, if the plan has none
    assert plan.unit_for("ai_tokens", "credits") == "tokens"  # the plan's wins
    assert plan_config(plan) == config["free"]
    with pytest.raises(TypeError):
        plan.units["search"] = "bytes"  # type: ignore[index]


@pytest.mark.parametrize("unit", ["", "Tokens", "tokens!", "two  spaces", "x" * 33, 5])
def test_bad_units_name_the_plan_and_resource(unit: Any) -> None:
    """A unit is short lowercase words: anything else fails at configuration time with a
    message naming the plan, the resource and the rule."""
    config = {"free": {"resources": {"ai_tokens": {"rate": "2000/hour", "unit": unit}}}}
    with pytest.raises(ValueError) as error:
        catalog_from_config(config, upgrade_url="/")
    message = str(error.value)
    assert "QUOTA_PLANS['free']['resources']['ai_tokens']['unit']" in message
    assert "lowercase words" in message


def test_a_unit_on_a_tier_that_counts_requests_is_refused() -> None:
    """The user tier counts requests whatever the resource: a unit there is refused and
    the message says where a unit belongs."""
    with pytest.raises(ValueError, match="a unit belongs to a resource"):
        catalog_from_config(
            {"free": {"user": {"rate": "1/second", "unit": "tokens"}}}, upgrade_url="/"
        )


def test_a_plan_refuses_a_unit_for_a_resource_without_a_rate() -> None:
    """Units describe the plan's own resources: one for a resource it has no rate for is
    a mistake, and says so."""
    with pytest.raises(ValueError, match="'search', which has no rate"):
        Plan("free", resources={"ai": parse_rates("1/second")}, units={"search": "tokens"})


def test_the_built_in_plans_count_ai_tokens_in_tokens() -> None:
    """Every built-in plan's ``ai_tokens`` counts tokens."""
    catalog = catalog_from_config(DEFAULT_PLANS, upgrade_url="/")
    assert {name: plan.unit_for("ai_tokens") for name, plan in catalog.items()} == {
        "free": "tokens",
        "pro": "tokens",
        "enterprise": "tokens",
    }


def test_the_decorator_refuses_a_bad_unit(app: Flask) -> None:
    """``@quota.limit(unit=...)`` is checked when the view is decorated, not per request."""
    quota = Quota(app, storage=MemoryStorage())
    with pytest.raises(ValueError, match="unit 'Tokens' must be"):
        quota.limit("10/minute", unit="Tokens")


def _metered_app(app: Flask, clock: FrozenClock, plans: Any, unit: str | None) -> Flask:
    app.config["QUOTA_PLANS"] = plans
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.post("/chat")
    @quota.limit("100/hour", resource="ai_tokens", cost=60, unit=unit)
    def chat() -> str:
        return "ok"

    @app.get("/plain")
    def plain() -> str:
        return "ok"

    return app


def test_the_429_detail_counts_the_plans_unit(app: Flask, clock: FrozenClock) -> None:
    """On a resource whose plan counts tokens, the 429's detail says "2000 tokens per
    3600 s", not requests; the plan's unit wins over the decorator's."""
    client = _metered_app(app, clock, TOKENS, "credits").test_client()
    for _ in range(33):
        assert client.post("/chat").status_code == 200
    denied = client.post("/chat")
    assert denied.status_code == 429
    assert denied.json is not None
    assert "2000 tokens per 3600 s" in denied.json["detail"]


def test_the_429_detail_counts_the_decorators_unit(app: Flask, clock: FrozenClock) -> None:
    """A resource the plans do not rate counts the decorator's unit; a view without one
    counts requests, and so do the tiers that are not the endpoint's."""
    plans = {"free": {"user": "2/hour"}}
    client = _metered_app(app, clock, plans, "credits").test_client()
    assert client.post("/chat").status_code == 200
    denied = client.post("/chat")
    assert denied.json is not None and "100 credits per 3600 s" in denied.json["detail"]
    assert client.get("/plain").status_code == 200
    user = client.get("/plain")
    assert user.status_code == 429 and user.json is not None
    assert "User limit exceeded: 2 requests per 3600 s" in user.json["detail"]


def test_a_cost_above_capacity_names_the_unit(app: Flask, clock: FrozenClock) -> None:
    """A request whose cost can never fit says so in the resource's unit."""
    app.config["QUOTA_PLANS"] = {"free": {}}
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.post("/chat")
    @quota.limit("100/hour", resource="ai_tokens", cost=500, unit="tokens")
    def chat() -> str:
        return "ok"

    denied = app.test_client().post("/chat")
    assert denied.status_code == 429 and denied.json is not None
    assert "cost 500 exceeds the limit's capacity 100 tokens" in denied.json["detail"]


def test_usage_shows_the_decorators_unit(app: Flask, clock: FrozenClock) -> None:
    """`flask quota usage` names each bucket's unit: the decorator's for a resource the
    plan does not name one for, requests for the user tier."""
    _metered_app(app, clock, {"free": {"user": "5/hour"}}, "credits")
    app.test_client().post("/chat")
    result = app.test_cli_runner().invoke(args=["quota", "usage", "--ip", "127.0.0.1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()  # after memory storage's warning
    head = next(i for i, line in enumerate(lines) if line.startswith("TIER"))
    assert lines[head].split()[-1] == "UNIT"
    rows = {line.split()[0]: line for line in lines[head + 1 :] if line.strip()}
    assert rows["endpoint"].endswith("credits") and "40/100" in rows["endpoint"]
    assert rows["user"].endswith("requests")
    app.extensions["quota"].sql.close()
