"""The shared usage sink in Redis (single node, Sentinel or Cluster)."""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any

from .base import storage_errors
from .redis_errors import REDIS_ERRORS
from .usage import (
    HOUR,
    REQUESTS,
    SHADOW_DENIED,
    TOP_KEPT,
    TTL_SECONDS,
    US_PER_MINUTE,
    Batch,
    Clock,
    Mark,
    MinuteUsage,
    wall_clock_us,
)

__all__ = ["RedisUsageSink"]

log = logging.getLogger("flask_quota")

_CHUNK = 500  # identities per Redis script call, so no call blocks Redis for long
_FLAGS: dict[Mark, str] = {True: "a", False: "d", SHADOW_DENIED: "s"}  # Redis field suffixes
_MARKS: dict[str, Mark] = {flag: mark for mark, flag in _FLAGS.items()}


@storage_errors(*REDIS_ERRORS)
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

    name = "redis usage"

    def __init__(
        self,
        connect: Callable[[], Any],
        prefix: str,
        *,
        clock: Clock | None = None,
        local_clock: Clock = wall_clock_us,
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
            minute = (stamped * US_PER_MINUTE + US_PER_MINUTE // 2 + offset) // US_PER_MINUTE
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
