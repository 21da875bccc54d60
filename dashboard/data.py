"""What the dashboard shows, computed from the quota state (no Flask request here)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote

from flask import Flask

from flask_quota.extension import QuotaState, limited_endpoints
from flask_quota.plans import Plan
from flask_quota.policy import TierCheck
from flask_quota.storage import StorageError
from flask_quota.usage import HOUR, MinuteUsage

__all__ = [
    "Bucket",
    "buckets",
    "display_name",
    "identity_checks",
    "identity_plan",
    "overview",
    "series",
    "storage_health",
    "valid_tag",
]

TOP = 10


@dataclass(frozen=True)
class Bucket:
    tier: str
    name: str
    limit: int
    remaining: int
    reset_in: int  # seconds until fully replenished
    rate: str

    @property
    def used_fraction(self) -> float:
        return 1 - self.remaining / self.limit if self.limit else 0.0


def valid_tag(tag: str) -> bool:
    """Identity tags as the extension builds them: ``id=...`` or ``ip=...``."""
    return tag.startswith(("id=", "ip=")) and 3 < len(tag) <= 300


def display_name(tag: str) -> str:
    kind, _, rest = tag.partition("=")
    return ("IP " if kind == "ip" else "") + unquote(rest)


def now_minute() -> int:
    return int(time.time() // 60)


def identity_plan(state: QuotaState, tag: str, known: dict[str, str] | None = None) -> Plan:
    catalog = state.catalog()
    settings = state.settings
    if tag.startswith("ip="):
        return catalog.resolve(settings.anonymous_plan, None, fallback=settings.default_plan)
    identity_id = unquote(tag[3:])
    name = catalog.client_plan(identity_id)
    if name is None:
        plans = known if known is not None else _plans_of(state, [tag])
        name = plans.get(tag, settings.default_plan)
    return catalog.resolve(name, identity_id, fallback=settings.default_plan)


def _plans_of(state: QuotaState, tags: list[str]) -> dict[str, str]:
    if state.usage is None:
        return {}
    return state.usage.sink.plan_of(tags, now_minute())


def identity_checks(app: Flask, state: QuotaState, tag: str, plan: Plan) -> list[TierCheck]:
    return state.policy.inspection_checks(plan, tag, limited_endpoints(app))


def buckets(state: QuotaState, checks: list[TierCheck]) -> list[Bucket] | None:
    """Every bucket's state read without consuming; ``None`` if the storage is down."""
    if not checks:
        return []
    try:
        verdict = state.storage.peek([c.check for c in checks])
    except StorageError:
        return None
    result = []
    for check, outcome in zip(checks, verdict.outcomes, strict=True):
        reset_in = max(0, -(-(outcome.reset_us - verdict.now_us) // 1_000_000))
        result.append(
            Bucket(
                check.tier.value,
                check.name,
                outcome.limit,
                outcome.remaining,
                reset_in,
                str(check.check.rate),
            )
        )
    return result


def series(minutes: list[MinuteUsage]) -> dict[str, dict[str, list[int]]]:
    """Per tier name: allowed and denied counts per minute, oldest first."""
    names = sorted({name for m in minutes for (name, _) in m.tiers})
    return {
        name: {
            "allowed": [m.tiers.get((name, True), 0) for m in minutes],
            "denied": [m.tiers.get((name, False), 0) for m in minutes],
        }
        for name in names
    }


def storage_health(state: QuotaState) -> dict[str, Any]:
    try:
        latency_ms: float | None = round(state.storage.ping() * 1000, 2)
    except StorageError:
        latency_ms = None
    return {
        "backend": state.storage.name,
        "latency_ms": latency_ms,
        "up": latency_ms is not None,
        "degraded": state.guard.degraded,
        "fail_mode": state.settings.fail_mode.value,
    }


def overview(app: Flask, state: QuotaState) -> dict[str, Any]:
    """Totals, the per-tier series of the last hour and the top identities."""
    minute = now_minute()
    minutes = state.usage.sink.minutes(HOUR, minute) if state.usage is not None else []
    totals: Counter[tuple[str, bool]] = Counter()
    for m in minutes:
        totals.update(m.tiers)
    recent = minutes[-5:]
    recent_requests: Counter[str] = Counter()
    for m in recent:
        recent_requests.update(m.identities)
    requests: Counter[bool] = Counter()
    for m in minutes:
        requests.update(m.requests)
    allowed, denied = requests[True], requests[False]
    last = minutes[-1].requests if minutes else Counter()
    last_denied, last_total = last[False], last[True] + last[False]
    top = _top(app, state, [tag for tag, _ in recent_requests.most_common(TOP)], recent_requests)
    return {
        "minute": minute,
        "allowed": allowed,
        "denied": denied,
        "deny_rate": round(100 * last_denied / last_total, 1) if last_total else 0.0,
        "tiers": {
            name: {"allowed": totals.get((name, True), 0), "denied": totals.get((name, False), 0)}
            for name in sorted({n for (n, _) in totals})
        },
        "series": series(minutes),
        "top": top,
        "storage": storage_health(state),
        "sql": asdict(state.sql.health()) if state.sql is not None else None,  # SyncHealth
    }


def _top(
    app: Flask, state: QuotaState, tags: list[str], requests: Counter[str]
) -> list[dict[str, Any]]:
    known = _plans_of(state, [t for t in tags if t.startswith("id=")])
    rows: list[dict[str, Any]] = []
    all_checks: list[TierCheck] = []
    spans: list[tuple[str, Plan, int, int]] = []
    for tag in tags:
        plan = identity_plan(state, tag, known)
        checks = identity_checks(app, state, tag, plan)
        spans.append((tag, plan, len(all_checks), len(all_checks) + len(checks)))
        all_checks += checks
    states = buckets(state, all_checks)  # one peek for all of them
    for tag, plan, start, end in spans:
        mine = states[start:end] if states is not None else []
        closest = min(mine, key=lambda b: (b.remaining / b.limit, b.remaining), default=None)
        rows.append(
            {
                "tag": tag,
                "name": display_name(tag),
                "plan": plan.name,
                "requests": requests[tag],
                "closest": None
                if closest is None
                else {"name": closest.name, "remaining": closest.remaining, "limit": closest.limit},
            }
        )
    return rows
