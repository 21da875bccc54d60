"""Redis backend: one EVALSHA per request, decided by Lua on the Redis server clock."""

from __future__ import annotations

import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..algorithms import Outcome
from ..usage import RedisUsageSink, UsageSink
from .base import BlockEntry, Check, Clock, Verdict, shadow_flags, wraps_errors

__all__ = [
    "CHARGE_SCRIPT",
    "REDIS_ERRORS",
    "REFUND_SCRIPT",
    "SCRIPT",
    "SHADOW_MARK",
    "RedisStorage",
    "decide_args",
    "parse_reply",
    "read_blocks",
]

# What redis-py and the socket raise when Redis cannot answer.
REDIS_ERRORS = (redis.RedisError, OSError)

# The algorithms are separate files so each mirrors its Python twin; Redis runs
# them as one script, so one call decides every tier of a request.
_PARTS = (
    "common.lua",
    "token_bucket.lua",
    "fixed_window.lua",
    "sliding_window_log.lua",
    "sliding_window_counter.lua",
    "block.lua",
    "decide.lua",
)


def _script(*parts: str) -> str:
    return "\n".join(
        resources.files(__package__).joinpath("lua", part).read_text("utf-8") for part in parts
    )


SCRIPT = _script(*_PARTS)
REFUND_SCRIPT = _script("common.lua", "refund.lua")  # undo a charge (charge_when, Cluster)
CHARGE_SCRIPT = _script("common.lua", "charge.lua")  # charge past the limit (quota.charge)


SHADOW_MARK = "~"  # before a check's algorithm code in decide.lua's ARGV: a shadow check


def decide_args(checks: Sequence[Check], mode: str, now_arg: Any) -> list[Any]:
    """ARGV of ``decide.lua``; a shadow check's code carries ``SHADOW_MARK`` ("~tb")."""
    args: list[Any] = [mode, now_arg]
    for check in checks:
        rate, code = check.rate, check.algorithm.code
        args += [SHADOW_MARK + code if check.shadow else code, rate.limit, rate.window_us]
        args += [rate.capacity, check.cost]
    return args


def refund_args(checks: Sequence[Check], now_arg: Any, charged_at_us: int) -> list[Any]:
    """ARGV of ``refund.lua``."""
    args: list[Any] = [now_arg]
    for check in checks:
        rate = check.rate
        args += [check.algorithm.code, rate.limit, rate.window_us, rate.capacity, check.cost]
        args.append(charged_at_us)
    return args


def charge_args(checks: Sequence[Check], now_arg: Any) -> list[Any]:
    """ARGV of ``charge.lua``."""
    args: list[Any] = [now_arg]
    for check in checks:
        rate = check.rate
        args += [check.algorithm.code, rate.limit, rate.window_us, rate.capacity, check.cost]
    return args


class RedisStorage:
    """Counters in Redis. Every key carries a TTL; every decision is one round trip.

    ``clock`` exists for ``flask_quota.testing`` only: production leaves it
    ``None`` so the script reads ``TIME`` on the server, the one clock every
    web server shares.
    """

    name = "redis"

    def __init__(self, client: redis.Redis, *, clock: Clock | None = None) -> None:
        self.client = client
        self._clock = clock
        self._script = client.register_script(SCRIPT)
        self._refund = client.register_script(REFUND_SCRIPT)
        self._charge = client.register_script(CHARGE_SCRIPT)

    @classmethod
    def from_url(cls, url: str, *, timeout: float, clock: Clock | None = None) -> RedisStorage:
        """``redis://``, ``rediss://`` or ``unix://``; ``clock`` replaces Redis ``TIME`` (tests)."""
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # No retries: a failed call is reported at once and the circuit
            # breaker, not the client, decides when to try again.
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        return cls(client, clock=clock)

    def decide(self, checks: Sequence[Check]) -> Verdict:
        """Charge every check if all of them allow; otherwise charge none."""
        return self._call("decide", checks)

    def peek(self, checks: Sequence[Check]) -> Verdict:
        """Answer as ``decide`` would without changing anything."""
        return self._call("peek", checks)

    @wraps_errors(*REDIS_ERRORS)
    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        if checks:
            now_arg = "" if self._clock is None else self._clock()
            args = refund_args(checks, now_arg, charged_at_us)
            self._refund(keys=[c.key for c in checks], args=args)

    @wraps_errors(*REDIS_ERRORS)
    def charge(self, checks: Sequence[Check]) -> None:
        if checks:
            now_arg = "" if self._clock is None else self._clock()
            self._charge(keys=[c.key for c in checks], args=charge_args(checks, now_arg))

    @wraps_errors(*REDIS_ERRORS)
    def clear(self, keys: Sequence[str]) -> None:
        """Forget the state of ``keys`` (a reset)."""
        if keys:
            self.client.delete(*keys)

    @wraps_errors(*REDIS_ERRORS)
    def block(self, key: str, seconds: int, info: str) -> None:
        self.client.set(key, info, ex=seconds)

    @wraps_errors(*REDIS_ERRORS)
    def blocks(self, match: str) -> list[BlockEntry]:
        return read_blocks(self.client, list(self.client.scan_iter(match=match, count=1000)))

    @wraps_errors(*REDIS_ERRORS)
    def ping(self) -> float:
        """Round-trip latency in seconds; raises ``StorageError`` when down."""
        start = time.perf_counter()
        self.client.ping()
        return time.perf_counter() - start

    def close(self) -> None:
        """Release the backend's connections (or, in memory, its state)."""
        self.client.close()

    @wraps_errors(*REDIS_ERRORS)
    def _call(self, mode: str, checks: Sequence[Check]) -> Verdict:
        args = decide_args(checks, mode, "" if self._clock is None else self._clock())
        reply = self._script(keys=[c.key for c in checks], args=args)
        return parse_reply(reply, checks)

    def usage_sink(self, prefix: str) -> UsageSink:
        """Dashboard usage in this Redis, shared by every worker (Sentinel inherits it)."""
        return RedisUsageSink(lambda: self.client, prefix, clock=self._clock)


def read_blocks(client: Any, keys: list[Any]) -> list[BlockEntry]:
    """The value and the rest of the TTL of each block key, in one pipeline."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute() if keys else []
    found = []
    for key, info, ttl in zip(keys, replies[::2], replies[1::2], strict=True):
        if info is not None and ttl > 0:  # gone, or ended between SCAN and the read
            name = key.decode() if isinstance(key, bytes) else key
            found.append(BlockEntry(name, ttl * 1000, info.decode("utf-8", "replace")))
    return found


def parse_reply(reply: Sequence[int], checks: Sequence[Check]) -> Verdict:
    """Turn ``{now, all_allowed, (allowed, remaining, reset, retry)...}`` into a Verdict."""
    outcomes = tuple(
        Outcome(
            bool(reply[2 + 4 * i]),
            check.rate.capacity if check.algorithm.code == "tb" else check.rate.limit,
            int(reply[3 + 4 * i]),
            int(reply[4 + 4 * i]),
            int(reply[5 + 4 * i]),
        )
        for i, check in enumerate(checks)
    )
    return Verdict(int(reply[0]), outcomes, shadow_flags(checks))
