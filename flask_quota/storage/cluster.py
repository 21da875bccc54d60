"""Redis Cluster backend: one script call per hash slot, all-or-nothing by refund.

Keys of one caller share a hash tag (see ``core/keys.py``), so the user and endpoint
tiers of a request always sit in one slot; the global tier is keyed by IP and the
tenant tier by tenant, so each may sit in another. Each slot's tiers are decided
atomically by the same Lua script as on a single Redis, the slots concurrently (one
round trip each, in flight together). When a slot denies, the slots that allowed
have already charged: they get a compensating refund (``lua/refund.lua``), so a
denied request is charged nowhere. The price is a window of one round trip in
which the refunded charge is visible: a concurrent request on the same tier may
see it and be denied. The limiter can therefore under-admit near a limit, never
over-admit.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError
from redis.retry import Retry

from ..core.algorithms import Outcome
from .base import (
    BlockEntry,
    Check,
    Clock,
    StorageError,
    Verdict,
    shadow_flags,
    storage_errors,
    verdict_of,
    wall_clock_us,
)
from .redis import (
    CHARGE_SCRIPT,
    FUNCTION,
    GRANT_SCRIPT,
    LIBRARY,
    REFUND_SCRIPT,
    SCRIPT,
    StorageTime,
    charge_args,
    decide_args,
    function_missing,
    functions_refused,
    read_blocks,
    read_holders,
    refund_args,
    released_leases,
)
from .redis_errors import REDIS_ERRORS
from .redis_usage import RedisUsageSink
from .url import parse_storage_url
from .usage import UsageSink

__all__ = ["REFUND_SCRIPT", "ClusterStorage"]

log = logging.getLogger("flask_quota")

# Error replies that mean the script never ran, so running it again is safe.
_NOT_RUN = (NoScriptError, MovedError, AskError, TryAgainError)


@storage_errors(*REDIS_ERRORS)
class ClusterStorage:
    """Counters in a Redis Cluster; every slot a request touches costs one round trip.

    The cluster client is built on first use, not in ``init_app``, so an app
    starts while the cluster is down (the fail mode covers it) and every forked
    worker builds its own. ``clock`` is for ``flask_quota.testing`` only.
    """

    name = "redis+cluster"

    def __init__(
        self,
        connect: Callable[[], RedisCluster],
        *,
        clock: Clock | None = None,
        host_clock: Clock = wall_clock_us,
    ) -> None:
        self._connect = connect
        self._clock = clock
        self._time = StorageTime(host_clock)  # calendar edges: see redis.StorageTime
        self._lock = threading.Lock()
        self._client: RedisCluster | None = None
        self._scripts: tuple[Script, Script, Script] | None = None  # decide, refund, charge
        self._stale = False  # a node failed: refresh the slot map before the next call
        # A decision is an FCALL (see RedisStorage) until a node refuses functions; then
        # EVALSHA on every node: one way of loading the code for the whole cluster.
        self._functions = True

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout: float,
        clock: Clock | None = None,
        host_clock: Clock = wall_clock_us,
    ) -> ClusterStorage:
        """``redis+cluster://[user:password@]host:port[,host:port...]`` (or ``valkey+cluster://``),
        any nodes to start from."""
        parsed = parse_storage_url(url)
        nodes = [ClusterNode(host, port) for host, port in parsed.hosts]  # type: ignore[no-untyped-call]
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "username": parsed.username,
            "password": parsed.password,
        }

        def connect() -> RedisCluster:
            # No retries: a failed call is reported at once and the circuit
            # breaker, not the client, decides when to try again. MOVED and ASK
            # redirects are still followed (the command did not run).
            return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **options)

        return cls(connect, clock=clock, host_clock=host_clock)

    def _connected(self) -> tuple[RedisCluster, tuple[Script, Script, Script]]:
        """The cluster client and its scripts, connecting (reading the slot map) on first use.

        Deliberately not a ``client`` attribute: code that probes storages for a
        ``client`` (usage recording) must not connect during ``init_app``.
        """
        client, scripts = self._client, self._scripts
        if client is not None and scripts is not None:
            return client, scripts
        with self._lock:
            if self._client is None or self._scripts is None:
                client = self._connect()
                # Script objects hash their source once; EVALSHA reloads on NOSCRIPT.
                self._scripts = (
                    client.register_script(SCRIPT),
                    client.register_script(REFUND_SCRIPT),
                    client.register_script(CHARGE_SCRIPT),
                )
                self._client = client
            return self._client, self._scripts

    def decide(self, checks: Sequence[Check]) -> Verdict:
        """Charge every check if all of them allow; otherwise charge none."""
        return self._run(checks, "decide")

    def peek(self, checks: Sequence[Check]) -> Verdict:
        """Answer as ``decide`` would without changing anything."""
        return self._run(checks, "peek")

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        if not checks:
            return
        released = released_leases(checks)
        if released is not None:  # a release: each member leaves its set (redis.py)
            client = self._connected()[0]
            for set_key, member in released:
                client.zrem(set_key, member)
            return
        client, (_, refund, _) = self._connected()
        now_arg = "" if self._clock is None else self._clock()
        at = charged_at_us
        self._each_slot(client, refund, checks, lambda g: refund_args(g, now_arg, at))

    def charge(self, checks: Sequence[Check]) -> None:
        if checks:
            client, (_, _, charge) = self._connected()
            now_arg = "" if self._clock is None else self._clock()
            self._each_slot(
                client, charge, checks, lambda g: charge_args(g, now_arg, self._time.now_us())
            )

    def _each_slot(
        self,
        client: RedisCluster,
        script: Script,
        checks: Sequence[Check],
        args_of: Callable[[list[Check]], list[Any]],
    ) -> None:
        """Run ``script`` on every slot's checks at once; the first failure is raised. A
        slot that refused calendar edges (nothing written there) is run once more, its
        edges around the storage's time (``StorageTime``)."""
        parts = [[checks[i] for i in group] for group in slot_groups(checks)]
        replies = self._together(client, script, [([c.key for c in p], args_of(p)) for p in parts])
        skewed = [
            n
            for n, reply in enumerate(replies)
            if isinstance(reply, BaseException) and self._time.learn(reply)
        ]
        if skewed:
            again = [([c.key for c in parts[n]], args_of(parts[n])) for n in skewed]
            for n, reply in zip(skewed, self._together(client, script, again), strict=True):
                replies[n] = reply
        for reply in replies:
            if isinstance(reply, BaseException):
                raise StorageError(f"redis cluster: {reply}") from reply

    def clear(self, keys: Sequence[str]) -> None:
        """Forget the state of ``keys`` (a reset)."""
        if keys:
            self._connected()[0].delete(*keys)  # split per slot by the cluster client

    def block(self, key: str, seconds: int, info: str) -> None:
        self._connected()[0].set(key, info, ex=seconds)

    def blocks(self, match: str) -> list[BlockEntry]:
        client = self._connected()[0]
        # SCAN visits every primary; the pipeline sends each read to its key's node.
        return read_blocks(client, list(client.scan_iter(match=match, count=1000)))

    def keys(self, match: str) -> list[str]:
        """Every key matching the glob ``match`` on every primary (for tests and tools)."""
        found = self._connected()[0].scan_iter(match=match, count=1000)
        return [key.decode() if isinstance(key, bytes) else key for key in found]

    def block_info(self, key: str) -> str | None:
        info = self._connected()[0].get(key)
        if isinstance(info, bytes):
            return info.decode("utf-8", "replace")
        return info  # None, or a str from a client made with decode_responses

    def claim(self, key: str, seconds: int) -> bool:
        return bool(self._connected()[0].set(key, "1", nx=True, ex=seconds))

    # -- prepaid credits (flask_quota.credits): one key each, so one slot each ----

    def credit_states(self, keys: Sequence[str]) -> list[str | None]:
        client = self._connected()[0]
        found = [client.get(key) for key in keys]
        return [v.decode() if isinstance(v, bytes) else v for v in found]

    def credit_seed(self, key: str, text: str, ttl_us: int) -> bool:
        return bool(self._connected()[0].set(key, text, px=max(1, ttl_us // 1000), nx=True))

    def credit_grant(self, key: str, grant: tuple[int, int, int]) -> bool:
        client = self._connected()[0]
        now_arg = "" if self._clock is None else self._clock()
        script = client.register_script(GRANT_SCRIPT)
        return bool(script(keys=[key], args=[now_arg, *grant]))

    def holders(self, key: str) -> list[str]:
        client = self._connected()[0]
        now = self._clock() if self._clock is not None else None
        if now is None:
            cluster: Any = client  # the per-node calls are untyped in redis-py
            seconds, micros = cluster.get_redis_connection(cluster.get_node_from_key(key)).time()
            now = seconds * 1_000_000 + micros
        return read_holders(client, key, now)

    def ping(self) -> float:
        """Round-trip latency in seconds; raises ``StorageError`` when down."""
        start = time.perf_counter()
        self._connected()[0].ping()
        return time.perf_counter() - start

    def close(self) -> None:
        """Release the backend's connections (or, in memory, its state)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client, self._scripts = None, None

    # -- one request ---------------------------------------------------------

    def _run(self, checks: Sequence[Check], mode: str, *, again: bool = False) -> Verdict:
        client, (decide, _, _) = self._connected()
        if not checks:
            return Verdict(self._clock() if self._clock else wall_clock_us(), ())
        groups = slot_groups(checks)
        now_arg = "" if self._clock is None else self._clock()
        around = self._time.now_us()
        calls = []
        for group in groups:
            part = [checks[i] for i in group]
            calls.append(([c.key for c in part], decide_args(part, mode, now_arg, around)))
        results: list[Any] = []
        replies = self._together(client, decide, calls, function=True)
        for group, reply in zip(groups, replies, strict=True):
            if isinstance(reply, BaseException):
                results.append(reply)
            else:
                results.append(verdict_of([checks[i] for i in group], reply))
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
            if not again and any(self._time.learn(error) for error in failed):
                # A slot refused calendar edges around this clock (nothing was written
                # there; the others were refunded): once more, around the storage's time.
                return self._run(checks, mode, again=True)
            raise StorageError(f"redis cluster: {failed[0]}") from failed[0]
        return merge(checks, groups, verdicts)

    def _refund(self, checks: Sequence[Check], charged: list[tuple[list[int], Verdict]]) -> None:
        """Undo the charges of slots that allowed; best effort, a lost refund only under-admits."""
        client, (_, refund, _) = self._connected()
        now_arg = "" if self._clock is None else self._clock()
        calls = []
        for group, verdict in charged:
            # A slot's shadow checks that would have denied were not charged there.
            # A reservation (wait=) was charged for the time it is admitted at, its own.
            part = [
                (checks[i], verdict.now_us + outcome.retry_after_us)
                for i, outcome in zip(group, verdict.outcomes, strict=True)
                if outcome.allowed
            ]
            if not part:
                continue
            args = [now_arg]
            for check, at in part:
                args += refund_args([check], now_arg, at)[1:]
            calls.append(([c.key for c, _ in part], args))
        lost = [r for r in self._together(client, refund, calls) if isinstance(r, BaseException)]
        if lost:
            # Rare (a node failed between the decide and its refund), and the operator's
            # only sign that a denied request stayed charged on a slot.
            log.warning(
                "flask-quota: redis cluster: %d of %d refunds of a denied request lost (%s); "
                "their charges stay until the window passes (under-admits only)",
                len(lost), len(calls), lost[0],
            )  # fmt: skip

    def _together(
        self,
        client: RedisCluster,
        script: Script,
        calls: list[tuple[list[str], list[Any]]],
        *,
        function: bool = False,
    ) -> list[Any]:
        """Run ``script`` once per call, every call in flight at once; replies or errors.
        ``function``: ``script`` is the decide script, sent as an ``FCALL`` of
        ``FUNCTION`` while the cluster runs functions.

        Each call is written to the connection of its slot's master before any reply
        is read, as redis-py's cluster pipeline does, so N slots cost one round trip
        of wall time and a hung node costs one timeout, not N.
        """
        if self._stale:
            # A node failed last time: read the slot map again before trusting it.
            try:
                client.nodes_manager.initialize()
            except REDIS_ERRORS as exc:
                return [exc for _ in calls]
            self._stale = False
        cluster: Any = client  # the per-node calls below are untyped in redis-py
        fcall = function and self._functions
        command, name = ("FCALL", FUNCTION) if fcall else ("EVALSHA", script.sha)
        sent: list[tuple[Any, Any] | None] = []  # (node's Redis, its Connection)
        replies: list[Any] = [None] * len(calls)
        try:
            for n, (keys, args) in enumerate(calls):
                node: Any = None
                connection: Any = None
                try:
                    node = cluster.get_redis_connection(cluster.get_node_from_key(keys[0]))
                    connection = checkout(node.connection_pool)
                    connection.send_command(command, name, len(keys), *keys, *args)
                except REDIS_ERRORS as exc:
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
                    replies[n] = node.parse_response(connection, command)
                except redis.ResponseError as exc:
                    replies[n] = exc  # an error reply: the connection is still in step
                except REDIS_ERRORS as exc:
                    replies[n] = exc
                    connection.disconnect()  # a reply may still be on its way: never reuse
        finally:
            for pair in sent:
                if pair is not None:
                    pair[0].connection_pool.release(pair[1])
        for n, reply in enumerate(replies):
            if fcall and isinstance(reply, (*_NOT_RUN, redis.ResponseError)):
                replies[n] = self._fcall_again(cluster, script, reply, *calls[n])
            elif isinstance(reply, _NOT_RUN):
                # The script did not run (unknown to a new master, or the slot moved):
                # the cluster client reloads it and follows redirects.
                keys, args = calls[n]
                try:
                    replies[n] = script(keys=keys, args=args)
                except REDIS_ERRORS as exc:
                    replies[n] = exc
            elif isinstance(reply, (redis.ConnectionError, redis.TimeoutError, OSError)):
                self._stale = True
        return replies

    def _fcall_again(
        self,
        cluster: Any,
        script: Script,
        error: redis.ResponseError,
        keys: list[str],
        args: list[Any],
    ) -> Any:
        """The reply of an FCALL that did not run, or ``error`` if it ran and failed. A
        node without the library gets it on every primary; a node that refuses
        functions turns the whole cluster to the script. Sent again through the
        cluster client, which follows redirects (a slot that moved)."""
        if isinstance(error, _NOT_RUN):
            pass  # moved, or the slot is migrating: run it where it is now
        elif function_missing(error):
            try:
                cluster.function_load(LIBRARY, replace=True)  # every primary
            except redis.ResponseError:
                self._functions = False
        elif functions_refused(error):
            self._functions = False
        else:
            return error  # the function's own error reply
        try:
            if not self._functions:
                return script(keys=keys, args=args)
            return cluster.fcall(FUNCTION, len(keys), *keys, *args)
        except REDIS_ERRORS as exc:
            return exc

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
            outcomes[i] = outcome._replace(reset_us=outcome.reset_us + shift) if shift else outcome
    return Verdict(now, tuple(o for o in outcomes if o is not None), shadow_flags(checks))


def checkout(pool: Any) -> Any:
    """A connection from ``pool``, on every redis-py of our range: before 5.3
    ``get_connection`` requires a command name; from 5.3 passing one is deprecated."""
    if _NAME_REQUIRED.get(type(pool)) is None:
        parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
        required = parameter is not None and parameter.default is inspect.Parameter.empty
        _NAME_REQUIRED[type(pool)] = required
    return pool.get_connection("EVALSHA") if _NAME_REQUIRED[type(pool)] else pool.get_connection()


_NAME_REQUIRED: dict[type, bool] = {}
