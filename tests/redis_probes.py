"""A Redis server watched from a test: the round trips a client makes, the decide calls
the server answered, whether a server has gone to sleep."""

from __future__ import annotations

import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.servers import RedisServer

__all__ = ["CountingConnection", "counting_client", "decide_calls", "wait_until_asleep"]


class CountingConnection(redis.Connection):
    """Counts what crosses the wire: one send + one read is one round trip."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def counting_client(server: RedisServer) -> redis.Redis:
    pool = redis.ConnectionPool(
        connection_class=CountingConnection, host="127.0.0.1", port=server.port
    )
    return redis.Redis(connection_pool=pool)


def decide_calls(client: redis.Redis) -> int:
    """The decide calls the server answered (a function or a script), less the failed
    ones: a server that has not loaded our library yet refuses the first FCALL, which
    the client then makes again, and whether the shared server had loaded it depends on
    the tests that ran before on the same pytest-xdist worker."""
    stats: dict[str, Any] = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{c}", {}).get("calls", 0))
        - int(stats.get(f"cmdstat_{c}", {}).get("failed_calls", 0))
        for c in ("fcall", "evalsha")
    )


def wait_until_asleep(server: RedisServer) -> None:
    """Until ``server`` leaves a PING unanswered (a thread's DEBUG SLEEP has begun)."""
    deadline = time.monotonic() + 5
    with redis.Redis(
        "127.0.0.1", server.port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0)
    ) as probe:
        while time.monotonic() < deadline:
            try:
                probe.ping()
            except redis.TimeoutError:
                return
            time.sleep(0.005)
    raise AssertionError("the server never went to sleep")
