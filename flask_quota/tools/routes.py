"""What limits each URL rule: the answer to "why did this get 429".

Pure: it takes the app's rules, a function giving each endpoint's exemption and
limits, and the plans, and returns rows; ``flask quota routes`` prints them. Every
route that is not exempt also counts on its plan's global, tenant and user tiers
(``plan_tiers``); a route's rows add its endpoint limits with each plan's rate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.plans import Plan
from ..core.policy import LimitSpec
from ..core.tiers import Tier

__all__ = ["LimitRow", "PlanTiers", "RouteRow", "as_json", "plan_tiers", "route_rows"]

# (endpoint, method) -> (why it is exempt, or None; its limits, in the order they are
# checked). A class-based view's methods may differ (``views.resolve``).
LimitsOf = Callable[[str, str], tuple[str | None, Sequence[LimitSpec]]]
# (endpoint, method, its limits) -> its class with overload protection on.
PriorityOf = Callable[[str, str, Sequence[LimitSpec]], str]


class Rule(Protocol):
    """What is read of a Werkzeug ``Rule``."""

    @property
    def rule(self) -> str: ...

    @property
    def endpoint(self) -> str: ...

    @property
    def methods(self) -> Iterable[str] | None: ...


@dataclass(frozen=True)
class PlanTiers:
    """The tiers of one plan that every route not exempt counts on."""

    plan: str
    global_rate: str | None  # per IP
    tenant: str | None  # shared by the callers of a tenant
    user: str | None  # per caller
    concurrent: int | None  # in flight per caller, when the plan sets it


@dataclass(frozen=True)
class LimitRow:
    """One endpoint limit: what the decorator says, and the rate each plan gives it."""

    resource: str
    rate: str | None  # the decorator's literal rate, "callable", or None (plans only)
    cost: int | str  # an int, or "callable"
    key: bool  # key=: the bucket belongs to what key() names, not to the caller
    per_method: bool
    charge_when: bool
    exempt_when: bool
    concurrent: int | None
    plans: Mapping[str, str | None]  # plan -> the rates it enforces here; None: no limit

    @property
    def flags(self) -> tuple[str, ...]:
        """The options that change how the limit counts, as the decorator spells them."""
        found = [
            name
            for name, on in (
                ("key=", self.key),
                ("per_method=False", not self.per_method),
                ("charge_when", self.charge_when),
                ("exempt_when", self.exempt_when),
            )
            if on
        ]
        if self.concurrent is not None:
            found.append(f"concurrent={self.concurrent}")
        return tuple(found)


@dataclass(frozen=True)
class RouteRow:
    rule: str
    methods: tuple[str, ...]  # without HEAD (counted as GET) and the exempt methods
    endpoint: str
    exempt: str | None  # why no tier applies (then ``limits`` is empty)
    limits: tuple[LimitRow, ...]
    priority: str | None = None  # its class with overload protection on (None: off)


def plan_tiers(catalog: Mapping[str, Plan]) -> list[PlanTiers]:
    """Every plan's caller tiers, in upgrade order."""
    return [
        PlanTiers(
            plan.name,
            _rates(plan, Tier.GLOBAL, plan.global_rate),
            _rates(plan, Tier.TENANT, plan.tenant_rate),
            _rates(plan, Tier.USER, plan.user_rate),
            plan.concurrent,
        )
        for plan in catalog.values()
    ]


def route_rows(
    rules: Iterable[Rule],
    limits_of: LimitsOf,
    catalog: Mapping[str, Plan],
    exempt_methods: Iterable[str] = ("OPTIONS",),
    priority_of: PriorityOf | None = None,
) -> list[RouteRow]:
    """One row per URL rule, sorted by rule then endpoint; a rule whose methods differ
    (a class-based view's methods with limits or classes of their own) has one row per
    group of methods alike. ``priority_of``: each route's class, with overload
    protection on."""
    skipped = {"HEAD", *exempt_methods}
    rows = []
    for rule in rules:
        groups: dict[tuple[int, str | None], tuple[list[str], str | None, Sequence[LimitSpec]]]
        groups = {}
        classes: dict[tuple[int, str | None], str | None] = {}
        for method in sorted(set(rule.methods or ()) - skipped) or ["-"]:
            exempt, specs = limits_of(rule.endpoint, method)
            cls = None
            if priority_of is not None and not exempt:
                cls = priority_of(rule.endpoint, method, specs)
            # Methods share a row when their answer is the same object (a view's common
            # limits), so a class's methods without limits of their own are one row.
            key = (id(specs) if not exempt else hash(exempt), cls)
            groups.setdefault(key, ([], exempt, specs))[0].append(method)
            classes[key] = cls
        for key, (methods, exempt, specs) in groups.items():
            limits = () if exempt else tuple(_limit(s, rule.endpoint, catalog) for s in specs)
            shown = tuple(m for m in methods if m != "-")
            rows.append(RouteRow(rule.rule, shown, rule.endpoint, exempt, limits, classes[key]))
    return sorted(rows, key=lambda row: (row.rule, row.endpoint, row.methods))


def as_json(rows: Sequence[RouteRow], tiers: Sequence[PlanTiers]) -> dict[str, Any]:
    """The ``--json`` document: every plan's tiers, then every route."""
    return {
        "plans": {
            t.plan: {
                "global": t.global_rate,
                "tenant": t.tenant,
                "user": t.user,
                "concurrent": t.concurrent,
            }
            for t in tiers
        },
        "routes": [
            {
                "rule": row.rule,
                "methods": list(row.methods),
                "endpoint": row.endpoint,
                "exempt": row.exempt,
                # With overload protection on: the route's class.
                **({"priority": row.priority} if row.priority is not None else {}),
                "limits": [
                    {
                        "resource": limit.resource,
                        "rate": limit.rate,
                        "cost": limit.cost,
                        "key": limit.key,
                        "per_method": limit.per_method,
                        "charge_when": limit.charge_when,
                        "exempt_when": limit.exempt_when,
                        "concurrent": limit.concurrent,
                        "plans": dict(limit.plans),
                    }
                    for limit in row.limits
                ],
            }
            for row in rows
        ],
    }


def _limit(spec: LimitSpec, endpoint: str, catalog: Mapping[str, Plan]) -> LimitRow:
    # The resource the enforcer keys the bucket by: the endpoint when none is named.
    resource = spec.resource or endpoint
    rate: Any = spec.rate
    # A callable rate is asked per request (``rate_of``): only its nature is known here.
    literal = "callable" if spec.rate_of is not None else None if rate is None else str(rate)
    plans = {}
    for plan in catalog.values():
        # As the policy decides: the plan's rate for the resource wins over the literal.
        own = plan.resources.get(resource)
        plans[plan.name] = _rates(plan, Tier.ENDPOINT, own, resource) if own else literal
    cost = spec.cost
    return LimitRow(
        resource=resource,
        rate=literal,
        cost="callable" if callable(cost) else cost,
        key=spec.key is not None,
        per_method=spec.per_method,
        charge_when=spec.charge_when is not None,
        exempt_when=spec.exempt_when is not None,
        concurrent=spec.concurrent,
        plans=plans,
    )


def _rates(plan: Plan, tier: Tier, rates: object, resource: str | None = None) -> str | None:
    """A plan limit's rates as text; marked when the limit is shadow (it never denies)."""
    if rates is None:
        return None
    text = str(rates)
    return f"{text} (shadow)" if plan.mode_for(tier, resource).shadow else text
