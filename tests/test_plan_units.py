"""A plan's ``concurrent`` field and its resources' units, as QUOTA_PLANS gives them."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from flask_quota.core.plans import Plan, catalog_from_config, plan_config

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
    plan = Plan("pro", user_rate="5/second", concurrent=3)
    assert pickle.loads(pickle.dumps(plan)).concurrent == 3


def test_overrides_keep_the_plans_concurrent() -> None:
    """A client's overrides change its rates, not how many of its requests may be in
    flight: the overridden plan keeps ``concurrent``."""
    from flask_quota.core.rates import parse_rates
    from flask_quota.core.tiers import Tier
    from flask_quota.sql.snapshot import OverrideRule, apply_overrides

    plan = Plan("pro", user_rate="5/second", concurrent=3)
    rule = OverrideRule(Tier.USER, "", parse_rates("50/second"))
    assert apply_overrides(plan, [rule]).concurrent == 3
