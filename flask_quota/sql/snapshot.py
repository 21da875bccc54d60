"""An immutable in-memory copy of the SQL quota tables: what a request reads.

A ``SqlCatalog`` is built in one go from the database (``store.py``) and
swapped in whole when the tables change, so a request reads plans, API keys
and overrides without a query and without a lock. No SQL or Flask here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from ..core.identity import Identity
from ..core.plans import Plan, PlanCatalog
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
    """``plan`` with each rule's rate in place of the plan's own (the name stays)."""
    global_rate, user_rate, resources = plan.global_rate, plan.user_rate, dict(plan.resources)
    for rule in rules:
        if rule.tier is Tier.GLOBAL:
            global_rate = rule.rate
        elif rule.tier is Tier.USER:
            user_rate = rule.rate
        else:
            resources[rule.resource] = rule.rate
    return replace(plan, global_rate=global_rate, user_rate=user_rate, resources=resources)


class SqlCatalog(PlanCatalog):
    """Plans, API keys and per-client overrides as of one database ``version``.

    ``resolve`` applies the caller's unexpired overrides; expiry is checked
    against ``clock`` at request time, so an override ends on time without a reload.
    """

    def __init__(
        self,
        plans: list[Plan],
        *,
        upgrade_url: str = "/pricing",
        version: int = 0,
        keys: Mapping[str, tuple[KeyEntry, ...]] | None = None,
        overrides: Mapping[str, tuple[OverrideRule, ...]] | None = None,
        clients: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(plans, upgrade_url=upgrade_url)
        self.version = version
        self._keys = dict(keys or {})  # display prefix -> candidates
        self._overrides = dict(overrides or {})  # client id -> rules
        self._clients = dict(clients or {})  # live client id -> plan name
        self._clock = clock
        # (plan, client) -> (plan with overrides, valid until): one Plan per
        # client rather than one per request; it expires with the next override.
        self._resolved: dict[tuple[str, str], tuple[Plan, float]] = {}

    def resolve(self, plan: str, identity_id: str | None, *, fallback: str) -> Plan:
        base = self._plans.get(plan) or self._plans.get(fallback) or self._plans[self._order[0]]
        rules = self._overrides.get(identity_id) if identity_id is not None else None
        if identity_id is None or not rules:
            return base
        now = self._clock()
        cached = self._resolved.get((base.name, identity_id))
        if cached is not None and now < cached[1]:
            return cached[0]
        live = [rule for rule in rules if rule.live(now)]
        upcoming = [r.expires_at for r in live if r.expires_at is not None]
        resolved = apply_overrides(base, live) if live else base
        self._resolved[(base.name, identity_id)] = (resolved, min(upcoming, default=math.inf))
        return resolved

    def identify(self, api_key: str) -> Identity | None:
        """The client whose key this is, or ``None`` (unknown or revoked)."""
        for entry in self._keys.get(apikeys.prefix_of(api_key), ()):
            if apikeys.matches(api_key, entry.salt, entry.hash):
                return Identity(entry.client_id, entry.plan)
        return None

    def client_plan(self, client_id: str) -> str | None:
        """The plan of a live client, or ``None``."""
        return self._clients.get(client_id)
