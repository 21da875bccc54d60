"""Every conversion between a quota table's rows and the shapes the rest of the library uses.

Plans (``core.plans.Plan``) to rows and back, rows into the snapshot's entries
(``KeyEntry``, ``OverrideRule``), and rows into the operator's read-only views
(``PlanInfo``, ``ClientInfo``, ...) with their audit-log form. A column added to a
table is converted here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ..core import validators
from ..core.algorithms import Algorithm
from ..core.networks import NetworkRule, parse_network
from ..core.plans import Limit, LimitMode, Plan
from ..core.rates import Credits, Rates, parse_rates
from ..core.tiers import Tier
from .models import AuditEntry, Client, NetworkRecord, Override, PlanLimit, PlanRecord
from .snapshot import KeyEntry, OverrideRule

__all__ = [
    "AuditInfo",
    "ClientInfo",
    "LimitInfo",
    "NetworkInfo",
    "OverrideInfo",
    "PlanInfo",
    "audit_info",
    "client_dict",
    "client_info",
    "key_entry",
    "limit_rows",
    "network_dict",
    "network_info",
    "network_rule",
    "override_dict",
    "override_info",
    "override_rule",
    "plan_from_record",
    "plan_info",
    "plan_info_of",
    "plan_limits",
    "plan_record",
]

log = logging.getLogger("flask_quota")


# -- plans <-> rows -----------------------------------------------------------


def plan_record(plan: Plan, position: int) -> PlanRecord:
    """Rows for a configured plan (used to seed an empty plan table)."""
    record = PlanRecord(
        name=plan.name,
        description=plan.description,
        upgrade_hint=plan.upgrade,
        position=position,
        concurrent=plan.concurrent,
    )
    record.limits.extend(limit_rows(plan))
    return record


def limit_rows(plan: Plan) -> list[PlanLimit]:
    """New ``PlanLimit`` rows for every limit of ``plan``, with algorithm, shadow and unit."""
    rows = []
    for tier, resource, rates in plan_limits(plan):
        mode = plan.mode_for(tier, resource)
        algorithm = mode.algorithm.value if mode.algorithm is not None else None
        rows.append(
            PlanLimit(
                tier=tier.value,
                resource=resource,
                rate=str(rates),
                algorithm=algorithm,
                shadow=mode.shadow,
                unit=plan.units.get(resource) if resource else None,
            )
        )
    return rows


def plan_limits(plan: Plan) -> list[tuple[Tier, str, Rates]]:
    """(tier, resource or "", rates) of every limit of ``plan``."""
    return [(limit.tier, limit.resource, limit.rates) for limit in plan.limits()]


def plan_from_record(record: PlanRecord) -> Plan:
    """The ``Plan`` a row and its limits describe (with each limit's algorithm, shadow and
    unit, and the plan's concurrency)."""
    limits = []
    units = {}
    for row in record.limits:
        where = f"plan {record.name!r} {row.tier} {row.resource}"
        rate = _parse_stored(row.rate, where)
        if rate is None:
            continue
        try:
            tier = Tier(row.tier)
        except ValueError:
            log.error("flask-quota: ignoring %s: unknown tier", where)
            continue
        if isinstance(rate, Credits) and tier is not Tier.ENDPOINT:
            log.error("flask-quota: ignoring %s: 'credits' is a resource's, not a tier's", where)
            continue
        mode = LimitMode(_stored_algorithm(row.algorithm, where), bool(row.shadow))
        limits.append(Limit(tier, row.resource, rate, mode))
        unit = _stored_unit(row.unit, where) if tier is Tier.ENDPOINT else None
        if unit is not None:
            units[row.resource] = unit
    return Plan.of(
        record.name,
        limits,
        description=record.description or "",
        upgrade=record.upgrade_hint,
        concurrent=_stored_concurrent(record.concurrent, record.name),
        units=units,
    )


def _stored_unit(unit: str | None, where: str) -> str | None:
    # Validated on write; a unit edited by hand into nonsense counts requests again.
    if unit is None:
        return None
    try:
        return validators.unit_name(unit)
    except ValueError as exc:
        log.error("flask-quota: %s: %s; counting requests", where, exc)
        return None


def _stored_concurrent(value: int | None, plan: str) -> int | None:
    # The table's CHECK refuses a bound below 1; a value of another type is ignored.
    if value is None:
        return None
    try:
        return validators.concurrency(value)
    except ValueError as exc:
        log.error("flask-quota: plan %r: ignoring concurrent: %s", plan, exc)
        return None


def _stored_algorithm(name: str | None, where: str) -> Algorithm | None:
    # Validated on write; a row edited by hand into nonsense falls back to QUOTA_ALGORITHM.
    if name is None:
        return None
    try:
        return Algorithm(name)
    except ValueError:
        log.error("flask-quota: %s has unknown algorithm %r; using QUOTA_ALGORITHM", where, name)
        return None


def override_rule(row: Override) -> OverrideRule | None:
    """The snapshot's rule for an override row; ``None`` for a rate edited into nonsense."""
    rate = _parse_stored(row.rate, f"override {row.id}")
    if rate is None:
        return None
    expires = row.expires_at.timestamp() if row.expires_at is not None else None
    return OverrideRule(Tier(row.tier), row.resource, rate, expires)


def _parse_stored(text_: str, what: str) -> Rates | None:
    # Rates are validated on write; a row edited by hand into nonsense is skipped, not fatal.
    try:
        return parse_rates(text_)
    except ValueError as exc:
        log.error("flask-quota: ignoring %s: %s", what, exc)
        return None


def network_rule(cidr: str, action: str, expires_at: datetime | None) -> NetworkRule | None:
    """The snapshot's rule for a network row; ``None`` for a row edited into nonsense."""
    try:
        network = parse_network(cidr)
        return NetworkRule(network, action, expires_at.timestamp() if expires_at else None)
    except ValueError as exc:
        log.error("flask-quota: ignoring network rule %r: %s", cidr[:60], exc)
        return None


def key_entry(
    client_id: int, plan: str, salt: str, digest: str, tenant: str | None = None
) -> KeyEntry:
    """The snapshot's entry for a live client's key (its row's id, plan name, hash and
    tenant)."""
    return KeyEntry(str(client_id), plan, salt, digest, tenant)


# -- rows -> the operator's views -----------------------------------------------


@dataclass(frozen=True)
class LimitInfo:
    tier: str
    resource: str
    rate: str
    algorithm: str | None
    shadow: bool
    unit: str | None = None  # an endpoint row's: what its resource counts (None: requests)


@dataclass(frozen=True)
class PlanInfo:
    name: str
    description: str
    upgrade_hint: str | None
    limits: tuple[LimitInfo, ...]
    concurrent: int | None = None  # requests of one caller in flight at once (None: no bound)

    @property
    def token(self) -> str:
        """A fingerprint of this state of the plan. A form shows it and sends it back as
        ``based_on``: an edit based on a state someone changed since is refused
        (``StaleEdit``) instead of silently overwriting their change."""
        raw = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ClientInfo:
    id: int
    name: str
    plan: str
    key_prefix: str
    created_at: datetime
    revoked_at: datetime | None
    tenant: str | None = None
    billing_day: int | None = None  # None: QUOTA_BILLING_DAY


@dataclass(frozen=True)
class OverrideInfo:
    id: int
    client_id: int | None  # None: a tenant's override
    tier: str
    resource: str
    rate: str
    expires_at: datetime | None
    tenant: str | None = None

    @property
    def target(self) -> str:
        """What the override is aimed at, as the audit log names it."""
        return f"tenant:{self.tenant}" if self.client_id is None else f"client:{self.client_id}"


@dataclass(frozen=True)
class NetworkInfo:
    """An operator's network rule as listed: its normalised CIDR, ``deny`` or ``allow``,
    why, when and by whom it was set, and when it ends (None: until removed)."""

    id: int
    cidr: str
    action: str
    reason: str
    created_at: datetime
    created_by: str
    expires_at: datetime | None

    @property
    def target(self) -> str:
        """The rule as the audit log names it."""
        return f"network:{self.cidr}"


@dataclass(frozen=True)
class AuditInfo:
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


def plan_info_of(plan: Plan) -> PlanInfo:
    """The view a configured plan would have once written as rows (``limit_rows``)."""
    limits = [_limit_info(x) for x in limit_rows(plan)]
    return PlanInfo(
        plan.name, plan.description, plan.upgrade, _sorted_limits(limits), plan.concurrent
    )


def plan_info(record: PlanRecord) -> PlanInfo:
    limits = [_limit_info(x) for x in record.limits]
    return PlanInfo(
        record.name,
        record.description,
        record.upgrade_hint,
        _sorted_limits(limits),
        record.concurrent,
    )


def _limit_info(row: PlanLimit) -> LimitInfo:
    return LimitInfo(row.tier, row.resource, row.rate, row.algorithm, row.shadow, row.unit)


def _sorted_limits(limits: list[LimitInfo]) -> tuple[LimitInfo, ...]:
    order = [t.value for t in Tier]
    return tuple(sorted(limits, key=lambda x: (order.index(x.tier), x.resource)))


def client_info(client: Client) -> ClientInfo:
    return ClientInfo(
        client.id,
        client.name,
        client.plan.name,
        client.key_prefix,
        client.created_at,
        client.revoked_at,
        client.tenant,
        client.billing_day,
    )


def client_dict(info: ClientInfo) -> dict[str, Any]:
    # JSON-ready; the key hash and salt stay out of the audit log.
    return {
        "name": info.name,
        "plan": info.plan,
        "key_prefix": info.key_prefix,
        "revoked_at": info.revoked_at.isoformat() if info.revoked_at else None,
        "tenant": info.tenant,
        "billing_day": info.billing_day,
    }


def override_info(row: Override) -> OverrideInfo:
    return OverrideInfo(
        row.id, row.client_id, row.tier, row.resource, row.rate, row.expires_at, row.tenant
    )


def override_dict(info: OverrideInfo) -> dict[str, Any]:
    data = asdict(info)
    data["expires_at"] = info.expires_at.isoformat() if info.expires_at else None
    return data


def network_info(row: NetworkRecord) -> NetworkInfo:
    return NetworkInfo(
        row.id, row.cidr, row.action, row.reason or "", row.created_at, row.created_by,
        row.expires_at,
    )  # fmt: skip


def network_dict(info: NetworkInfo) -> dict[str, Any]:
    """A network rule as the audit log records it (its times as ISO text)."""
    data = asdict(info)
    data["created_at"] = info.created_at.isoformat()
    data["expires_at"] = info.expires_at.isoformat() if info.expires_at else None
    return data


def audit_info(row: AuditEntry) -> AuditInfo:
    return AuditInfo(row.id, row.at, row.actor, row.action, row.target, row.before, row.after)
