"""Redis backend: one EVALSHA per request, decided by Lua on the Redis server clock."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..core.algorithms import Gate
from ..core.generations import Generations
from ..core.leases import split
from .base import (
    BlockEntry,
    Check,
    Clock,
    Reply,
    Verdict,
    storage_errors,
    verdict_of,
    wall_clock_us,
)
from .redis_errors import REDIS_ERRORS
from .redis_usage import RedisUsageSink
from .url import parse_storage_url
from .usage import UsageSink

__all__ = [
    "CHARGE_SCRIPT",
    "FUNCTION",
    "GRANT_SCRIPT",
    "LIBRARY",
    "REFUND_SCRIPT",
    "SCRIPT",
    "SHADOW_MARK",
    "RedisStorage",
    "StorageTime",
    "check_args",
    "decide_args",
    "function_missing",
    "functions_refused",
    "read_blocks",
]

# The algorithms are separate files so each mirrors its Python twin; Redis runs
# them as one script, so one call decides every tier of a request.
_PARTS = (
    "common.lua",
    "token_bucket.lua",
    "fixed_window.lua",
    "sliding_window_log.lua",
    "sliding_window_counter.lua",
    "block.lua",
    "lease.lua",
    "credits.lua",
    "decide.lua",
)


def _script(*parts: str) -> str:
    return "\n".join(
        resources.files(__package__).joinpath("lua", part).read_text("utf-8") for part in parts
    )


SCRIPT = _script(*_PARTS, "decide_eval.lua")


def _library(body: str) -> tuple[str, str]:
    """The decide code as a Redis 7 function library, and its function's name. Both
    names carry a hash of the code, so two releases' libraries live side by side in
    one server during a rolling deploy, each calling its own code."""
    version = hashlib.sha1(body.encode()).hexdigest()[:16]
    function = f"flask_quota_decide_{version}"
    # The helpers are defined once, when the library loads; FCALL runs only `decide`.
    library = (
        f"#!lua name=flask_quota_{version}\n{body}\n"
        f"redis.register_function('{function}',\n"
        "  function(keys, args) return decide(keys, args) end)\n"
    )
    return library, function


LIBRARY, FUNCTION = _library(_script(*_PARTS))
# Undo a charge (charge_when, Cluster), leases among them. A release of leases alone
# (after a response) is a plain ZREM instead: ``released_leases``.
REFUND_SCRIPT = _script("common.lua", "lease.lua", "credits.lua", "refund.lua")
# charge past the limit (quota.charge)
CHARGE_SCRIPT = _script("common.lua", "credits.lua", "charge.lua")
# add a grant to a balance held here (prepaid credits, flask_quota.credits)
GRANT_SCRIPT = _script("common.lua", "credits.lua", "credits_grant.lua")


_CACHED = 2048  # entries per generation of the encoding caches

SHADOW_MARK = "~"  # before a check's algorithm code in decide.lua's ARGV: a shadow check


CALENDAR_CODE = "cw"  # a calendar window's code in the scripts' ARGV (a fixed window's state)


CHECKS_SEPARATOR = ";"  # between the checks of decide.lua's one checks argument

# The scripts' refusal of calendar edges that do not hold their own clock (common.lua).
_SKEW = re.compile(r"flask-quota: calendar skew now=(-?[0-9]+)")


class StorageTime:
    """The storage's clock as this machine estimates it: what calendar edges are
    computed around (``calendar_bounds``). This machine's clock (``host``), moved by the
    offset the storage told the last time it refused edges that did not hold its own
    time (a server clock off by more than a month or a year: ``common.lua``). Until
    then, and while the clocks stay within a window, no offset is needed: the script
    picks among the edges by its own clock."""

    __slots__ = ("host", "offset_us")

    def __init__(self, host: Clock = wall_clock_us) -> None:
        self.host = host
        self.offset_us = 0

    def now_us(self) -> int:
        return self.host() + self.offset_us

    def learn(self, error: BaseException) -> bool:
        """True when ``error`` is a script refusing calendar edges: the storage's time it
        names is learnt (the call is then made again, once)."""
        found = _SKEW.search(str(error))
        if found is None:
            return False
        self.offset_us = int(found[1]) - self.host()
        return True


def decide_args(
    checks: Sequence[Check], mode: str, now_arg: Any, around_us: int | None = None
) -> list[Any]:
    """ARGV of ``decide.lua``: one argument for every check, each check's ``check_args``
    joined by ``CHECKS_SEPARATOR``, then ``mode`` and ``now_arg`` unless they are the
    defaults (``"decide"`` on the server clock, ``""``). One argument, not one per check:
    Redis makes a Lua string of every argument of every call, and the script parses a
    request's checks once and keeps them (see ``decide.lua``'s ``shape_of``). Calendar
    edges are around ``now_arg``'s time (tests), else ``around_us``, else this clock."""
    around = _around(now_arg)
    if around is None:
        around = around_us
    joined = CHECKS_SEPARATOR.join(arg for check in checks for arg in check_args(check, around))
    if mode == "decide" and now_arg == "":
        return [joined]
    return [joined, mode, now_arg]


def check_args(check: Check, around_us: int | None = None) -> list[str]:
    """One check's arguments to ``decide.lua``: a single string, ``"code limit window_us
    capacity cost"`` (``decide_args`` joins a request's). A shadow check's code carries
    ``SHADOW_MARK`` ("~tb"). The rate's numbers are hexadecimal (Lua reads them with
    ``strtoul``, cheaper than ``strtod``); the cost stays decimal: it may be negative
    (a refund).

    A calendar check (``cw``) sends ``calendar_bounds`` around ``around_us`` (this
    machine's clock when None) in place of its window."""
    rate, code = check.rate, check.algorithm.code
    if check.calendar is not None:
        code = CALENDAR_CODE
        window = calendar_bounds(check, around_us)
    else:
        window = f"{rate.window_us:x}"
    code = SHADOW_MARK + code if check.shadow else code
    if check.wait_us and check.calendar is None:  # a calendar window never reserves
        # How long the caller may wait (a reservation, see ``Check.wait_us``), in hex.
        return [f"{code} {rate.limit:x} {window} {rate.capacity:x} {check.cost} {check.wait_us:x}"]
    return [f"{code} {rate.limit:x} {window} {rate.capacity:x} {check.cost}"]


def calendar_bounds(check: Check, around_us: int | None) -> str:
    """``"prev:start:end:next"`` (decimal microseconds): the edges of a calendar check's
    window at ``around_us`` and of its neighbours. The script picks the window its own
    clock (Redis ``TIME``) falls in, so the zone and the calendar stay out of Lua and a
    client clock a little off (less than a window) changes nothing."""
    calendar, unit = check.calendar, check.rate.calendar
    assert calendar is not None and unit is not None
    now = wall_clock_us() if around_us is None else around_us
    return ":".join(str(edge) for edge in calendar.bounds(unit, now))


def _around(now_arg: Any) -> int | None:
    """The time a script's ``now`` argument names (tests), or None for the server's."""
    if isinstance(now_arg, bytes):
        now_arg = now_arg.decode()
    return int(now_arg) if now_arg not in ("", None) else None


def refund_args(checks: Sequence[Check], now_arg: Any, charged_at_us: int) -> list[Any]:
    """ARGV of ``refund.lua``. A calendar check sends, in place of its window, the start
    of the window it was charged in: ``charged_at_us`` is the server's time of the charge."""
    args: list[Any] = [now_arg]
    for check in checks:
        rate, calendar, unit = check.rate, check.calendar, check.rate.calendar
        if calendar is not None and unit is not None:
            start = calendar.span(unit, charged_at_us)[0]
            args += [CALENDAR_CODE, rate.limit, start, rate.capacity, check.cost]
        else:
            args += [check.algorithm.code, rate.limit, rate.window_us, rate.capacity, check.cost]
        args.append(charged_at_us)
    return args


# Read per release: a member read through its class is Enum's slow path.
_LEASE, _CAPACITY = Gate.LEASE, Gate.CAPACITY


def released_leases(checks: Sequence[Check]) -> list[tuple[str, str]] | None:
    """``(set key, member)`` of each check when all of them are leases given back (the
    release after a response), else None. Such a refund is the members leaving their
    sets, one ``ZREM`` each, atomic alone: ``refund.lua`` would define every
    algorithm's undo and read the server clock to run that one command."""
    found = []
    for check in checks:
        if (check.algorithm is not _LEASE and check.algorithm is not _CAPACITY) or check.cost <= 0:
            return None
        found.append(split(check.key))
    return found


def charge_args(checks: Sequence[Check], now_arg: Any, around_us: int | None = None) -> list[Any]:
    """ARGV of ``charge.lua``; a calendar check's window is ``calendar_bounds`` (around
    ``now_arg``'s time, else ``around_us``, else this clock)."""
    args: list[Any] = [now_arg]
    around = _around(now_arg)
    if around is None:
        around = around_us
    for check in checks:
        rate = check.rate
        if check.calendar is not None:
            window: Any = calendar_bounds(check, around)
            args += [CALENDAR_CODE, rate.limit, window, rate.capacity, check.cost]
        else:
            args += [check.algorithm.code, rate.limit, rate.window_us, rate.capacity, check.cost]
    return args


@storage_errors(*REDIS_ERRORS)
class RedisStorage:
    """Counters in Redis. Every key carries a TTL; every decision is one round trip.

    ``clock`` exists for ``flask_quota.testing`` only: production leaves it
    ``None`` so the script reads ``TIME`` on the server, the one clock every
    web server shares. ``host_clock`` is this machine's, around which calendar
    edges are computed (``StorageTime``; tests give a wrong one).
    """

    name = "redis"

    def __init__(
        self, client: redis.Redis, *, clock: Clock | None = None, host_clock: Clock = wall_clock_us
    ) -> None:
        self.client = client
        self._clock = clock
        self._time = StorageTime(host_clock)
        self._script = client.register_script(SCRIPT)
        self._refund = client.register_script(REFUND_SCRIPT)
        self._charge = client.register_script(CHARGE_SCRIPT)
        self._grant: Any = None  # GRANT_SCRIPT, registered at the first grant
        self._decide = _ScriptCall(
            client.connection_pool,
            self._script.sha,
            SCRIPT,
            function=(FUNCTION, LIBRARY),
            time=self._time,
        )

    @classmethod
    def from_url(cls, url: str, *, timeout: float, clock: Clock | None = None) -> RedisStorage:
        """``redis://``, ``rediss://``, ``unix://`` (or ``valkey://``, ``valkeys://``);
        ``clock`` replaces Redis ``TIME`` (tests)."""
        client = redis.Redis.from_url(
            parse_storage_url(url).redis_url,
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
        return verdict_of(checks, self._call("decide", checks, [c.key for c in checks]))

    def decide_flat(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply:
        """``decide`` on ``keys``, answered as the script's flat reply (the request path)."""
        # _call inlined: the request path's one wrapped call, with no call beneath it.
        now = b"" if self._clock is None else b"%d" % self._clock()
        call = self._decide
        try:
            raw = call(call.pack("decide", now, checks, keys))
        except redis.ResponseError as error:
            if not self._time.learn(error):
                raise
            raw = call(call.pack("decide", now, checks, keys))  # edges around its time
        return Reply.read(raw, len(keys))

    def peek(self, checks: Sequence[Check]) -> Verdict:
        """Answer as ``decide`` would without changing anything."""
        return verdict_of(checks, self._call("peek", checks, [c.key for c in checks]))

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        if not checks:
            return
        released = released_leases(checks)
        if released is not None:
            if len(released) == 1:  # the usual release: one lease, one command
                self.client.zrem(*released[0])
            else:
                pipe = self.client.pipeline(transaction=False)
                for set_key, member in released:
                    pipe.zrem(set_key, member)
                pipe.execute()
            return
        now_arg = "" if self._clock is None else self._clock()
        args = refund_args(checks, now_arg, charged_at_us)
        self._refund(keys=[c.key for c in checks], args=args)

    def charge(self, checks: Sequence[Check]) -> None:
        if not checks:
            return
        now_arg = "" if self._clock is None else self._clock()
        keys = [c.key for c in checks]
        try:
            self._charge(keys=keys, args=charge_args(checks, now_arg, self._time.now_us()))
        except redis.ResponseError as error:
            if not self._time.learn(error):
                raise
            self._charge(keys=keys, args=charge_args(checks, now_arg, self._time.now_us()))

    def clear(self, keys: Sequence[str]) -> None:
        """Forget the state of ``keys`` (a reset)."""
        if keys:
            self.client.delete(*keys)

    def block(self, key: str, seconds: int, info: str) -> None:
        self.client.set(key, info, ex=seconds)

    def blocks(self, match: str) -> list[BlockEntry]:
        return read_blocks(self.client, list(self.client.scan_iter(match=match, count=1000)))

    def keys(self, match: str) -> list[str]:
        """Every key matching the glob ``match`` (SCAN: for tests and tools, never a request)."""
        return [_name(key) for key in self.client.scan_iter(match=match, count=1000)]

    def block_info(self, key: str) -> str | None:
        info = self.client.get(key)
        if isinstance(info, bytes):
            return info.decode("utf-8", "replace")
        return info  # None, or a str from a client made with decode_responses

    def claim(self, key: str, seconds: int) -> bool:
        return bool(self.client.set(key, "1", nx=True, ex=seconds))

    def holders(self, key: str) -> list[str]:
        now = self._clock() if self._clock is not None else None
        return read_holders(self.client, key, now)

    def ping(self) -> float:
        """Round-trip latency in seconds; raises ``StorageError`` when down."""
        start = time.perf_counter()
        self.client.ping()
        return time.perf_counter() - start

    def close(self) -> None:
        """Release the backend's connections (or, in memory, its state)."""
        self._decide.close()
        self.client.close()

    def _call(self, mode: str, checks: Sequence[Check], keys: Sequence[str]) -> Reply:
        now = b"" if self._clock is None else b"%d" % self._clock()
        try:
            raw = self._decide(self._decide.pack(mode, now, checks, keys))
        except redis.ResponseError as error:
            if not self._time.learn(error):
                raise
            raw = self._decide(self._decide.pack(mode, now, checks, keys))
        return Reply.read(raw, len(keys))

    def usage_sink(self, prefix: str) -> UsageSink:
        """Dashboard usage in this Redis, shared by every worker (Sentinel inherits it)."""
        return RedisUsageSink(lambda: self.client, prefix, clock=self._clock)

    # -- prepaid credits (flask_quota.credits): off the request path --------------

    def credit_states(self, keys: Sequence[str]) -> list[str | None]:
        """The stored text of each balance (None: not held), in one MGET."""
        found = self.client.mget(keys) if keys else []
        return [v.decode() if isinstance(v, bytes) else v for v in found]

    def credit_seed(self, key: str, text: str, ttl_us: int) -> bool:
        """Put a balance rebuilt from SQL where none is held (NX): True when it was."""
        return bool(self.client.set(key, text, px=max(1, ttl_us // 1000), nx=True))

    def credit_grant(self, key: str, grant: tuple[int, int, int]) -> bool:
        """Add a grant ``(id, expires_us, units)`` to a held balance, once by its id."""
        if self._grant is None:
            self._grant = self.client.register_script(GRANT_SCRIPT)
        now_arg = "" if self._clock is None else self._clock()
        return bool(self._grant(keys=[key], args=[now_arg, *grant]))


_SEPARATOR = CHECKS_SEPARATOR.encode()


def _bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


class _ScriptCall:
    """The decide script's EVALSHA, packed by hand and sent on a connection of our own.

    The request path makes this one call, so it skips what redis-py wraps around
    every command (pool checkout with a readiness poll, retry and metrics hooks,
    argument encoding, the ``Script`` object): most of the call's client time.
    What matters is kept: connections come from the client's pool factory (its
    URL, TLS, timeouts) and connect through ``connect()`` as the pool's do (a
    Sentinel connection asks there for the master); a connection the server
    closed while it sat idle is reconnected before the call is sent (see ``_send``);
    a call that fails half-way disconnects its connection; errors are redis-py's own;
    and a ``NOSCRIPT`` reply (Redis restarted or flushed its scripts) loads the
    script and sends the call once more.

    Given ``function`` (its name and library), the call is an ``FCALL`` instead: a
    function's library is loaded once, so its helpers are not defined again on every
    call as a script's are. A server without the function (a restart, ``FUNCTION
    FLUSH``) gets the library and the call again; a server that has no functions or
    refuses them (Redis 6, an ACL, a proxy) is sent ``EVALSHA`` from then on: one
    way of loading the code per server (see ``_recover``).

    Idle connections wait on a stack shared by every thread: ``list.pop`` and
    ``list.append`` are atomic, so no lock; a server that starts a thread per
    request reuses them rather than opening one per thread. A forked child
    starts with an empty stack: its parent's sockets are not its own.
    """

    def __init__(
        self,
        pool: redis.ConnectionPool,
        sha: str,
        script: str,
        *,
        function: tuple[str, str] | None = None,
        time: StorageTime | None = None,
    ) -> None:
        self._pool = pool
        self._script = script
        self._time = time or StorageTime()
        self._idle: list[Any] = []
        self._spare: list[Any] = []  # disconnected after a failure, to connect afresh
        self._pid = os.getpid()
        self._script_head = b"%b%b" % (_bulk(b"EVALSHA"), _bulk(sha.encode()))
        self._head = self._script_head
        self._library: str | None = None
        if function is not None:
            self._head = b"%b%b" % (_bulk(b"FCALL"), _bulk(function[0].encode()))
            self._library = function[1]
        self._function_head = self._head
        self._modes = {mode: _bulk(mode.encode()) for mode in ("decide", "peek")}
        # (id(rate), id(algorithm), cost, shadow, wait_us) -> (rate, algorithm, the check's encoded
        # string, ``check_args``). Ids, because hashing a Rate or an enum runs Python code; the
        # entry holds the rate and algorithm, so their ids cannot be reused while it lives.
        # Both caches are bounded by generations (costs from a callable can be many), so
        # what is in use stays encoded however many others come and go.
        self._args: Generations[tuple[int, int, int, bool, int], tuple[Any, Any, bytes]] = (
            Generations(_CACHED)
        )
        # id(checks) -> (checks, its checks argument, encoded): a request shape (a tuple the
        # request path reuses, see ``Route``) is encoded once. Held, so the id stays its own.
        self._shapes: Generations[int, tuple[Sequence[Check], bytes | None]] = Generations(_CACHED)
        # id(check) -> (check, the calendar bounds it was encoded for, its arguments).
        self._calendar_args: Generations[int, tuple[Check, tuple[int, ...], bytes]] = Generations(
            _CACHED
        )

    def pack(
        self, mode: str, now: bytes, checks: Sequence[Check], keys: Sequence[str] | None = None
    ) -> bytes:
        """``EVALSHA sha n key... checks [mode now]`` in RESP (``decide_args``), with
        ``keys`` (default: the checks' own) for the checks' keys."""
        if keys is None:
            keys = [c.key for c in checks]
        n = len(checks)
        # The mode and the clock go only when they are not the defaults (a decision on
        # the server clock): every argument is a Lua string the server makes.
        default = mode == "decide" and not now
        parts = [b"*%d\r\n%b$%d\r\n%d\r\n" % (
            n + (4 if default else 6), self._head, len(str(n)), n
        )]  # fmt: skip
        for key in keys:
            encoded = key.encode()
            parts.append(b"$%d\r\n%b\r\n" % (len(encoded), encoded))
        shape = self._shapes.current.get(id(checks))
        if shape is not None and shape[0] is checks and shape[1] is not None:
            parts.append(shape[1])
        else:
            parts.append(self._shape(checks, now))
        if not default:
            parts += (self._modes[mode], _bulk(now))
        return b"".join(parts)

    def _shape(self, checks: Sequence[Check], now: bytes) -> bytes:
        if type(checks) is not tuple:  # a list is made per call: not worth keeping
            return _bulk(_SEPARATOR.join([self._check_args(check, now) for check in checks]))
        found = self._shapes.current.get(id(checks)) or self._shapes.recall(id(checks))
        if found is not None and found[0] is checks and found[1] is not None:
            return found[1]
        args = _bulk(_SEPARATOR.join([self._check_args(check, now) for check in checks]))
        if found is None or found[0] is not checks:
            # A calendar check's arguments follow the clock: kept as "encode each time".
            calendar = any(c.calendar is not None for c in checks)
            self._shapes.put(id(checks), (checks, None if calendar else args))
        return args

    def _check_args(self, check: Check, now: bytes) -> bytes:
        calendar, unit = check.calendar, check.rate.calendar
        if calendar is not None and unit is not None:
            # Encoded again only when the window moves: the calendar hands back the same
            # bounds tuple while the clock stays inside it.
            bounds = calendar.bounds(unit, int(now) if now else self._time.now_us())
            cached = self._calendar_args.current.get(id(check)) or self._calendar_args.recall(
                id(check)
            )
            if cached is not None and cached[0] is check and cached[1] is bounds:
                return cached[2]
            encoded = _SEPARATOR.join(arg.encode() for arg in check_args(check, bounds[1]))
            self._calendar_args.put(id(check), (check, bounds, encoded))
            return encoded
        key = (id(check.rate), id(check.algorithm), check.cost, check.shadow, check.wait_us)
        found = self._args.current.get(key) or self._args.recall(key)
        if found is not None:
            return found[2]
        encoded = _SEPARATOR.join(arg.encode() for arg in check_args(check))
        self._args.put(key, (check.rate, check.algorithm, encoded))
        return encoded

    def __call__(self, packed: bytes) -> Any:
        """Send one packed call and return its reply; redis-py's errors propagate."""
        if self._pid != os.getpid():
            self._idle, self._spare, self._pid = [], [], os.getpid()
        try:
            reused = self._idle.pop()
        except IndexError:
            reused = None
        conn = self._send(reused, packed)
        try:
            try:
                reply = conn.read_response()
            except redis.ResponseError as error:
                reply = self._recover(conn, packed, error)
        except redis.ResponseError:
            self._idle.append(conn)  # the whole reply was read: the connection is clean
            raise
        except BaseException:
            self._broken(conn)  # half-way through a reply: never reuse its socket
            raise
        self._idle.append(conn)
        return reply

    def _recover(self, conn: Any, packed: bytes, error: redis.ResponseError) -> Any:
        """The reply to ``packed`` once the server has our code, if ``error`` says it
        lacks it; otherwise ``error`` is raised. Each error is answered once: the call
        is sent again at most once."""
        if isinstance(error, redis.exceptions.NoScriptError):
            conn.send_command("SCRIPT", "LOAD", self._script)
            conn.read_response()
        elif self._library is None or not packed.startswith(
            self._function_head, packed.index(b"\r\n") + 2
        ):
            raise error
        elif function_missing(error) and self._load_library(conn):
            pass  # a restart or FUNCTION FLUSH: the same FCALL again
        elif function_missing(error) or functions_refused(error):
            # No functions here (or not for us): this server runs the script from now
            # on. Loaded now, so the call below is answered.
            self._head = self._script_head
            conn.send_command("SCRIPT", "LOAD", self._script)
            conn.read_response()
            start = packed.index(b"\r\n") + 2
            packed = packed[:start] + self._head + packed[start + len(self._function_head) :]
        else:
            raise error
        conn.send_packed_command((packed,))
        return conn.read_response()

    def _load_library(self, conn: Any) -> bool:
        """Load the function library on ``conn``; False if the server refuses it."""
        conn.send_command("FUNCTION", "LOAD", "REPLACE", self._library)
        try:
            conn.read_response()
        except redis.ResponseError:
            return False
        return True

    def _send(self, conn: Any, packed: bytes) -> Any:
        """Send ``packed``; return the connection it went out on.

        A reused connection may have been closed by the server since its last call
        (a restart, an idle timeout, a proxy): redis-py's own readiness poll,
        ``can_read``, finds that before anything is sent (it raises on a closed
        socket; True means bytes nobody asked for), and the same connection object
        connects afresh. A send that fails on a reused connection is tried once more
        on a fresh socket. Both are safe because a command that was never sent cannot
        have run. A reply lost *after* the send is not retried, since the script may
        have run: that call fails and ``QUOTA_FAIL_MODE`` decides.

        Connection objects are reused, never replaced: the pool counts every one it
        makes against ``max_connections`` and is never told of one dropped.
        """
        if conn is not None:
            try:
                if not conn.can_read(0):
                    conn.send_packed_command((packed,), check_health=False)
                    return conn
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                pass
            conn.disconnect()
        else:
            try:
                conn = self._spare.pop()  # disconnected by a failure: connects below
            except IndexError:
                conn = self._pool.make_connection()
        try:
            # Through connect(): a Sentinel connection asks there for the master.
            conn.connect()
            conn.send_packed_command((packed,), check_health=False)
        except BaseException:
            self._broken(conn)
            raise
        return conn

    def _broken(self, conn: Any) -> None:
        """Disconnect ``conn`` and keep it apart from the idle ones: every idle
        connection is one whose last call worked (so a dead server costs one connect
        attempt per call, not two)."""
        conn.disconnect()
        self._spare.append(conn)

    def close(self) -> None:
        """Disconnect the idle connections (one in use is closed by its next failure or GC)."""
        idle, self._idle, self._spare = self._idle, [], []
        for conn in idle:
            conn.disconnect()


def function_missing(error: redis.ResponseError) -> bool:
    """An ``FCALL`` of a function the server does not have (Redis and Valkey say so alike)."""
    return "function not found" in str(error).lower()


def functions_refused(error: redis.ResponseError) -> bool:
    """An ``FCALL`` the server will not run: unknown (Redis 6, a proxy) or not allowed
    (an ACL without ``fcall``). Anything else, such as the script's own errors, is not."""
    if isinstance(error, redis.exceptions.NoPermissionError):
        return True
    return "unknown command" in str(error).lower()


def _name(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


def read_holders(client: Any, key: str, now_us: int | None) -> list[str]:
    """The live members of a lease set: those whose expiry is past the server's ``TIME``
    (or ``now_us``, a test clock)."""
    if now_us is None:
        seconds, micros = client.time()
        now_us = seconds * 1_000_000 + micros
    found = client.zrangebyscore(key, f"({now_us}", "+inf")
    return [_name(member) for member in found]


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
            found.append(BlockEntry(_name(key), ttl * 1000, info.decode("utf-8", "replace")))
    return found
