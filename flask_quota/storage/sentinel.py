"""Redis behind Sentinel: the single-node backend, pointed at whichever node is master."""

from __future__ import annotations

from typing import Any

from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from .base import Clock, storage_errors
from .redis import RedisStorage
from .redis_errors import REDIS_ERRORS
from .url import parse_storage_url, spellings

__all__ = ["SentinelStorage", "parse_sentinel_url"]

_FORM = (
    "redis+sentinel://[[user]:password@]host:26379[,host:26380...]/service_name[/db]"
    f"[?sentinel_password=...] (the scheme may be {spellings('redis+sentinel')})"
)


@storage_errors(*REDIS_ERRORS)  # its own methods, if it grows any: the rest are inherited
class SentinelStorage(RedisStorage):
    """``RedisStorage`` whose connections ask the sentinels where the master is.

    After a failover, a connection to the old master fails (or answers READONLY
    once it is demoted); redis-py drops it and the next connection goes to the
    master the sentinels name. Until then the fail mode applies, and the circuit
    breaker's probe finds the new master. Counters replicate asynchronously, so
    charges not yet on the replica when the master died are lost in the switch.
    """

    name = "redis+sentinel"

    @classmethod
    def from_url(cls, url: str, *, timeout: float, clock: Clock | None = None) -> SentinelStorage:
        """``redis+sentinel://[:password@]host:port[,host:port...]/service[/db]``, or
        ``valkey+sentinel://``."""
        sentinels, service, options, sentinel_options = parse_sentinel_url(url)
        timeouts = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        # Any: redis-py types Sentinel from 8.2 on (untyped before), and the keyword
        # options below are passed through to the connection, as its docs say.
        sentinel: Any = Sentinel
        manager = sentinel(sentinels, sentinel_kwargs={**timeouts, **sentinel_options})
        client = manager.master_for(
            service,
            # No retries: the circuit breaker decides when to try again.
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            **timeouts,
            **options,
        )
        return cls(client, clock=clock)


def parse_sentinel_url(
    url: str,
) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
    """``(sentinel addresses, service name, master options, sentinel options)``."""
    parsed = parse_storage_url(url)
    path = parsed.path
    if (
        parsed.scheme != "redis+sentinel"
        or not path
        or len(path) > 2
        or (len(path) == 2 and not path[1].isdigit())
    ):
        raise ValueError(f"QUOTA_STORAGE_URL {parsed.shown!r} is not a Sentinel URL; use {_FORM}")
    options: dict[str, Any] = {
        "username": parsed.username,
        "password": parsed.password,
        "db": int(path[1]) if len(path) == 2 else 0,
    }
    sentinel_options = {
        key: parsed.query[f"sentinel_{key}"]
        for key in ("username", "password")
        if parsed.query.get(f"sentinel_{key}")
    }
    return list(parsed.hosts), path[0], options, sentinel_options
