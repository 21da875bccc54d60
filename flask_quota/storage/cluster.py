"""Redis Cluster backend: one script call per hash slot, all-or-nothing by refund.

Keys of one caller share a hash tag (see ``keys.py``), so the user and endpoint
tiers of a request always sit in one slot; the global tier is keyed by IP and may
sit in another. Each slot's tiers are decided atomically by the same Lua script
as on a single Redis, the slots concurrently (one round trip each, in flight
together). When a slot denies, the slots that allowed have already charged: they
get a compensating refund (``lua/refund.lua``), so a denied request is charged
nowhere. The price is a window of one round trip in which the refunded charge is
visible: a concurrent request on the same tier may see it and be denied. The
limiter can therefore under-admit near a limit, never over-admit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError
from redis.retry import Retry

from ..algorithms import Outcome
from ..usage import RedisUsageSink, UsageSink
from .base import Check, Clock, StorageError, Verdict, wall_clock_us
from .redis import SCRIPT, parse_reply

__all__ = ["REFUND_SCRIPT", "ClusterStorage"]

REFUND_SCRIPT = "\n".join(
    resources.files(__package__).joinpath("lua", part).read_text("utf-8")
    for part in ("common.lua", "refund.lua")
)

_ERRORS = (redis.RedisError, OSError)
# Error replies that mean the script never ran, so running it again is safe.
_NOT_RUN = (NoScriptError, MovedError, AskError, TryAgainError)


class ClusterStorage:
    """Counters in a Redis Cluster; every slot a request touches costs one round trip.

    The cluster client is built on first use, not in ``init_app``, so an app
    starts while the cluster is down (the fail mode covers it) and every forked
    worker builds its own. ``clock`` is for ``flask_quota.testing`` only.
    """

    name = "redis+cluster"

    def __init__(self, connect: Callable[[], RedisCluster], *, clock: Clock | None = None) -> None:
        self._connect = connect
        self._clock = clock
        self._lock = threading.Lock()
        self._client: RedisCluster | None = None
        self._scripts: tuple[Script, Script] | None = None  # (decide, refund) of that client
        self._stale = False  # a node failed: refresh the slot map before the next call
        self.refund_failures = 0  # refunds that could not be delivered (charge kept)

    @classmethod
    def from_url(cls, url: str, *, timeout: float, clock: Clock | None = None) -> ClusterStorage:
        """``redis+cluster://[user:password@]host:port[,host:port...]``, any nodes to start from."""
        try:
            parts = urlsplit(url)
        except ValueError as exc:  # e.g. an unclosed "[" of an IPv6 address
            raise ValueError(f"QUOTA_STORAGE_URL {url!r} is not a URL ({exc})") from None
        userinfo, _, hosts = parts.netloc.rpartition("@")
        nodes = [_node(address, url) for address in hosts.split(",") if address]
        if not nodes:
            raise ValueError(f"QUOTA_STORAGE_URL {url!r} names no cluster node: use host:port")
        username, _, password = userinfo.partition(":")
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "username": unquote(username) or None,
            "password": unquote(password) or None,
        }

        def connect() -> RedisCluster:
            # No retries: a failed call is reported at once and the circuit
            # breaker, not the client, decides when to try again. MOVED and ASK
            # redirects are still followed (the command did not run).
            return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **options)

        return cls(connect, clock=clock)

    def _connected(self) -> tuple[RedisCluster, tuple[Script, Script]]:
        """The cluster client and its scripts, connecting (reading the slot map) on first use.

        Deliberately not a ``client`` attribute: code that probes storages for a
        ``client`` (usage recording) must not connect during ``init_app``.
        """
        client, scripts = self._client, self._scripts
        if client is not None and scripts is not None:
            return client, scripts
        with self._lock:
            if self._client is None or self._scripts is None:
                try:
                    client = self._connect()
                except _ERRORS as exc:
                    raise StorageError(f"redis cluster: {exc}") from exc
                # Script objects hash their source once; EVALSHA reloads on NOSCRIPT.
                self._scripts = (
                    client.register_script(SCRIPT),
                    client.register_script(REFUND_SCRIPT),
                )
                self._client = client
            return self._client, self._scripts

    def decide(self, checks: Sequence[Check]) -> Verdict:
        return self._run(checks, "decide")

    def peek(self, checks: Sequence[Check]) -> Verdict:
        return self._run(checks, "peek")

    def clear(self, keys: Sequence[str]) -> None:
        if keys:
            try:
                self._connected()[0].delete(*keys)  # split per slot by the cluster client
            except _ERRORS as exc:
                raise StorageError(f"redis cluster: {exc}") from exc

    def ping(self) -> float:
        start = time.perf_counter()
        try:
            self._connected()[0].ping()
        except _ERRORS as exc:
            raise StorageError(f"redis cluster: {exc}") from exc
        return time.perf_counter() - start

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client, self._scripts = None, None

    # -- one request ---------------------------------------------------------

    def _run(self, checks: Sequence[Check], mode: str) -> Verdict:
        client, (decide, _) = self._connected()
        if not checks:
            return Verdict(self._clock() if self._clock else wall_clock_us(), ())
        groups = slot_groups(checks)
        now_arg = "" if self._clock is None else self._clock()
        calls = []
        for group in groups:
            args: list[Any] = [mode, now_arg]
            for i in group:
                rate = checks[i].rate
                args += [checks[i].algorithm.code, rate.limit, rate.window_us, rate.capacity]
                args.append(checks[i].cost)
            calls.append(([checks[i].key for i in group], args))
        results: list[Any] = []
        for group, reply in zip(groups, self._together(client, decide, calls), strict=True):
            if isinstance(reply, BaseException):
                results.append(reply)
            else:
                results.append(parse_reply(reply, [checks[i] for i in group]))
        verdicts = [r for r in results if isinstance(r, Verdict)]
        failed = [r for r in results if not isinstance(r, Verdict)]
        if mode == "decide" and (failed or not all(v.allowed for v in verdicts)):
            charged = [
                (group, result)
                for group, result in zip(groups, results, strict=True)
                if isinstance(result, Verdict) and result.allowed
            ]
            if charged:
                self._refund(checks, charged)
        if failed:
            raise StorageError(f"redis cluster: {failed[0]}") from failed[0]
        return merge(checks, groups, verdicts)

    def _refund(self, checks: Sequence[Check], charged: list[tuple[list[int], Verdict]]) -> None:
        """Undo the charges of slots that allowed; best effort, a lost refund only under-admits."""
        client, (_, refund) = self._connected()
        now_arg = "" if self._clock is None else self._clock()
        calls = []
        for group, verdict in charged:
            args: list[Any] = [now_arg]
            for i in group:
                rate = checks[i].rate
                args += [checks[i].algorithm.code, rate.limit, rate.window_us, rate.capacity]
                args += [checks[i].cost, verdict.now_us]
            calls.append(([checks[i].key for i in group], args))
        for reply in self._together(client, refund, calls):
            if isinstance(reply, BaseException):
                self.refund_failures += 1

    def _together(
        self, client: RedisCluster, script: Script, calls: list[tuple[list[str], list[Any]]]
    ) -> list[Any]:
        """Run ``script`` once per call, every call in flight at once; replies or errors.

        Each call is written to the connection of its slot's master before any reply
        is read, as redis-py's cluster pipeline does, so N slots cost one round trip
        of wall time and a hung node costs one timeout, not N.
        """
        if self._stale:
            # A node failed last time: read the slot map again before trusting it.
            try:
                client.nodes_manager.initialize()
            except _ERRORS as exc:
                return [exc for _ in calls]
            self._stale = False
        cluster: Any = client  # the per-node calls below are untyped in redis-py
        sent: list[tuple[Any, Any] | None] = []  # (node's Redis, its Connection)
        replies: list[Any] = [None] * len(calls)
        try:
            for n, (keys, args) in enumerate(calls):
                node: Any = None
                connection: Any = None
                try:
                    node = cluster.get_redis_connection(cluster.get_node_from_key(keys[0]))
                    connection = node.connection_pool.get_connection()
                    connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                except _ERRORS as exc:
                    replies[n] = exc
                    if node is not None and connection is not None:
                        connection.disconnect()
                        node.connection_pool.release(connection)
                    sent.append(None)
                    continue
                sent.append((node, connection))
            for n, pair in enumerate(sent):
                if pair is None:
                    continue
                node, connection = pair
                try:
                    replies[n] = node.parse_response(connection, "EVALSHA")
                except redis.ResponseError as exc:
                    replies[n] = exc  # an error reply: the connection is still in step
                except _ERRORS as exc:
                    replies[n] = exc
                    connection.disconnect()  # a reply may still be on its way: never reuse
        finally:
            for pair in sent:
                if pair is not None:
                    pair[0].connection_pool.release(pair[1])
        for n, reply in enumerate(replies):
            if isinstance(reply, _NOT_RUN):
                # The script did not run (unknown to a new master, or the slot moved):
                # the cluster client reloads it and follows redirects.
                keys, args = calls[n]
                try:
                    replies[n] = script(keys=keys, args=args)
                except _ERRORS as exc:
                    replies[n] = exc
            elif isinstance(reply, (redis.ConnectionError, redis.TimeoutError, OSError)):
                self._stale = True
        return replies

    def usage_sink(self, prefix: str) -> UsageSink:
        """Dashboard usage in the cluster, shared by every worker; connects on first use."""
        return RedisUsageSink(lambda: self._connected()[0], prefix, clock=self._clock)


def slot_groups(checks: Sequence[Check]) -> list[list[int]]:
    """Indexes of ``checks`` grouped by hash slot, in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for i, check in enumerate(checks):
        groups.setdefault(key_slot(check.key.encode()), []).append(i)
    return list(groups.values())


def merge(checks: Sequence[Check], groups: list[list[int]], verdicts: list[Verdict]) -> Verdict:
    """One verdict in the first slot's clock: other slots' reset times are shifted into it."""
    now = verdicts[0].now_us
    outcomes: list[Outcome | None] = [None] * len(checks)
    for group, verdict in zip(groups, verdicts, strict=True):
        shift = now - verdict.now_us
        for i, outcome in zip(group, verdict.outcomes, strict=True):
            outcomes[i] = replace(outcome, reset_us=outcome.reset_us + shift) if shift else outcome
    return Verdict(now, tuple(o for o in outcomes if o is not None))


def _node(address: str, url: str) -> ClusterNode:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"QUOTA_STORAGE_URL {url!r}: cluster node {address!r} is not host:port, e.g. "
            "redis+cluster://10.0.0.1:6379,10.0.0.2:6379"
        )
    return ClusterNode(host.strip("[]"), int(port))  # type: ignore[no-untyped-call]
