"""An immutable in-memory copy of the SQL quota tables: what a request reads.

A ``SqlCatalog`` is built in one go from the database (``store.py``) and
swapped in whole when the tables change, so a request reads plans, API keys
and overrides without a query and without a lock. No SQL or Flask here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..core.generations import Generations
from ..core.identity import Identity
from ..core.networks import NetworkRules
from ..core.plans import Limit, Plan, PlanCatalog
from ..core.rates import Rate, Rates, parse_rates
from ..core.tiers import Tier
from . import apikeys

__all__ = ["KeyEntry", "OverrideRule", "SqlCatalog", "apply_overrides"]


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """A live (not revoked) client's key hash and the identity it stands for."""

    client_id: str
    plan: str
    salt: str
    hash: str
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class OverrideRule:
    """A client's own rate for a tier (``resource`` names the endpoint tier's resource)."""

    tier: Tier
    resource: str
    rate: Rates  # a single ``Rate`` given here is taken as ``Rates`` of one
    expires_at: float | None = None  # Unix seconds; None: until removed

    def __post_init__(self) -> None:
        rate: Rate | Rates = self.rate
        if not isinstance(rate, Rates):
            object.__setattr__(self, "rate", parse_rates(rate))

    def live(self, now: float) -> bool:
        """True until the override's expiry (Unix seconds ``now``)."""
        return self.expires_at is None or now < self.expires_at


def apply_overrides(plan: Plan, rules: Iterable[OverrideRule]) -> Plan:
    """``plan`` with each rule's rate in place of the plan's own (the name stays; a
    later rule for the same tier and resource wins). Each limit keeps its mode, and the
    plan its other fields."""
    limits = list(plan.limits())
    for rule in rules:
        mode = plan.mode_for(rule.tier, rule.resource or None)
        limits.append(Limit(rule.tier, rule.resource, rule.rate, mode))
    return Plan.of(
        plan.name,
        limits,
        description=plan.description,
        upgrade=plan.upgrade,
        concurrent=plan.concurrent,
        units=plan.units,
        upgrades=plan.upgrades,
    )


class SqlCatalog(PlanCatalog):
    """Plans, API keys, clients, overrides and network rules as of one database ``version``.

    ``resolve`` applies the caller's unexpired overrides: its tenant's, then its own
    (which win); expiry is checked against ``clock`` at request time, so an override
    ends on time without a reload.
    """

    def __init__(
        self,
        plans: list[Plan],
        *,
        upgrade_url: str = "/pricing",
        version: int = 0,
        keys: Mapping[str, tuple[KeyEntry, ...]] | None = None,
        overrides: Mapping[str, tuple[OverrideRule, ...]] | None = None,
        tenant_overrides: Mapping[str, tuple[OverrideRule, ...]] | None = None,
        clients: Mapping[str, str] | None = None,
        client_tenants: Mapping[str, str] | None = None,
        billing_days: Mapping[str, int] | None = None,
        networks: NetworkRules | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(plans, upgrade_url=upgrade_url)
        self.version = version
        # Operators' network rules (``quota_networks``); None when there are none, so the
        # request edge pays one attribute check (``SqlStore.networks``).
        self.networks = networks
        self._keys = dict(keys or {})  # display prefix -> candidates
        self._overrides = dict(overrides or {})  # client id -> rules
        self._tenant_overrides = dict(tenant_overrides or {})  # tenant -> rules
        self._clients = dict(clients or {})  # live client id -> plan name
        self._client_tenants = dict(client_tenants or {})  # live client id -> its tenant
        self._billing_days = dict(billing_days or {})  # live client id -> its own day
        self._clock = clock
        # (plan, client, tenant) -> (plan with overrides, valid until): one Plan per
        # client rather than one per request; it expires with the next override. Bounded:
        # an identity loader may name any number of callers of an overridden tenant.
        self._resolved: Generations[tuple[str, str | None, str | None], tuple[Plan, float]] = (
            Generations(4096)
        )

    def resolve(
        self, plan: str, identity_id: str | None, *, fallback: str, tenant: str | None = None
    ) -> Plan:
        base = self._plans.get(plan) or self._plans.get(fallback) or self._plans[self._order[0]]
        own = self._overrides.get(identity_id, ()) if identity_id is not None else ()
        shared = self._tenant_overrides.get(tenant, ()) if tenant is not None else ()
        if not own and not shared:
            return base
        now = self._clock()
        key = (base.name, identity_id, tenant)
        cached = self._resolved.current.get(key) or self._resolved.recall(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        live = [rule for rule in (*shared, *own) if rule.live(now)]
        upcoming = [r.expires_at for r in live if r.expires_at is not None]
        resolved = apply_overrides(base, live) if live else base
        self._resolved.put(key, (resolved, min(upcoming, default=math.inf)))
        return resolved

    def identify(self, api_key: str) -> Identity | None:
        """The client whose key this is, or ``None`` (unknown or revoked)."""
        for entry in self._keys.get(apikeys.prefix_of(api_key), ()):
            if apikeys.matches(api_key, entry.salt, entry.hash):
                return Identity(entry.client_id, entry.plan, entry.tenant)
        return None

    def client_tenant(self, client_id: str) -> str | None:
        """The tenant of a live client, or ``None``."""
        return self._client_tenants.get(client_id)

    def billing_day(self, identity_id: str) -> int | None:
        """A live client's own billing day, or ``None`` (``QUOTA_BILLING_DAY``)."""
        return self._billing_days.get(identity_id)

    def client_plan(self, client_id: str) -> str | None:
        """The plan of a live client, or ``None``."""
        return self._clients.get(client_id)
