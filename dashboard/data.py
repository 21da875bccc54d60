"""What the dashboard shows, computed from the quota state (no Flask request here)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from flask import Flask, g
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from flask_quota import Plan
from flask_quota.admin_api import (
    HOUR,
    SHADOW_DENIED,
    US,
    BucketState,
    Caller,
    Client,
    KeyBuilder,
    Mark,
    MinuteUsage,
    QuotaState,
    StorageError,
    TablesMissing,
    Tag,
    TierCheck,
    bucket_units,
    caller_checks,
    client_ip,
    gate_check,
    get_state,
    is_near,
    is_tag,
    overload_status,
    peek,
    plan_of,
    seconds_until,
    wall_clock_us,
)

__all__ = [
    "KIND_LABELS",
    "Bucket",
    "NameCache",
    "Reads",
    "block_left",
    "buckets",
    "canonical_tag",
    "display_name",
    "duration_text",
    "identity_checks",
    "identity_kind",
    "identity_plan",
    "overview",
    "series",
    "tier_totals",
    "valid_tag",
]

TOP = 10
DEFAULT_NEAR_LIMIT = 0.8  # the list's line while QUOTA_NEAR_LIMIT=None turns the warning off
KIND_LABELS = {"ip": "IP", "client": "client", "user": "user"}
FAIL_MODE_EFFECTS = {
    "open": "API requests pass without limits",
    "closed": "API requests are refused with 503",
    "local": "each worker limits API requests on its own",
}

T = TypeVar("T")


class Reads:
    """The storage reads of one dashboard request.

    The first read that fails marks the storage down for the rest of the request
    and every later read is skipped: a hung Redis costs a page one storage
    timeout, not one per read, and the page still renders, saying what is missing.
    """

    def __init__(self, state: QuotaState) -> None:
        self.state = state
        self.error: str | None = None
        self._latency_ms: float | None = None
        self._pinged = False

    def run(self, read: Callable[[], T]) -> T | None:
        """``read()``, or ``None`` when the storage is (or just turned out to be) down."""
        if self.error is not None:
            return None
        try:
            return read()
        except StorageError as exc:  # every storage and usage-sink read raises only this
            # The kind of failure (ConnectionError, TimeoutError...), not the message:
            # that may carry the storage's URL.
            self.error = type(exc.__cause__ or exc).__name__
            return None

    def health(self) -> dict[str, Any]:
        """Storage status for the operator: up or down, the fail mode, the breaker."""
        if not self._pinged:  # once per request, and first, so a dead storage is found fast
            self._pinged = True
            latency = self.run(self.state.storage.ping)
            self._latency_ms = None if latency is None else round(latency * 1000, 2)
        guard, down = self.state.guard, self.error is not None
        breaker_open = guard.degraded
        return {
            "backend": self.state.storage.name,
            "status": "down" if down else "up",
            "up": not down,
            "latency_ms": self._latency_ms,
            "error": self.error,
            "fail_mode": self.state.settings.fail_mode.value,
            # The fail mode decides API requests whenever the storage fails them.
            "fail_mode_active": down or breaker_open,
            "fail_mode_effect": FAIL_MODE_EFFECTS.get(self.state.settings.fail_mode.value, ""),
            "breaker_open": breaker_open,
            "probe_every_s": self.state.settings.breaker_cooldown,
            "probe_every_text": duration_text(self.state.settings.breaker_cooldown),
        }


Bucket = BucketState  # what the identity pages list


def valid_tag(tag: str) -> bool:
    """Identity tags as the extension builds them: ``id=...`` or ``ip=...``."""
    return is_tag(tag)


def canonical_tag(tag: str) -> str | None:
    """The tag the extension builds for what ``tag`` names, or ``None`` if it names nobody.

    A hand-typed URL may leave a character unescaped (``id=acct:1`` for the identity
    ``acct:1``, whose tag is ``id=acct%3A1``; ``ip=::1``): that is the same caller.
    """
    if not valid_tag(tag):
        return None
    parsed = Tag(tag)
    if parsed.is_ip:
        ip = client_ip(parsed.value)
        return None if ip == "unknown" else KeyBuilder.ip_tag(ip)
    raw = parsed.raw
    if parsed.hashed:  # a digest of a long id: only the extension writes those
        return tag if len(raw) == 66 and all(c in "0123456789abcdef" for c in raw[2:]) else None
    return KeyBuilder.identity_tag(parsed.value)


_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def duration_text(seconds: float) -> str:
    """A span as people say it, to its two largest units: ``1 h 9 min``, ``45 s``, ``3 d``."""
    if 0 < seconds < 10 and seconds != int(seconds):
        return f"{seconds:.2g} s"  # a sub-second setting, e.g. a breaker cooldown of 0.5 s
    left = max(0, round(seconds))
    parts: list[tuple[int, str]] = []
    for unit, size in _UNITS:
        count, left = divmod(left, size)
        if count or parts:
            parts.append((count, unit))
        if len(parts) == 2:
            break
    shown = [f"{count} {unit}" for count, unit in parts if count]
    return " ".join(shown) or "0 s"


class NameCache:
    """Client names by id, for lists that would otherwise show bare ids.

    Read from SQL at most once per ``ttl`` seconds per set of ids, and never a failure:
    while the database does not answer, the lists show ids (``{}``) and the page
    stays up (the overview is polled every second).
    """

    def __init__(self, ttl: float = 5.0) -> None:
        self.ttl = ttl
        self._names: dict[str, str] = {}
        self._until = 0.0
        self._asked: frozenset[str] = frozenset()

    def names(self, state: QuotaState, ids: set[str]) -> dict[str, str]:
        wanted = frozenset(i for i in ids if i.isdigit() and len(i) < 19)
        now = time.monotonic()
        if wanted and (now >= self._until or not wanted <= self._asked):
            self._until, self._asked = now + self.ttl, wanted
            try:
                with state.sql.session() as session:
                    rows = session.execute(
                        select(Client.id, Client.name).where(Client.id.in_(int(i) for i in wanted))
                    ).all()
            except (SQLAlchemyError, TablesMissing):
                self._names = {}
            else:
                self._names = {str(row.id): row.name for row in rows}
        return {i: self._names[i] for i in wanted if i in self._names}


def display_name(tag: str) -> str:
    """The address or identity id of a tag, verbatim (its kind is shown apart, see
    ``identity_kind``: an identity named "IP 6.6.6.6" is not that IP)."""
    return Tag(tag).value


def identity_kind(state: QuotaState, tag: str) -> str:
    """``ip`` (anonymous, by address), ``client`` (an API client in SQL) or ``user``."""
    identity = Caller.from_tag(tag).identity
    if identity is None:
        return "ip" if Tag(tag).is_ip else "user"
    return "client" if state.catalog().client_plan(identity) is not None else "user"


def now_minute(state: QuotaState) -> int:
    """The current minute by the clock usage is stamped with (the storage's), so the
    minutes read here are the ones requests were counted in, whatever that clock is."""
    usage = state.usage
    now_us = usage.sink.clock() if usage is not None else wall_clock_us()
    return now_us // (60 * US)


def identity_plan(
    state: QuotaState, reads: Reads, tag: str, known: dict[str, str] | None = None
) -> Plan:
    """The plan the request path applies to ``tag``; identities the app's own loader
    knows are on the plan usage last saw them on."""
    caller = Caller.from_tag(tag)
    seen = None
    if not caller.anonymous:
        plans = known if known is not None else _plans_of(state, reads, [tag])
        seen = plans.get(tag)
    return plan_of(state, caller, seen_plan=seen)


def _plans_of(state: QuotaState, reads: Reads, tags: list[str]) -> dict[str, str]:
    """The plan each identity was last seen on (unknown while the usage sink is down)."""
    usage = state.usage
    if usage is None:
        return {}
    return reads.run(lambda: usage.sink.plan_of(tags, now_minute(state))) or {}


def identity_checks(app: Flask, state: QuotaState, tag: str, plan: Plan) -> list[TierCheck]:
    """Every bucket ``tag`` owns, as cost-0 checks."""
    return caller_checks(app, state, Caller.from_tag(tag), plan)


def buckets(state: QuotaState, reads: Reads, checks: list[TierCheck]) -> list[Bucket] | None:
    """Every bucket's state read without consuming; ``None`` if the storage is down."""
    return reads.run(lambda: peek(state, checks))


def block_left(state: QuotaState, reads: Reads, tag: str) -> dict[str, Any] | None:
    """How long ``tag`` stays blocked (``{"seconds", "text"}``), ``None`` if it is not,
    or ``{"seconds": None}`` while the storage cannot say."""
    gate = gate_check(state.policy.keys, tag)
    verdict = reads.run(lambda: state.storage.peek([gate]))
    if verdict is None:
        return {"seconds": None, "text": "unknown"}
    outcome = verdict.outcomes[0]
    if outcome.allowed:
        return None
    seconds = max(1, seconds_until(outcome.reset_us, verdict.now_us))
    return {"seconds": seconds, "text": duration_text(seconds)}


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


def tier_totals(minutes: list[MinuteUsage]) -> dict[str, dict[str, int]]:
    """Per tier name: allowed, denied and shadow-denied ("would have denied") counts."""
    totals: Counter[tuple[str, Mark]] = Counter()
    for m in minutes:
        totals.update(m.tiers)
    return {
        name: {
            "allowed": totals.get((name, True), 0),
            "denied": totals.get((name, False), 0),
            "shadow_denied": totals.get((name, SHADOW_DENIED), 0),
        }
        for name in sorted({n for (n, _) in totals})
    }


def usage_minutes(state: QuotaState, reads: Reads, tag: str = "") -> list[MinuteUsage] | None:
    """The last hour of usage, of everyone or of one identity; ``None`` while unreadable."""
    usage = state.usage
    if usage is None:
        return []
    if tag:
        return reads.run(lambda: usage.sink.identity_minutes(tag, HOUR, now_minute(state)))
    return reads.run(lambda: usage.sink.minutes(HOUR, now_minute(state)))


def overview(
    app: Flask, state: QuotaState, reads: Reads, tenant_of: dict[str, str] | None = None
) -> dict[str, Any]:
    """Totals, the per-tier series of the last hour and the top identities; with
    ``tenant_of`` (client tag -> tenant) also the requests of each tenant's clients.

    While the usage cannot be read, the counts are ``None`` (unknown, not zero)
    and ``usage`` says why.
    """
    reads.health()  # first: a dead storage is found by one ping, and later reads are skipped
    minute = now_minute(state)
    minutes = usage_minutes(state, reads)
    if minutes is None:
        return {
            "minute": minute,
            "usage": "unavailable",
            "allowed": None,
            "denied": None,
            "deny_rate": None,
            "tiers": {},
            "series": {},
            "top": [],
            "near_limit": [],
            "tenants": [],
            "overload": None if state.shedder is None else {"unavailable": True},
            "storage": reads.health(),
        }
    overload = overload_panel(state, reads, minutes)
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
    top, near = _top(
        app, state, reads, [tag for tag, _ in recent_requests.most_common(TOP)], recent_requests
    )
    return {
        "minute": minute,
        "usage": "ok" if state.usage is not None else "off",
        "allowed": allowed,
        "denied": denied,
        "deny_rate": round(100 * last_denied / last_total, 1) if last_total else 0.0,
        "tiers": tier_totals(minutes),
        "series": series(minutes),
        "top": top,
        "near_limit": near,
        "tenants": tenant_usage(minutes, tenant_of or {}),
        "overload": overload,
        "storage": reads.health(),  # after the reads: one of them may have failed
        "sql": asdict(state.sql.health()),  # the snapshot's age, and whether it is stale
    }


SHED_TIERS = ("shed (capacity)", "shed (queue)")  # how the usage counts sheds (edge.py)


def overload_panel(
    state: QuotaState, reads: Reads, minutes: list[MinuteUsage]
) -> dict[str, Any] | None:
    """Overload protection's panel: requests in flight by class, the capacity in force
    and sheds per minute (the last full minute's); None when protection is off."""
    status = reads.run(lambda: overload_status(state)) if state.shedder is not None else None
    if status is None:
        return None if state.shedder is None else {"unavailable": True}
    totals = tier_totals(minutes[-2:-1]) if len(minutes) > 1 else {}
    status["sheds_per_minute"] = sum(totals.get(t, {}).get("denied", 0) for t in SHED_TIERS)
    return status


def tenant_usage(minutes: list[MinuteUsage], tenant_of: dict[str, str]) -> list[dict[str, Any]]:
    """Requests of the last hour per tenant, busiest first, summed over its SQL clients.

    The sink counts requests per identity only (the busiest ``TOP_KEPT`` of each
    minute), not per tenant: so this is a lower bound when more identities are busy,
    and callers whose tenant comes from the app's own identify function are not seen.
    """
    totals: Counter[str] = Counter()
    for m in minutes:
        for tag, count in m.identities.items():
            tenant = tenant_of.get(tag)
            if tenant is not None:
                totals[tenant] += count
    return [{"tenant": t, "requests": n} for t, n in totals.most_common()]


def request_reads() -> Reads:
    """This request's storage reads: one ping, and no more reads once one failed."""
    reads: Reads | None = g.get("_quota_reads")
    if reads is None:
        reads = g._quota_reads = Reads(get_state())
    return reads


def failure_kind(exc: StorageError) -> str:
    """The kind of storage failure, not its message: that may name the storage's URL."""
    return type(exc.__cause__ or exc).__name__


def near_limit(state: QuotaState) -> float:
    """The share of a bucket from which it is "about to hit the limit": ``QUOTA_NEAR_LIMIT``."""
    return state.settings.near_limit or DEFAULT_NEAR_LIMIT


def _top(
    app: Flask, state: QuotaState, reads: Reads, tags: list[str], requests: Counter[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The top identities with the bucket closest to its limit (none while every bucket
    of theirs is full), and every bucket of theirs
    on or above ``near_limit(state)`` used (most used first): both from one peek. The
    line is ``signals.quota_near_limit``'s (``is_near``), so the list shows exactly the
    buckets whose crossing was signalled and has not refilled below it."""
    share = near_limit(state)
    known = _plans_of(state, reads, [t for t in tags if Tag(t).is_identity])
    rows: list[dict[str, Any]] = []
    all_checks: list[TierCheck] = []
    units: list[str] = []  # what each of all_checks' buckets counts
    spans: list[tuple[str, Plan, int, int]] = []
    for tag in tags:
        plan = identity_plan(state, reads, tag, known)
        checks = identity_checks(app, state, tag, plan)
        spans.append((tag, plan, len(all_checks), len(all_checks) + len(checks)))
        all_checks += checks
        units += bucket_units(app, plan, checks)
    states = buckets(state, reads, all_checks)  # one peek for all of them
    near: list[tuple[float, dict[str, Any]]] = []
    for tag, plan, start, end in spans:
        mine = states[start:end] if states is not None else []
        unit_of = dict(zip(map(id, mine), units[start:end], strict=True))
        closest = min(mine, key=lambda b: (b.remaining / b.limit, b.remaining), default=None)
        if closest is not None and closest.remaining >= closest.limit:
            closest = None  # every bucket is full: none of them is close to its limit
        who = {"tag": tag, "kind": identity_kind(state, tag), "name": display_name(tag)}
        rows.append(
            {
                **who,
                "plan": plan.name,
                "requests": requests[tag],
                "closest": None
                if closest is None
                else {
                    "name": closest.name,
                    "remaining": closest.remaining,
                    "limit": closest.limit,
                    "unit": unit_of[id(closest)],
                },
            }
        )
        for b in mine:
            if is_near(b.limit, b.remaining, share):
                entry = {
                    **who,
                    "plan": plan.name,
                    "tier": b.tier,
                    "bucket": b.name,
                    "remaining": b.remaining,
                    "limit": b.limit,
                    "unit": unit_of[id(b)],
                    "used_percent": round(100 * b.used_fraction),
                }
                near.append((b.used_fraction, entry))
    near.sort(key=lambda item: -item[0])  # stable: ties keep the top list's order
    return rows, [entry for _, entry in near]
