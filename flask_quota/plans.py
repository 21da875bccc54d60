"""Plans: named sets of rates per tier and resource, and the upgrade hint of a 429."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .rates import Rate, Rates, parse_rates
from .tiers import Tier

__all__ = ["DEFAULT_PLANS", "Plan", "PlanCatalog", "catalog_from_config"]


@dataclass(frozen=True)
class Plan:
    """Rates of one plan. A tier without a rate does not apply to the plan.

    Each tier and resource holds ``Rates`` (one or more); a single ``Rate``
    given here is taken as ``Rates`` of one.
    """

    name: str
    global_rate: Rates | None = None
    user_rate: Rates | None = None
    resources: Mapping[str, Rates] = field(default_factory=dict)
    description: str = ""
    upgrade: str | None = None  # overrides the generated hint in 429 bodies

    def __post_init__(self) -> None:
        for name in ("global_rate", "user_rate"):
            value: Rate | Rates | None = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_rates(value))
        if any(not isinstance(r, Rates) for r in self.resources.values()):
            resources = {k: parse_rates(v) for k, v in self.resources.items()}
            object.__setattr__(self, "resources", resources)

    def rate_for(self, tier: Tier, resource: str | None = None) -> Rates | None:
        if tier is Tier.GLOBAL:
            return self.global_rate
        if tier is Tier.USER:
            return self.user_rate
        return self.resources.get(resource) if resource else None


class PlanCatalog(Mapping[str, Plan]):
    """Plans in upgrade order (cheapest first), with a fallback plan."""

    def __init__(self, plans: list[Plan], *, upgrade_url: str = "/pricing") -> None:
        if not plans:
            raise ValueError("a plan catalog needs at least one plan")
        self._plans = {plan.name: plan for plan in plans}
        self._order = [plan.name for plan in plans]
        self.upgrade_url = upgrade_url

    def __getitem__(self, name: str) -> Plan:
        return self._plans[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def resolve(self, plan: str, identity_id: str | None, *, fallback: str) -> Plan:
        """The plan that applies to a caller: ``plan``, else ``fallback``.

        A catalog that knows per-client overrides (the SQL store) returns the
        plan with them applied; this one has none.
        """
        return self._plans.get(plan) or self._plans[fallback]

    def client_plan(self, client_id: str) -> str | None:
        """The plan of a known API client; a catalog without clients knows none."""
        return None

    def upgrade_hint(self, plan: str, tier: Tier, resource: str | None) -> str | None:
        """``"Pro raises this to 30 per minute: see /pricing"``, or the plan's own text."""
        current = self._plans.get(plan)
        if current is not None and current.upgrade:
            return current.upgrade
        mine = current.rate_for(tier, resource) if current else None
        later = self._order[self._order.index(plan) + 1 :] if plan in self._plans else []
        for name in later:
            theirs = self._plans[name].rate_for(tier, resource)
            if theirs is not None and (mine is None or theirs.per_second > mine.per_second):
                return f"{name.capitalize()} raises this to {theirs.per()}: see {self.upgrade_url}"
        return None


# The seed's table (SPEC section 2), plus an ``ai_tokens`` budget metered after the fact.
DEFAULT_PLANS: dict[str, dict[str, Any]] = {
    "free": {
        "global": "50/second",
        "user": "100/minute",
        "resources": {
            "ai_inference": "5/minute",
            "bulk_search": "10/minute",
            "ai_tokens": "2000/hour",  # metered with quota.charge (the demo's /v1/ai/chat)
        },
    },
    "pro": {
        "global": "50/second",
        "user": "500/minute",
        "resources": {
            "ai_inference": "30/minute",
            "bulk_search": "60/minute",
            "ai_tokens": "20000/hour",
        },
    },
    "enterprise": {
        "global": "200/second",
        "user": "2000/minute",
        "resources": {
            "ai_inference": "120/minute",
            "bulk_search": "300/minute",
            "ai_tokens": "100000/hour",
        },
    },
}


def catalog_from_config(config: Mapping[str, Any], *, upgrade_url: str) -> PlanCatalog:
    """Build plans from a ``QUOTA_PLANS``-style dict; errors name the plan and field."""
    if not isinstance(config, Mapping) or not config:
        raise ValueError("QUOTA_PLANS must be a non-empty dict of plan name -> settings")
    plans = []
    for name, spec in config.items():
        where = f"QUOTA_PLANS[{name!r}]"
        if not isinstance(name, str) or not name or not isinstance(spec, Mapping):
            raise ValueError(f"{where} must map a plan name to a dict")
        unknown = set(spec) - {"global", "user", "resources", "description", "upgrade"}
        if unknown:
            raise ValueError(f"{where} has unknown fields {sorted(unknown)}")
        try:
            resources = {str(k): parse_rates(v) for k, v in dict(spec.get("resources", {})).items()}
            plans.append(
                Plan(
                    name,
                    parse_rates(spec["global"]) if spec.get("global") else None,
                    parse_rates(spec["user"]) if spec.get("user") else None,
                    resources,
                    str(spec.get("description", "")),
                    spec.get("upgrade"),
                )
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    return PlanCatalog(plans, upgrade_url=upgrade_url)
