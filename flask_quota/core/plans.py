"""Plans: named sets of rates per tier and resource, and the upgrade hint of a 429."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from . import validators
from .algorithms import Algorithm, unfit
from .rates import Credits, Rate, Rates, parse_rates
from .tiers import Tier
from .validators import DEFAULT_UNIT

__all__ = [
    "DEFAULT_PLANS",
    "ENFORCED",
    "UPGRADE_KINDS",
    "Limit",
    "LimitMode",
    "Plan",
    "PlanCatalog",
    "catalog_from_config",
    "check_fit",
    "plan_config",
    "plans_config",
]


UPGRADE_KINDS = (Tier.CONCURRENT.value, Tier.CREDITS.value)
"""The denials besides the rates' whose upgrade text a plan may give (``Plan.upgrades``)."""


@dataclass(frozen=True, slots=True)
class LimitMode:
    """How one plan limit is applied, besides its rates."""

    algorithm: Algorithm | None = None  # None: QUOTA_ALGORITHM
    shadow: bool = False  # decided and recorded, never denies

    @property
    def default(self) -> bool:
        """True when nothing differs from an enforced limit on ``QUOTA_ALGORITHM``."""
        return self.algorithm is None and not self.shadow


ENFORCED = LimitMode()


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit of a plan, the one shape every plan is read and built in: its tier,
    its resource (``""`` for global and user, which cover every resource), its rates
    and how they apply."""

    tier: Tier
    resource: str
    rates: Rates
    mode: LimitMode = ENFORCED


@dataclass(frozen=True)
class Plan:
    """Rates of one plan. A tier without a rate does not apply to the plan.

    Each tier and resource holds ``Rates`` (one or more); a single ``Rate``
    given here is taken as ``Rates`` of one. ``modes`` holds each limit's
    ``LimitMode`` by ``(tier, resource)`` (``("user", "")``,
    ``("endpoint", "search")``); a limit missing there is enforced on
    ``QUOTA_ALGORITHM``. ``concurrent``: at most that many requests of one caller in
    flight at once, across every endpoint (``None``: no such bound). A plan is a
    value: ``resources`` and ``modes`` are read-only copies of what it was given
    (``dataclasses.replace`` makes another), and so is ``units``: what each resource
    counts (``{"ai_tokens": "tokens"}``).
    """

    name: str
    global_rate: Rates | None = None
    user_rate: Rates | None = None
    resources: Mapping[str, Rates] = field(default_factory=dict)
    description: str = ""
    upgrade: str | None = None  # overrides the generated hint in 429 bodies
    modes: Mapping[tuple[str, str], LimitMode] = field(default_factory=dict)
    # Last, so that positional construction from the other fields keeps working.
    tenant_rate: Rates | None = None
    concurrent: int | None = None
    # resource -> what it counts ("tokens"); a resource missing here counts the
    # decorator's unit, else requests.
    units: Mapping[str, str] = field(default_factory=dict)
    # The upgrade text of a denial that is not a rate's: "concurrent" or "credits" ->
    # text (``upgrade`` is about the rates; ``errors.upgrade_for`` is the rule).
    upgrades: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("global_rate", "user_rate", "tenant_rate"):
            value: Rate | Rates | None = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_rates(value))
                if isinstance(getattr(self, name), Credits):
                    tier = name.removesuffix("_rate")
                    raise ValueError(
                        f"the {tier} tier cannot be 'credits': a prepaid balance is a "
                        "resource's, e.g. {'resources': {'ai_tokens': 'credits'}}"
                    )
        unknown = set(self.upgrades) - set(UPGRADE_KINDS)
        if unknown:
            raise ValueError(
                f"upgrade texts for {sorted(unknown)}: a plan's upgrade may name "
                f"{', '.join(('rates', *UPGRADE_KINDS))}"
            )
        object.__setattr__(self, "upgrades", MappingProxyType(dict(self.upgrades)))
        if self.concurrent is not None:
            validators.concurrency(self.concurrent)
        # Copies behind read-only views: a plan is a value (requests cache what they
        # derive from it by identity, see route.py), so editing the dicts it was made
        # from, or its own, must not change it.
        resources = {k: parse_rates(v) for k, v in self.resources.items()}
        object.__setattr__(self, "resources", MappingProxyType(resources))
        object.__setattr__(self, "modes", MappingProxyType(dict(self.modes)))
        for resource, unit in self.units.items():
            validators.unit_name(unit)
            if resource not in resources:
                raise ValueError(f"unit {unit!r} for resource {resource!r}, which has no rate")
        object.__setattr__(self, "units", MappingProxyType(dict(self.units)))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled and deep-copied through plain dicts: a mappingproxy is neither.
        values = (getattr(self, f.name) for f in fields(self))
        return (Plan, tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values))

    @classmethod
    def of(
        cls,
        name: str,
        limits: Iterable[Limit],
        *,
        description: str = "",
        upgrade: str | None = None,
        concurrent: int | None = None,
        units: Mapping[str, str] | None = None,
        upgrades: Mapping[str, str] | None = None,
    ) -> Plan:
        """The plan of ``limits``, keyed by tier and resource (a later one for the same
        key wins): the inverse of ``limits()``, with the plan's other fields."""
        rates: dict[tuple[str, str], Rates] = {}
        modes: dict[tuple[str, str], LimitMode] = {}
        for limit in limits:
            key = (limit.tier.value, limit.resource if limit.tier is Tier.ENDPOINT else "")
            rates[key] = limit.rates
            modes.pop(key, None)
            if not limit.mode.default:
                modes[key] = limit.mode
        endpoint = Tier.ENDPOINT.value
        return cls(
            name,
            rates.get((Tier.GLOBAL.value, "")),
            rates.get((Tier.USER.value, "")),
            {resource: r for (tier, resource), r in rates.items() if tier == endpoint},
            description,
            upgrade,
            modes,
            rates.get((Tier.TENANT.value, "")),
            concurrent,
            dict(units or {}),
            dict(upgrades or {}),
        )

    def limits(self) -> tuple[Limit, ...]:
        """Every limit of the plan with its mode: global, tenant, user, then each resource."""
        tiers = (
            (Tier.GLOBAL, self.global_rate),
            (Tier.TENANT, self.tenant_rate),
            (Tier.USER, self.user_rate),
        )
        found = [
            Limit(tier, "", rates, self.mode_for(tier))
            for tier, rates in tiers
            if rates is not None
        ]
        found += [
            Limit(Tier.ENDPOINT, resource, rates, self.mode_for(Tier.ENDPOINT, resource))
            for resource, rates in self.resources.items()
        ]
        return tuple(found)

    def rate_for(self, tier: Tier, resource: str | None = None) -> Rates | None:
        if tier is Tier.GLOBAL:
            return self.global_rate
        if tier is Tier.USER:
            return self.user_rate
        if tier is Tier.TENANT:
            return self.tenant_rate
        return self.resources.get(resource) if resource else None

    def unit_for(self, resource: str | None, default: str | None = None) -> str:
        """What ``resource`` counts: the plan's unit for it, else ``default`` (the
        decorator's), else requests. The plan wins, as its rates do."""
        return (self.units.get(resource) if resource else None) or default or DEFAULT_UNIT

    def mode_for(self, tier: Tier, resource: str | None = None) -> LimitMode:
        """The algorithm and shadow flag of one limit (enforced, ``QUOTA_ALGORITHM``, if unset)."""
        key = (tier.value, (resource or "") if tier is Tier.ENDPOINT else "")
        return self.modes.get(key, ENFORCED)


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

    def resolve(
        self, plan: str, identity_id: str | None, *, fallback: str, tenant: str | None = None
    ) -> Plan:
        """The plan that applies to a caller: ``plan``, else ``fallback``.

        A catalog that knows per-client and per-tenant overrides (the SQL store)
        returns the plan with them applied; this one has none.
        """
        return self._plans.get(plan) or self._plans[fallback]

    def client_tenant(self, client_id: str) -> str | None:
        """The tenant of a known API client; a catalog without clients knows none."""
        return None

    def billing_day(self, identity_id: str) -> int | None:
        """A caller's own day for ``N/month`` resets; ``None``: ``QUOTA_BILLING_DAY``."""
        return None

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
            if isinstance(theirs, Credits):
                continue  # a balance is not "more" of a rate
            if theirs is not None and (mine is None or theirs.per_second > mine.per_second):
                return f"{name.capitalize()} raises this to {theirs.per()}: see {self.upgrade_url}"
        return None


# The default plans (the README's plan table), plus an ``ai_tokens`` budget metered after
# the fact.
DEFAULT_PLANS: dict[str, dict[str, Any]] = {
    "free": {
        "global": "50/second",
        "user": "100/minute",
        "resources": {
            "ai_inference": "5/minute",
            "bulk_search": "10/minute",
            # Metered with quota.charge (the demo's /v1/ai/chat): it counts tokens.
            "ai_tokens": {"rate": "2000/hour", "unit": "tokens"},
        },
    },
    "pro": {
        "global": "50/second",
        "user": "500/minute",
        "resources": {
            "ai_inference": "30/minute",
            "bulk_search": "60/minute",
            "ai_tokens": {"rate": "20000/hour", "unit": "tokens"},
        },
    },
    "enterprise": {
        "global": "200/second",
        "user": "2000/minute",
        "resources": {
            "ai_inference": "120/minute",
            "bulk_search": "300/minute",
            "ai_tokens": {"rate": "100000/hour", "unit": "tokens"},
        },
    },
}


def check_fit(rates: Rates, algorithm: Algorithm, where: str, *, default: bool = False) -> None:
    """Raise ``ValueError`` naming ``where`` when ``algorithm`` cannot enforce one of
    ``rates`` (``algorithms.unfit``). ``default``: the algorithm is ``QUOTA_ALGORITHM``,
    not the limit's own, and the message says how to give the limit one of its own."""
    for rate in rates:
        reason = unfit(algorithm, rate)
        if reason is None:
            continue
        if default:
            own = {"rate": str(rates), "algorithm": Algorithm.SLIDING_WINDOW_COUNTER.value}
            reason += (
                f" (it has no algorithm of its own, so QUOTA_ALGORITHM={algorithm.value!r} "
                f"applies: give it one, e.g. {own})"
            )
        raise ValueError(f"{where}: {reason}")


def catalog_from_config(
    config: Mapping[str, Any], *, upgrade_url: str, algorithm: Algorithm | None = None
) -> PlanCatalog:
    """Build plans from a ``QUOTA_PLANS``-style dict; errors name the plan and field.

    Each tier or resource is a rate text (``"100/minute"``, ``"10/second, 1000/day"``)
    or a dict ``{"rate": ..., "algorithm": "fixed_window", "shadow": true}``. A limit's
    own algorithm must fit its rates (``check_fit``); so must ``algorithm``
    (``QUOTA_ALGORITHM``), when given, for the limits without one.
    """
    if not isinstance(config, Mapping) or not config:
        raise ValueError("QUOTA_PLANS must be a non-empty dict of plan name -> settings")
    plans = []
    for name, spec in config.items():
        where = f"QUOTA_PLANS[{name!r}]"
        if not isinstance(name, str) or not name or not isinstance(spec, Mapping):
            raise ValueError(f"{where} must map a plan name to a dict")
        unknown = set(spec) - _PLAN_FIELDS
        if unknown:
            raise ValueError(f"{where} has unknown fields {sorted(unknown)}")
        raw_resources = spec.get("resources", {})
        if not isinstance(raw_resources, Mapping):
            raise ValueError(f"{where}['resources'] must be a dict of resource -> rate")
        entries = [
            (Tier.GLOBAL, "", spec.get("global")),
            (Tier.TENANT, "", spec.get("tenant")),
            (Tier.USER, "", spec.get("user")),
        ]
        entries += [(Tier.ENDPOINT, str(k), v) for k, v in raw_resources.items()]
        limits = []
        units = {}
        for tier, resource, value in entries:
            if not value:
                continue
            field_name = f"['resources'][{resource!r}]" if resource else f"[{tier.value!r}]"
            rates, mode, unit = _limit_entry(value, where + field_name, resource)
            if mode.algorithm is None and algorithm is not None:
                check_fit(rates, algorithm, where + field_name, default=True)
            limits.append(Limit(tier, resource, rates, mode))
            if unit is not None:
                units[resource] = unit
        upgrade, upgrades = _upgrade(spec.get("upgrade"), where)
        try:
            plans.append(
                Plan.of(
                    name,
                    limits,
                    description=str(spec.get("description", "")),
                    upgrade=upgrade,
                    upgrades=upgrades,
                    concurrent=_concurrent(spec.get("concurrent"), where),
                    units=units,
                )
            )
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    return PlanCatalog(plans, upgrade_url=upgrade_url)


_PLAN_FIELDS = {"global", "tenant", "user", "resources", "description", "upgrade", "concurrent"}


def _upgrade(value: Any, where: str) -> tuple[str | None, dict[str, str]]:
    """A plan's ``upgrade``: a text (about its rates), or a dict of texts by kind of
    denial, ``{"rates": ..., "concurrent": ..., "credits": ...}`` (``errors.upgrade_for``)."""
    if value is None or isinstance(value, str):
        return value, {}
    kinds = ("rates", *UPGRADE_KINDS)
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{where}['upgrade'] must be a text or a dict of texts by {kinds}")
    unknown = set(value) - set(kinds)
    if unknown:
        raise ValueError(f"{where}['upgrade'] has unknown kinds {sorted(unknown)}; use {kinds}")
    rates = value.get("rates")
    return rates, {k: v for k, v in value.items() if k != "rates"}


def _concurrent(value: Any, where: str) -> int | None:
    """A plan's ``concurrent``: a whole number of requests in flight, at least 1."""
    if value is None:
        return None
    try:
        return validators.concurrency(value)
    except ValueError as exc:
        raise ValueError(f"{where}['concurrent']: {exc}") from None


def _limit_entry(value: Any, where: str, resource: str) -> tuple[Rates, LimitMode, str | None]:
    """One tier's or resource's entry: a rate text, or a dict with ``rate``,
    ``algorithm``, ``shadow`` and (a resource's only) ``unit``."""
    if not isinstance(value, Mapping):
        try:
            return parse_rates(value), ENFORCED, None
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    allowed = ["rate", "algorithm", "shadow", *(["unit"] if resource else [])]
    unknown = set(value) - set(allowed)
    if unknown:
        # The global, tenant and user tiers count requests, whatever the resource.
        hint = "" if resource else " (a unit belongs to a resource: this tier counts requests)"
        raise ValueError(
            f"{where} has unknown fields {sorted(unknown)}; use {', '.join(allowed)}{hint}"
        )
    if "rate" not in value:
        raise ValueError(f"{where} needs a 'rate', e.g. {{'rate': '100/minute'}}")
    try:
        rates = parse_rates(value["rate"])
    except ValueError as exc:
        raise ValueError(f"{where}['rate']: {exc}") from None
    algorithm = value.get("algorithm")
    if algorithm is not None:
        try:
            algorithm = validators.algorithm(algorithm)
        except ValueError:
            raise ValueError(
                f"{where}['algorithm']={algorithm!r} is not an algorithm; use one of "
                f"{validators.ALGORITHM_NAMES} (or leave it out for QUOTA_ALGORITHM)"
            ) from None
        check_fit(rates, algorithm, where)
    shadow = value.get("shadow", False)
    if not isinstance(shadow, bool):
        raise ValueError(f"{where}['shadow']={shadow!r} must be true or false")
    unit = value.get("unit")
    if unit is not None:
        try:
            validators.unit_name(unit)
        except ValueError as exc:
            raise ValueError(f"{where}['unit']: {exc}") from None
    return rates, LimitMode(algorithm, shadow), unit


def _entry(rates: Rates, mode: LimitMode, unit: str | None = None) -> Any:
    """A limit in the ``QUOTA_PLANS`` shape: the rate text, or a dict when it has a mode
    or a unit."""
    if mode.default and unit is None:
        return str(rates)
    entry: dict[str, Any] = {"rate": str(rates)}
    if mode.algorithm is not None:
        entry["algorithm"] = mode.algorithm.value
    if mode.shadow:
        entry["shadow"] = True
    if unit is not None:
        entry["unit"] = unit
    return entry


def plan_config(plan: Plan) -> dict[str, Any]:
    """One plan in the ``QUOTA_PLANS`` shape (what ``plans export`` writes)."""
    spec: dict[str, Any] = {}
    for limit in plan.limits():
        entry = _entry(limit.rates, limit.mode, plan.units.get(limit.resource))
        if limit.tier is Tier.ENDPOINT:
            spec.setdefault("resources", {})[limit.resource] = entry
        else:
            spec[limit.tier.value] = entry
    if plan.description:
        spec["description"] = plan.description
    if plan.upgrades:
        spec["upgrade"] = {**({"rates": plan.upgrade} if plan.upgrade else {}), **plan.upgrades}
    elif plan.upgrade is not None:
        spec["upgrade"] = plan.upgrade
    if plan.concurrent is not None:
        spec["concurrent"] = plan.concurrent
    return spec


def plans_config(plans: Iterable[Plan]) -> dict[str, dict[str, Any]]:
    """Plans in the ``QUOTA_PLANS`` shape, in order."""
    return {plan.name: plan_config(plan) for plan in plans}
