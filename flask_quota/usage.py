"""Usage recording for the dashboard: allowed/denied counts per minute, tier and identity.

Nothing here touches the request's storage round trip: ``UsageRecorder.record``
only bumps in-process counters; a background thread flushes them to a sink
about once a second (one pipelined call per worker). Sinks keep the last hour
and no more: the memory sink prunes old minutes, the Redis sink gives every
key a TTL and trims the per-minute top list. Active identities are found in
those per-minute lists, never by scanning the keyspace.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "HOUR",
    "REQUESTS",
    "MemoryUsageSink",
    "MinuteUsage",
    "RedisUsageSink",
    "UsageRecorder",
    "UsageSink",
    "usage_sink",
]

log = logging.getLogger("flask_quota")

HOUR = 60  # minutes kept
TOP_KEPT = 1000  # identities kept per minute for the top list
TTL_SECONDS = (HOUR + 5) * 60

Batch = dict[tuple[int, str, str, bool], int]  # (minute, identity, tier name, allowed) -> count
REQUESTS = "*"  # the tier name under which whole requests are counted per identity


@dataclass
class MinuteUsage:
    """Counts of one minute: per (tier name, allowed), per identity, and whole
    requests by admitted (True) or denied (False)."""

    minute: int
    tiers: Counter[tuple[str, bool]] = field(default_factory=Counter)
    identities: Counter[str] = field(default_factory=Counter)
    requests: Counter[bool] = field(default_factory=Counter)


class UsageSink(Protocol):
    def add(self, batch: Batch, plans: dict[str, str]) -> None: ...

    def minutes(self, last: int, now_minute: int) -> list[MinuteUsage]:
        """Totals of the ``last`` minutes up to ``now_minute``, oldest first."""

    def identity_minutes(self, identity: str, last: int, now_minute: int) -> list[MinuteUsage]:
        """One identity's per-tier counts of the ``last`` minutes, oldest first."""

    def plan_of(self, identities: Iterable[str], now_minute: int) -> dict[str, str]:
        """The plan each identity was last seen on within the hour."""


class MemoryUsageSink:
    """In-process sink (the memory backend's companion): one process sees its own usage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._minutes: dict[int, MinuteUsage] = {}
        self._by_identity: dict[tuple[int, str], Counter[tuple[str, bool]]] = {}
        self._plans: dict[str, str] = {}

    def add(self, batch: Batch, plans: dict[str, str]) -> None:
        """Add a flushed batch of counts and the plans its identities were seen on."""
        with self._lock:
            for (minute, identity, tier, allowed), count in batch.items():
                usage = self._minutes.setdefault(minute, MinuteUsage(minute))
                if tier == REQUESTS:
                    usage.identities[identity] += count
                    usage.requests[allowed] += count
                    continue
                usage.tiers[(tier, allowed)] += count
                mine = self._by_identity.setdefault((minute, identity), Counter())
                mine[(tier, allowed)] += count
            self._plans.update(plans)
            self._prune(max(self._minutes, default=0))

    def _prune(self, newest: int) -> None:
        cutoff = newest - HOUR
        for minute in [m for m in self._minutes if m <= cutoff]:
            del self._minutes[minute]
        for key in [k for k in self._by_identity if k[0] <= cutoff]:
            del self._by_identity[key]
        for usage in self._minutes.values():
            if len(usage.identities) > TOP_KEPT:
                usage.identities = Counter(dict(usage.identities.most_common(TOP_KEPT)))
        live = {identity for (_, identity) in self._by_identity}
        self._plans = {k: v for k, v in self._plans.items() if k in live}

    def minutes(self, last: int, now_minute: int) -> list[MinuteUsage]:
        with self._lock:
            return [
                _copy(self._minutes.get(m)) or MinuteUsage(m)
                for m in range(now_minute - last + 1, now_minute + 1)
            ]

    def identity_minutes(self, identity: str, last: int, now_minute: int) -> list[MinuteUsage]:
        with self._lock:
            result = []
            for m in range(now_minute - last + 1, now_minute + 1):
                tiers = self._by_identity.get((m, identity), Counter())
                minute = self._minutes.get(m)
                requests = minute.identities.get(identity, 0) if minute else 0
                result.append(MinuteUsage(m, Counter(tiers), Counter({identity: requests})))
            return result

    def plan_of(self, identities: Iterable[str], now_minute: int) -> dict[str, str]:
        with self._lock:
            return {i: self._plans[i] for i in identities if i in self._plans}


def _copy(usage: MinuteUsage | None) -> MinuteUsage | None:
    if usage is None:
        return None
    return MinuteUsage(
        usage.minute, Counter(usage.tiers), Counter(usage.identities), Counter(usage.requests)
    )


class RedisUsageSink:
    """Shared sink in Redis, written with one pipeline per flush.

    Keys (all with a TTL of a little over an hour):
    ``{prefix}:usage:{minute}:t`` hash "tier|a"/"tier|d" -> count;
    ``{prefix}:usage:{minute}:top`` sorted set identity -> requests (trimmed);
    ``{prefix}:usage:{minute}:id:{identity}`` hash per identity;
    ``{prefix}:usage:{minute}:plan`` hash identity -> plan.
    """

    def __init__(self, client: Any, prefix: str = "quota") -> None:
        self.client = client
        self.prefix = prefix

    def _key(self, minute: int, *parts: str) -> str:
        return ":".join((self.prefix, "usage", str(minute), *parts))

    def add(self, batch: Batch, plans: dict[str, str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        touched: set[str] = set()
        per_identity: Counter[tuple[int, str]] = Counter()
        for (minute, identity, tier, allowed), count in batch.items():
            field_name = f"{tier}|{'a' if allowed else 'd'}"
            if tier == REQUESTS:  # whole requests: per minute, and per identity in the top list
                per_identity[(minute, identity)] += count
                pipe.hincrby(self._key(minute, "t"), field_name, count)
                touched.add(self._key(minute, "t"))
                continue
            for key in (self._key(minute, "t"), self._key(minute, "id", identity)):
                pipe.hincrby(key, field_name, count)
                touched.add(key)
        for (minute, identity), count in per_identity.items():
            top = self._key(minute, "top")
            pipe.zincrby(top, count, identity)
            touched.add(top)
            if identity in plans:
                plan_key = self._key(minute, "plan")
                pipe.hset(plan_key, identity, plans[identity])
                touched.add(plan_key)
        for minute in {minute for (minute, _) in per_identity}:
            # Keep the top list bounded: only the busiest identities matter to the dashboard.
            pipe.zremrangebyrank(self._key(minute, "top"), 0, -TOP_KEPT - 1)
        for key in touched:
            pipe.expire(key, TTL_SECONDS)
        pipe.execute()

    def minutes(self, last: int, now_minute: int) -> list[MinuteUsage]:
        span = range(now_minute - last + 1, now_minute + 1)
        pipe = self.client.pipeline(transaction=False)
        for m in span:
            pipe.hgetall(self._key(m, "t"))
            pipe.zrevrange(self._key(m, "top"), 0, 99, withscores=True)
        replies = pipe.execute()
        result = []
        for i, m in enumerate(span):
            tiers, top = _tier_counts(replies[2 * i]), replies[2 * i + 1]
            requests = Counter({ok: tiers.pop((REQUESTS, ok), 0) for ok in (True, False)})
            identities = Counter({_text(member): int(score) for member, score in top})
            result.append(MinuteUsage(m, tiers, identities, +requests))
        return result

    def identity_minutes(self, identity: str, last: int, now_minute: int) -> list[MinuteUsage]:
        span = range(now_minute - last + 1, now_minute + 1)
        pipe = self.client.pipeline(transaction=False)
        for m in span:
            pipe.hgetall(self._key(m, "id", identity))
            pipe.zscore(self._key(m, "top"), identity)
        replies = pipe.execute()
        result = []
        for i, m in enumerate(span):
            requests = int(replies[2 * i + 1] or 0)
            result.append(
                MinuteUsage(m, _tier_counts(replies[2 * i]), Counter({identity: requests}))
            )
        return result

    def plan_of(self, identities: Iterable[str], now_minute: int) -> dict[str, str]:
        wanted = list(identities)
        if not wanted:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for m in range(now_minute - HOUR + 1, now_minute + 1):
            pipe.hmget(self._key(m, "plan"), wanted)
        plans: dict[str, str] = {}
        for values in pipe.execute():  # oldest first, so the newest plan wins
            for identity, plan in zip(wanted, values, strict=True):
                if plan is not None:
                    plans[identity] = _text(plan)
        return plans


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _tier_counts(raw: dict[Any, Any]) -> Counter[tuple[str, bool]]:
    counts: Counter[tuple[str, bool]] = Counter()
    for name, value in raw.items():
        tier, _, flag = _text(name).rpartition("|")
        counts[(tier, flag == "a")] += int(value)
    return counts


def usage_sink(storage: Any, prefix: str) -> UsageSink:
    """Redis-backed storages share usage through Redis; otherwise it stays in-process."""
    client = getattr(storage, "client", None)
    if client is not None and hasattr(client, "pipeline"):
        return RedisUsageSink(client, prefix)
    return MemoryUsageSink()


class UsageRecorder:
    """Aggregates per-request outcomes in-process and flushes them in the background."""

    def __init__(
        self,
        sink: UsageSink,
        *,
        interval: float = 1.0,
        max_pending: int = 50_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.interval = interval
        self.max_pending = max_pending
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: Batch = {}
        self._plans: dict[str, str] = {}
        self._dropped = 0
        self._thread_pid: int | None = None

    def record(self, identity: str, plan: str, outcomes: Iterable[tuple[str, bool]]) -> None:
        """Count one request: ``outcomes`` is (tier name, allowed) per applied tier."""
        minute = int(self._clock() // 60)
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._dropped += 1  # the sink is unreachable or slow; drop, never grow
                return
            admitted = True
            for tier, allowed in outcomes:
                key = (minute, identity, tier, allowed)
                self._pending[key] = self._pending.get(key, 0) + 1
                admitted = admitted and allowed
            key = (minute, identity, REQUESTS, admitted)
            self._pending[key] = self._pending.get(key, 0) + 1
            self._plans[identity] = plan
        if self._thread_pid != os.getpid():
            self._start()

    def flush(self) -> None:
        with self._lock:
            batch, plans, self._pending, self._plans = self._pending, self._plans, {}, {}
        if batch:
            try:
                self.sink.add(batch, plans)
            except Exception as exc:  # the dashboard's data may lag; requests must not care
                log.warning("flask-quota: usage flush failed (%s); %d counts lost", exc, len(batch))

    def _start(self) -> None:
        # Started lazily, after gunicorn forked the worker that records.
        with self._lock:
            if self._thread_pid == os.getpid():
                return
            self._thread_pid = os.getpid()
        threading.Thread(target=self._run, name="flask-quota-usage", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            self.flush()
