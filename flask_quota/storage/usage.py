"""Usage sinks: where the dashboard's allowed/denied counts per minute are kept.

Sinks keep the last hour and, whatever the number of callers, a bounded amount of
it: totals per tier are exact, per-identity counts are kept for each minute's
``TOP_KEPT`` busiest identities only. A flush costs what it carries, never what the
sink holds. Each count is marked True (allowed), False (denied) or ``SHADOW_DENIED``
(a shadow tier that would have denied; the request was not denied by it).

Which sink a storage gets is the storage's own business: a storage that can host
usage implements ``UsageHost.usage_sink(prefix)``. This module is the sinks'
common ground and the in-process one (``MemoryUsageSink``); the Redis sink is
``redis_usage.py``; ``flask_quota/recorder.py`` records and flushes.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..core.policy import SHADOW_DENIED, Mark
from .base import storage_errors

__all__ = [
    "HOUR",
    "REQUESTS",
    "SHADOW_DENIED",
    "TOP_KEPT",
    "TTL_SECONDS",
    "US_PER_MINUTE",
    "Batch",
    "Mark",
    "MemoryUsageSink",
    "MinuteUsage",
    "UsageHost",
    "UsageSink",
    "wall_clock_us",
]

HOUR = 60  # minutes kept
TOP_KEPT = 1000  # identities kept per minute, the busiest by requests
TTL_SECONDS = (HOUR + 1) * 60  # a minute is written during that minute, shown for an hour
_TRIM_AT = TOP_KEPT + TOP_KEPT // 2  # the memory sink trims in batches (amortised O(1))
US_PER_MINUTE = 60_000_000

Clock = Callable[[], int]
"""Microseconds, like the storages' clocks (``flask_quota.storage.Clock``)."""

Batch = dict[tuple[int, str, str, Mark], int]  # (minute, identity, tier name, mark) -> count
REQUESTS = "*"  # the tier name under which whole requests are counted per identity


def wall_clock_us() -> int:
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


@storage_errors()  # in-process: no client, nothing to translate
class MemoryUsageSink:
    """In-process sink (the memory backend's companion): one process sees its own usage.

    At most ``HOUR`` minutes, each with at most ``TOP_KEPT`` (plus trimming slack)
    identities. Minutes older than an hour by ``clock`` are dropped on every
    flush, also when no traffic came.
    """

    def __init__(self, clock: Clock = wall_clock_us) -> None:
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
            first = self.clock() // US_PER_MINUTE - HOUR + 1  # the oldest minute kept
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
