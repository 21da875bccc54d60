"""Usage recording for the dashboard: allowed/denied counts per minute, tier and identity.

Each tier's count is marked True (allowed), False (denied) or ``SHADOW_DENIED``
(a shadow tier that would have denied; the request was not denied by it).

Nothing here touches the request's storage round trip: ``UsageRecorder.record``
only bumps in-process counters; a background thread flushes them to a sink
about once a second (on Redis, one script call per minute and 500 callers in
the flush). Sinks keep the last hour
and, whatever the number of callers, a bounded amount of it: totals per tier
are exact, per-identity counts are kept for each minute's ``TOP_KEPT`` busiest
identities only. A flush costs what it carries, never what the sink holds.

Which sink a storage gets is the storage's own business: a storage that can
host usage implements ``UsageHost.usage_sink(prefix)``. This module imports
no backend, so the backends can import it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol, runtime_checkable

from ..core.policy import SHADOW_DENIED, Mark

__all__ = [
    "HOUR",
    "REQUESTS",
    "SHADOW_DENIED",
    "TOP_KEPT",
    "Mark",
    "MemoryUsageSink",
    "MinuteUsage",
    "RedisUsageSink",
    "UsageHost",
    "UsageRecorder",
    "UsageSink",
    "usage_sink",
]

log = logging.getLogger("flask_quota")

HOUR = 60  # minutes kept
TOP_KEPT = 1000  # identities kept per minute, the busiest by requests
TTL_SECONDS = (HOUR + 1) * 60  # a minute is written during that minute, shown for an hour
_TRIM_AT = TOP_KEPT + TOP_KEPT // 2  # the memory sink trims in batches (amortised O(1))
_CHUNK = 500  # identities per Redis script call, so no call blocks Redis for long
_US_PER_MINUTE = 60_000_000

Clock = Callable[[], int]
"""Microseconds, like the storages' clocks (``flask_quota.storage.Clock``)."""

"""The mark of a shadow tier that would have denied (``Decision.usage_outcomes``)."""
Batch = dict[tuple[int, str, str, Mark], int]  # (minute, identity, tier name, mark) -> count
REQUESTS = "*"  # the tier name under which whole requests are counted per identity
_FLAGS: dict[Mark, str] = {True: "a", False: "d", SHADOW_DENIED: "s"}  # Redis field suffixes
_MARKS: dict[str, Mark] = {flag: mark for mark, flag in _FLAGS.items()}


def _wall_clock_us() -> int:
    return time.time_ns() // 1000


@dataclass
class MinuteUsage:
    """Counts of one minute: per (tier name, mark), per identity, and whole
    requests by admitted (True) or denied (False)."""

    minute: int
    tiers: Counter[tuple[str, Mark]] = field(default_factory=Counter)
    identities: Counter[str] = field(default_factory=Counter)
    requests: Counter[bool] = field(default_factory=Counter)


class UsageSink(Protocol):
    """Where a ``UsageRecorder`` flushes its counts, and where the dashboard reads them."""

    @property
    def clock(self) -> Clock:
        """The storage's time, which counts are filed by (the dashboard's "now")."""

    @property
    def stamp(self) -> Clock:
        """What the recorder stamps each count with, read per request without any I/O:
        the storage's clock where it is in-process, else the local one, which the sink
        turns into the storage's when it flushes."""

    def add(self, batch: Batch, plans: dict[str, str]) -> None:
        """Add one flush's counts. Called about once a second, with an empty batch
        when nothing happened, so a sink can also drop what aged out."""

    def minutes(self, last: int, now_minute: int) -> list[MinuteUsage]:
        """Totals of the ``last`` minutes up to ``now_minute``, oldest first."""

    def identity_minutes(self, identity: str, last: int, now_minute: int) -> list[MinuteUsage]:
        """One identity's per-tier counts of the ``last`` minutes, oldest first."""

    def plan_of(self, identities: Iterable[str], now_minute: int) -> dict[str, str]:
        """The plan each identity was last seen on within the hour."""


@runtime_checkable
class UsageHost(Protocol):
    """A storage that can keep the dashboard's usage: the storage decides where
    (in-process for memory, in Redis for Redis, Sentinel and Cluster)."""

    def usage_sink(self, prefix: str) -> UsageSink:
        """A sink for usage counts, its keys (if any) under ``prefix``."""


def usage_sink(storage: object, prefix: str) -> UsageSink:
    """The sink ``storage`` hosts; a storage that hosts none gets an in-process one.

    A wrapper (the deny cache, the fail-mode guard) hosts what the ``storage`` it
    wraps hosts: it is looked through here instead of each wrapper passing it on.
    """
    while not isinstance(storage, UsageHost):
        storage = getattr(storage, "storage", None)
        if storage is None:
            return MemoryUsageSink()
    return storage.usage_sink(prefix)


class _Minute:
    """One minute in the memory sink; it goes as a whole when it ages out.

    An identity's tier counts are a list indexed like the sink's tier names:
    about a third of a ``Counter``'s size, and (kept identities x an hour) of
    them is the sink's memory bound.
    """

    __slots__ = ("counts", "plans", "usage")

    def __init__(self, minute: int) -> None:
        self.usage = MinuteUsage(minute)
        self.counts: dict[str, list[int]] = {}  # identity -> count per tier index
        self.plans: dict[str, str] = {}

    def add_request(self, identity: str, allowed: bool, count: int, plan: str | None) -> None:
        self.usage.requests[allowed] += count
        self.usage.identities[identity] += count
        if plan is not None:
            self.plans[identity] = plan
        self._bound()

    def add_tier(self, identity: str, pair: tuple[str, Mark], index: int, count: int) -> None:
        self.usage.tiers[pair] += count
        counts = self.counts.get(identity)
        if counts is None:
            counts = self.counts[identity] = [0] * (index + 1)
        elif len(counts) <= index:
            counts += [0] * (index + 1 - len(counts))
        counts[index] += count
        self._bound()

    def _bound(self) -> None:
        if len(self.usage.identities) <= _TRIM_AT and len(self.counts) <= _TRIM_AT:
            return
        # The busiest stay; new dicts, not deletions, since a dict keeps its table.
        kept = self.usage.identities.most_common(TOP_KEPT)
        self.usage.identities = Counter(dict(kept))
        self.counts = {i: self.counts[i] for i, _ in kept if i in self.counts}
        self.plans = {i: self.plans[i] for i, _ in kept if i in self.plans}


class MemoryUsageSink:
    """In-process sink (the memory backend's companion): one process sees its own usage.

    At most ``HOUR`` minutes, each with at most ``TOP_KEPT`` (plus trimming slack)
    identities. Minutes older than an hour by ``clock`` are dropped on every
    flush, also when no traffic came.
    """

    def __init__(self, clock: Clock = _wall_clock_us) -> None:
        self.clock = self.stamp = clock
        self._lock = threading.Lock()
        self._minutes: dict[int, _Minute] = {}
        # (tier name, mark) -> its index in the count lists; names come from
        # the app's tiers and resources, never from clients, so this stays small.
        self._index: dict[tuple[str, Mark], int] = {}
        self._pairs: list[tuple[str, Mark]] = []

    def add(self, batch: Batch, plans: dict[str, str]) -> None:
        """Add a flushed batch of counts and the plans its identities were seen on."""
        with self._lock:
            first = self.clock() // _US_PER_MINUTE - HOUR + 1  # the oldest minute kept
            for old in [m for m in self._minutes if m < first]:
                del self._minutes[old]
            for (minute, identity, tier, mark), count in batch.items():
                held = self._minutes.get(minute)
                if held is None:
                    if minute < first:
                        continue  # aged out before it arrived
                    held = self._minutes[minute] = _Minute(minute)
                if tier == REQUESTS:
                    held.add_request(identity, mark is True, count, plans.get(identity))
                    continue
                index = self._index.get((tier, mark))
                if index is None:
                    index = self._index[(tier, mark)] = len(self._pairs)
                    self._pairs.append((tier, mark))
                held.add_tier(identity, self._pairs[index], index, count)

    def minutes(self, last: int, now_minute: int) -> list[MinuteUsage]:
        with self._lock:
            result = []
            for m in range(now_minute - last + 1, now_minute + 1):
                held = self._minutes.get(m)
                result.append(_copy(held.usage) if held is not None else MinuteUsage(m))
            return result

    def identity_minutes(self, identity: str, last: int, now_minute: int) -> list[MinuteUsage]:
        with self._lock:
            result = []
            for m in range(now_minute - last + 1, now_minute + 1):
                held = self._minutes.get(m)
                counts = held.counts.get(identity, []) if held else []
                tiers = Counter({self._pairs[i]: c for i, c in enumerate(counts) if c})
                requests = held.usage.identities.get(identity, 0) if held else 0
                result.append(MinuteUsage(m, tiers, Counter({identity: requests})))
            return result

    def plan_of(self, identities: Iterable[str], now_minute: int) -> dict[str, str]:
        wanted = list(identities)
        found: dict[str, str] = {}
        with self._lock:
            for m in range(now_minute - HOUR + 1, now_minute + 1):  # the newest plan wins
                held = self._minutes.get(m)
                if held is not None:
                    found.update((i, held.plans[i]) for i in wanted if i in held.plans)
        return found


def _copy(usage: MinuteUsage) -> MinuteUsage:
    return MinuteUsage(
        usage.minute, Counter(usage.tiers), Counter(usage.identities), Counter(usage.requests)
    )


class RedisUsageSink:
    """Shared sink in Redis (single node, Sentinel or Cluster): every worker sees all usage.

    Three keys per minute, however many callers, in one hash slot (the minute
    is the hash tag) and expiring a little over an hour after the last write.
    For ``prefix`` "quota" and minute 29000000:
    ``quota:usage:{29000000}:t`` hash "tier|a"/"tier|d"/"tier|s" (allowed, denied,
    shadow-denied) -> count;
    ``quota:usage:{29000000}:top`` sorted set identity -> requests, the
    ``TOP_KEPT`` busiest; ``quota:usage:{29000000}:ids`` hash identity ->
    JSON plan and tier counts, for the identities in ``top`` only (see
    ``storage/lua/usage.lua``, which adds and trims in one step).
    ``connect`` returns the client (a cluster client may be made on first use).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        prefix: str,
        *,
        clock: Clock | None = None,
        local_clock: Clock = _wall_clock_us,
    ):
        self.connect = connect
        self.prefix = prefix
        # An injected clock (flask_quota.testing) is the storage's clock, as it is for
        # the decide script: no offset. Otherwise the offset (Redis TIME minus this
        # server's clock) is learned from Redis, at the first flush or dashboard read.
        self.stamp = clock or local_clock
        self._offset: int | None = 0 if clock is not None else None
        self._fixed = clock is not None
        self._script: Any = None  # redis-py's Script: hashes the source once

    def clock(self) -> int:
        """Redis's time: this server's clock plus the offset (one TIME if none is known
        yet, e.g. a dashboard read before any flush; this server's alone if that fails)."""
        if self._offset is None:
            try:
                self._sync(self.connect())
            except Exception as exc:  # the dashboard still shows something
                log.warning("flask-quota: reading the Redis clock for usage failed (%s)", exc)
                return self.stamp()
        return self.stamp() + (self._offset or 0)

    def _sync(self, client: Any) -> int:
        """Learn the offset with one TIME (a process's first flush only)."""
        before = self.stamp()
        reply = client.time()
        if isinstance(reply, dict):  # a cluster client may ask every node: any will do
            reply = next(iter(reply.values()))
        seconds, micros = reply
        return self._learn(int(seconds) * 1_000_000 + int(micros), before)

    def _learn(self, server_us: int, before: int) -> int:
        """The offset, from Redis's time as read between ``before`` and now."""
        if not self._fixed:
            self._offset = server_us - (before + self.stamp()) // 2
        return self._offset or 0

    def _keys(self, minute: int) -> tuple[str, str, str]:
        base = f"{self.prefix}:usage:{{{minute}}}"  # hash tag: one slot per minute
        return f"{base}:t", f"{base}:top", f"{base}:ids"

    def add(self, batch: Batch, plans: dict[str, str]) -> None:
        if not batch:
            return  # Redis expires old minutes by itself
        totals: defaultdict[int, Counter[str]] = defaultdict(Counter)
        requests: defaultdict[int, Counter[str]] = defaultdict(Counter)
        tiers: defaultdict[int, defaultdict[str, dict[str, int]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        client = self.connect()
        offset = self._offset if self._offset is not None else self._sync(client)
        for (stamped, identity, tier, mark), count in batch.items():
            # A local minute is filed under the Redis minute holding its middle: exact
            # while the clocks agree to a minute, else within half a minute.
            minute = (stamped * _US_PER_MINUTE + _US_PER_MINUTE // 2 + offset) // _US_PER_MINUTE
            name = f"{tier}|{_FLAGS[mark]}"
            totals[minute][name] += count
            if tier == REQUESTS:
                requests[minute][identity] += count
            else:
                # Two local minutes never share a Redis minute: one (identity, name) each.
                tiers[minute][identity][name] = count
        for minute in totals:
            who = list(requests[minute].keys() | tiers[minute].keys())
            for start in range(0, len(who), _CHUNK):
                args: list[Any] = [TTL_SECONDS, TOP_KEPT]
                if start == 0:
                    args += [len(totals[minute]), *_flat(totals[minute].items())]
                else:
                    args.append(0)
                for identity in who[start : start + _CHUNK]:
                    args += [
                        identity,
                        requests[minute][identity],
                        plans.get(identity, ""),
                        json.dumps(tiers[minute].get(identity, {})),
                    ]
                before = self.stamp()
                _, seconds, micros = self._run(client, self._keys(minute), args)
                self._learn(int(seconds) * 1_000_000 + int(micros), before)  # for the next

    def _run(self, client: Any, keys: tuple[str, ...], args: list[Any]) -> Any:
        if self._script is None:
            source = resources.files("flask_quota.storage").joinpath("lua", "usage.lua")
            self._script = client.register_script(source.read_text("utf-8"))
        return self._script(keys, args, client=client)

    def minutes(self, last: int, now_minute: int) -> list[MinuteUsage]:
        span = range(now_minute - last + 1, now_minute + 1)
        pipe = self.connect().pipeline(transaction=False)
        for m in span:
            totals, top, _ = self._keys(m)
            pipe.hgetall(totals)
            pipe.zrevrange(top, 0, 99, withscores=True)
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
        pipe = self.connect().pipeline(transaction=False)
        for m in span:
            _, top, ids = self._keys(m)
            pipe.hget(ids, identity)
            pipe.zscore(top, identity)
        replies = pipe.execute()
        result = []
        for i, m in enumerate(span):
            entry = json.loads(replies[2 * i]) if replies[2 * i] else {}
            requests = int(replies[2 * i + 1] or 0)
            tiers = _tier_counts(entry.get("c") or {})
            result.append(MinuteUsage(m, tiers, Counter({identity: requests})))
        return result

    def plan_of(self, identities: Iterable[str], now_minute: int) -> dict[str, str]:
        wanted = list(identities)
        if not wanted:
            return {}
        pipe = self.connect().pipeline(transaction=False)
        for m in range(now_minute - HOUR + 1, now_minute + 1):
            pipe.hmget(self._keys(m)[2], wanted)
        plans: dict[str, str] = {}
        for values in pipe.execute():  # oldest first, so the newest plan wins
            for identity, raw in zip(wanted, values, strict=True):
                plan = json.loads(raw).get("p") if raw else None
                if isinstance(plan, str):
                    plans[identity] = plan
        return plans


def _flat(pairs: Iterable[tuple[str, int]]) -> list[Any]:
    return [item for pair in pairs for item in pair]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _tier_counts(raw: dict[Any, Any]) -> Counter[tuple[str, Mark]]:
    counts: Counter[tuple[str, Mark]] = Counter()
    for name, value in raw.items():
        tier, _, flag = _text(name).rpartition("|")
        counts[(tier, _MARKS.get(flag, False))] += int(value)
    return counts


class UsageRecorder:
    """Aggregates per-request outcomes in-process and flushes them in the background.

    Counts are stamped with the sink's ``stamp`` clock and filed by the storage's
    clock, so a test that freezes the storage's clock moves usage with it, and two
    servers whose clocks differ file one request under the same minute. At most ``max_pending``
    counts wait for a flush; more are dropped, never held.
    """

    def __init__(self, sink: UsageSink, *, interval: float = 1.0, max_pending: int = 50_000):
        self.sink = sink
        self.interval = interval
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: Batch = {}
        self._plans: dict[str, str] = {}
        self._dropped = 0
        self._thread_pid: int | None = None

    def record(self, identity: str, plan: str, outcomes: Iterable[tuple[str, Mark]]) -> None:
        """Count one request: ``outcomes`` is (tier name, mark) per applied tier; the
        request was admitted unless a tier is marked False (denied)."""
        minute = self.sink.stamp() // _US_PER_MINUTE
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._dropped += 1  # the sink is unreachable or slow; drop, never grow
                return
            admitted = True
            for tier, mark in outcomes:
                key = (minute, identity, tier, mark)
                self._pending[key] = self._pending.get(key, 0) + 1
                admitted = admitted and mark is not False
            key = (minute, identity, REQUESTS, admitted)
            self._pending[key] = self._pending.get(key, 0) + 1
            self._plans[identity] = plan
        if self._thread_pid != os.getpid():
            self._start()

    def flush(self) -> None:
        """Hand the pending counts to the sink (also when there are none: it may age out)."""
        with self._lock:
            batch, plans, self._pending, self._plans = self._pending, self._plans, {}, {}
        try:
            self.sink.add(batch, plans)
        except Exception as exc:  # the dashboard's data may lag; requests must not care
            if batch:  # an empty flush lost nothing: no log line every second while down
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
