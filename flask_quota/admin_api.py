"""The library as the operator's tools see it: the one door the dashboard uses.

Everything the bundled dashboard needs beyond the public face (``flask_quota``)
is named here, so it depends on these names and not on how the modules behind
them are laid out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from flask import Flask

from .core.clock import US, seconds_until, wall_clock_us
from .core.identity import client_ip
from .core.keys import KeyBuilder, Tag
from .core.near import is_near
from .core.networks import ACTIONS as NETWORK_ACTIONS
from .core.plans import Plan
from .core.policy import gate_check
from .core.priority import Priority, class_limits
from .core.tiers import Tier
from .core.validators import DEFAULT_UNIT, tenant_name
from .reports import UnknownCaller, UsageReport, usage_report
from .sql.admin import ClientInfo, NetworkInfo, PlanInfo, QuotaAdmin
from .sql.errors import (
    PLANS_READ_ONLY,
    AdminError,
    ChangeConflict,
    PlansReadOnly,
    TablesMissing,
    sql_reason,
)
from .sql.inputs import lifetime, parse_duration
from .sql.models import Client
from .state import QuotaState, get_state
from .storage import Check, MemoryStorage, Storage, StorageError
from .storage.usage import HOUR, SHADOW_DENIED, Mark, MinuteUsage
from .tools.blocks import block, list_blocks, unblock
from .tools.inspection import (
    BucketState,
    Caller,
    TierCheck,
    caller_checks,
    is_tag,
    peek,
    plan_of,
    reset,
    tenant_checks,
)
from .views import exempt, limited_endpoints

__all__ = [
    "DEFAULT_UNIT",
    "HOUR",
    "NETWORK_ACTIONS",
    "PLANS_READ_ONLY",
    "SHADOW_DENIED",
    "US",
    "AdminError",
    "BucketState",
    "Caller",
    "ChangeConflict",
    "Check",
    "Client",
    "ClientInfo",
    "KeyBuilder",
    "Mark",
    "MemoryStorage",
    "MinuteUsage",
    "NetworkInfo",
    "PlanInfo",
    "PlansReadOnly",
    "QuotaAdmin",
    "QuotaState",
    "Storage",
    "StorageError",
    "TablesMissing",
    "Tag",
    "TierCheck",
    "UnknownCaller",
    "UsageReport",
    "block",
    "bucket_units",
    "caller_checks",
    "client_ip",
    "exempt",
    "gate_check",
    "get_state",
    "is_near",
    "is_tag",
    "lifetime",
    "list_blocks",
    "overload_status",
    "parse_duration",
    "peek",
    "plan_of",
    "reset",
    "resource_units",
    "seconds_until",
    "sql_reason",
    "tenant_checks",
    "tenant_name",
    "unblock",
    "usage_report",
    "wall_clock_us",
]


def overload_status(state: QuotaState) -> dict[str, Any] | None:
    """What overload protection sees now, for the dashboard; None when it is off.

    ``capacity`` (``QUOTA_CAPACITY``) and each class's ``lines``; ``in_flight`` by class,
    the fleet's (read from its set of requests in flight, one storage read) with a
    fleet capacity, else this worker's; ``adaptive``: this worker's adaptive limit.
    Raises ``StorageError`` when the fleet's set cannot be read.
    """
    shedder = state.shedder
    if shedder is None:
        return None
    settings = state.settings
    lines = (
        {cls.value: n for cls, n in class_limits(settings.capacity, settings.reserve).items()}
        if settings.capacity is not None
        else None
    )
    if settings.capacity is not None:
        counts = dict.fromkeys((cls.value for cls in Priority), 0)
        by_initial = {cls.value[0]: cls.value for cls in Priority}
        for member in state.storage.holders(state.policy.keys.capacity_key()):
            cls = by_initial.get(member[:1])
            if cls is not None:
                counts[cls] += 1
        scope = "fleet"
    else:
        counts = {cls.value: n for cls, n in shedder.in_flight.items()}
        scope = "worker"
    gradient = shedder.gradient
    return {
        "capacity": settings.capacity,
        "lines": lines,
        "in_flight": counts,
        "scope": scope,
        "adaptive": gradient.limit if gradient is not None else None,
        "max_queue_ms": settings.max_queue_ms,
    }


def resource_units(app: Flask, plan: str | None, resources: Iterable[str]) -> dict[str, str]:
    """What each of ``resources`` counts, as a usage page names it: on ``plan`` (a plan's
    name; None or unknown: no one plan) the plan's unit, else its decorator's, else
    requests (``DEFAULT_UNIT``)."""
    declared = {resource: spec.unit for _, resource, spec in limited_endpoints(app)}
    found = get_state(app).catalog().get(plan) if plan is not None else None
    return {
        resource: found.unit_for(resource, declared.get(resource))
        if found is not None
        else declared.get(resource) or DEFAULT_UNIT
        for resource in resources
    }


def bucket_units(app: Flask, plan: Plan, checks: Sequence[TierCheck]) -> list[str]:
    """What each of ``checks``' buckets counts, as usage pages show it: an endpoint
    bucket's resource counts its plan's unit, else its decorator's, else requests; the
    other tiers count requests."""
    declared = {resource: spec.unit for _, resource, spec in limited_endpoints(app)}
    return [
        plan.unit_for(c.resource, declared.get(c.resource))
        if c.tier is Tier.ENDPOINT and c.resource
        else DEFAULT_UNIT
        for c in checks
    ]
