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
from .base import Check, Clock, StorageError, Verdict

__all__ = ["SCRIPT", "RedisStorage"]

# The algorithms are separate files so each mirrors its Python twin; Redis runs
# them as one script, so one call decides every tier of a request.
_PARTS = (
    "common.lua",
    "token_bucket.lua",
    "fixed_window.lua",
    "sliding_window_log.lua",
    "sliding_window_counter.lua",
    "decide.lua",
)
SCRIPT = "\n".join(
    resources.files(__package__).joinpath("lua", part).read_text("utf-8") for part in _PARTS
)


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

    @classmethod
    def from_url(cls, url: str, *, timeout: float, clock: Clock | None = None) -> RedisStorage:
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
        return self._call("decide", checks)

    def peek(self, checks: Sequence[Check]) -> Verdict:
        return self._call("peek", checks)

    def clear(self, keys: Sequence[str]) -> None:
        if keys:
            try:
                self.client.delete(*keys)
            except (redis.RedisError, OSError) as exc:
                raise StorageError(f"redis: {exc}") from exc

    def ping(self) -> float:
        start = time.perf_counter()
        try:
            self.client.ping()
        except (redis.RedisError, OSError) as exc:
            raise StorageError(f"redis: {exc}") from exc
        return time.perf_counter() - start

    def close(self) -> None:
        self.client.close()

    def _call(self, mode: str, checks: Sequence[Check]) -> Verdict:
        args: list[Any] = [mode, "" if self._clock is None else self._clock()]
        for check in checks:
            rate = check.rate
            args += [check.algorithm.code, rate.limit, rate.window_us, rate.capacity, check.cost]
        try:
            reply = self._script(keys=[c.key for c in checks], args=args)
        except (redis.RedisError, OSError) as exc:
            raise StorageError(f"redis: {exc}") from exc
        return parse_reply(reply, checks)

    def usage_sink(self, prefix: str) -> UsageSink:
        """Dashboard usage in this Redis, shared by every worker (Sentinel inherits it)."""
        return RedisUsageSink(lambda: self.client, prefix, clock=self._clock)


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
    return Verdict(int(reply[0]), outcomes)
