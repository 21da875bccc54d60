"""The four rate-limiting algorithms as pure functions of ``(state, now, rate, cost)``.

No Flask, no Redis, no clock: time is an integer count of microseconds passed in.
The Lua scripts in ``storage/lua/`` mirror these functions line by line, using the
same integer arithmetic, so the memory and Redis backends agree decision for
decision (a property test in ``tests/test_redis.py`` checks it). A function returns a ``Step``: the
outcome, the state to store if every tier of the request allows, and how long that
state stays meaningful (its TTL).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from functools import partial
from typing import Any, NamedTuple

from .clock import US
from .rates import MAX_LIMIT, MAX_WINDOW, Rate

__all__ = [
    "ALGORITHMS",
    "MAX_DEBT_US",
    "MAX_LOG_LIMIT",
    "Algorithm",
    "Gate",
    "Outcome",
    "Step",
    "block_gate",
    "bound_debt",
    "bucket_ceiling",
    "bucket_state",
    "bucket_tat",
    "charged_units",
    "counter_counts",
    "counter_reset",
    "fixed_window",
    "sliding_window_counter",
    "sliding_window_log",
    "token_bucket",
    "unfit",
    "window_step",
]


MAX_DEBT_US = MAX_WINDOW * US
"""How far past empty a charge (``quota.charge``, ``quota.settle``) can put a token
bucket: 366 days of refill, the longest any rate may take (``rates.MAX_WINDOW``).
A window counter holds at most ``MAX_LIMIT`` units past its limit, a sliding log at
most ``limit + 1`` entries. See ``bound_debt``."""


MAX_LOG_LIMIT = 1000
"""The largest limit a sliding log may have. It keeps one entry per unit and Redis
reads them all on every decision, blocking every other caller meanwhile: measured on
redis-server 7.0, a decision with 1,000 entries takes about 0.4 ms of Redis time
(a token bucket's about 0.02 ms), with 10,000 about 5 ms, with 100,000 over 100 ms."""


class Algorithm(StrEnum):
    """The rate-limiting algorithms (``QUOTA_ALGORITHM``), each with a Lua twin."""

    TOKEN_BUCKET = "token_bucket"
    FIXED_WINDOW = "fixed_window"
    SLIDING_WINDOW_LOG = "sliding_window_log"
    SLIDING_WINDOW_COUNTER = "sliding_window_counter"

    @property
    def code(self) -> str:
        """Short tag used in storage keys and Lua arguments."""
        return _CODES[self]


_CODES = {
    Algorithm.TOKEN_BUCKET: "tb",
    Algorithm.FIXED_WINDOW: "fw",
    Algorithm.SLIDING_WINDOW_LOG: "swl",
    Algorithm.SLIDING_WINDOW_COUNTER: "swc",
}


class Gate(StrEnum):
    """Checks that ride along with the tiers but are not rate limits."""

    BLOCK = "block"  # denies while the caller's block key lives (see ``blocking.py``)
    LEASE = "lease"  # takes one of N slots until given back or expired (see ``core/leases.py``)
    # A lease on the fleet's one set of requests in flight (``QUOTA_CAPACITY``): stored and
    # decided as a lease; a gate of its own so the fail mode can give each worker its share.
    CAPACITY = "capacity"
    # A prepaid balance (``core/credits.py``): spent, never refilled by time.
    CREDITS = "credits"

    @property
    def code(self) -> str:
        return _GATE_CODES[self]

    @property
    def leases(self) -> bool:
        """True for a gate decided as a lease: a slot held until given back or expired."""
        return self is Gate.LEASE or self is Gate.CAPACITY


_GATE_CODES = {Gate.BLOCK: "blk", Gate.LEASE: "ls", Gate.CAPACITY: "cap", Gate.CREDITS: "cr"}


class Outcome(NamedTuple):
    """What one tier decided. Times are absolute microseconds.

    A named tuple, not a dataclass: three are made per request, and a tuple is
    built in C (a frozen dataclass sets each field through Python code).
    """

    allowed: bool
    limit: int
    remaining: int
    reset_us: int  # when the tier is fully replenished
    retry_after_us: int  # 0 when allowed; otherwise the wait until this cost would pass


class Step(NamedTuple):
    """An ``Outcome``'s fields, then the state to store if every tier allows and how
    long it matters (its TTL; 0: nothing to store). Flat, so a step is one tuple.

    A denied step stores nothing, but for a TTL above 0: a state repaired on reading
    (a token bucket read through a clock that stepped back), stored whatever the
    decision, since it charges nothing."""

    allowed: bool
    limit: int
    remaining: int
    reset_us: int
    retry_after_us: int
    state: Any
    ttl_us: int

    @property
    def outcome(self) -> Outcome:
        """What the tier decided."""
        return Outcome(*self[:5])


# ``Step(...)`` calls the named tuple's ``__new__``, a Python function; this builds the
# same Step from a tuple of its fields in C (a request takes one Step per tier).
_step = partial(tuple.__new__, Step)


def unfit(algorithm: Algorithm, rate: Rate) -> str | None:
    """Why ``algorithm`` cannot enforce ``rate`` at a bounded cost per decision, or None.

    The one rule where a rate and an algorithm meet: only a sliding log has one, a
    limit of at most ``MAX_LOG_LIMIT``.
    """
    if rate.calendar is not None:
        return None  # always counted as a calendar window, whatever the algorithm
    if algorithm is Algorithm.SLIDING_WINDOW_LOG and rate.limit > MAX_LOG_LIMIT:
        return (
            f"{rate} is too large for sliding_window_log, which keeps one entry per unit "
            f"and reads them all on every decision (at most {MAX_LOG_LIMIT} per window); "
            "use sliding_window_counter (about as exact, three numbers per key) or "
            "token_bucket for this limit"
        )
    return None


BucketState = int | tuple[int, int]
"""A token bucket's stored state: its TAT, or ``(tat, written)`` for a bucket a charge
put into debt (``bucket_state``)."""


def bucket_state(tat: int, now: int, tau: int) -> BucketState:
    """What to store for a bucket whose TAT is ``tat``, written at ``now``.

    A TAT is at most ``tau`` (a full refill) ahead of the clock that wrote it, but for
    a charge into debt: such a state keeps the time it was written, ``(tat, now)``, so
    that a reader can tell debt from its own clock having stepped back (``bucket_tat``).
    """
    return (tat, now) if tat - now > tau else tat


def bucket_tat(state: BucketState | None, now: int, tau: int) -> int | None:
    """The TAT of a stored bucket state, read at ``now``: a state further ahead than it
    could have been written means the storage's clock stepped back since, which then
    costs at most a refill. A plain TAT more than ``tau`` ahead reads as an empty bucket
    (``now + tau``); a debt keeps what was owed when it was charged."""
    if state is None:
        return None
    if type(state) is int:
        return now + tau if state - now > tau else state
    tat, written = state  # type: ignore[misc]
    return tat - (written - now) if now < written else tat


def _stepped_back(state: BucketState, now: int, tau: int) -> bool:
    """True when ``state`` was written by a clock ahead of ``now`` (see ``bucket_tat``)."""
    if type(state) is int:
        return state - now > tau
    return now < state[1]  # type: ignore[index]


def token_bucket(state: BucketState | None, now: int, rate: Rate, cost: int, wait: int = 0) -> Step:
    """GCRA: the state is one "theoretical arrival time" (TAT) per key.

    One token is worth ``interval`` microseconds; the bucket is full when
    ``tat <= now`` and empty when ``tat - now == tau`` (capacity * interval).
    The state is read by ``bucket_tat`` (a clock that stepped back costs at most a
    refill); what it stores is a plain TAT, at most ``tau`` ahead.

    With ``wait`` (microseconds), a cost that fits once the bucket has refilled for at
    most ``wait`` is admitted now as a reservation: the TAT moves past empty (a debt,
    ``bucket_state``) and the step's ``retry_after_us`` is how long the caller must
    sleep before it acts. Later callers queue behind it (FIFO): the debt is theirs too.
    """
    interval = rate.interval_us
    tau = rate.capacity * interval
    repair, repair_ttl = state, 0  # what a denial stores: nothing (TTL 0)
    if state is None or (type(state) is int and state - now <= tau):
        tat = state  # a plain TAT within a refill of now (nearly always): no call
    else:
        tat = bucket_tat(state, now, tau)
        assert tat is not None
        if _stepped_back(state, now, tau):
            # Read through a clock that stepped back: even a denial stores the reading,
            # which charges nothing, so the step is paid once, not at every read.
            repair, repair_ttl = bucket_state(tat, now, tau), tat - now
    base = now if tat is None or tat < now else tat
    if cost > rate.capacity:  # never fits, however long the caller waits: say one window
        remaining = (tau - (base - now)) // interval
        return _step((False, rate.capacity, remaining, base, rate.window_us, repair, repair_ttl))
    new_tat = base + cost * interval
    if new_tat - now <= tau:
        remaining = (tau - (new_tat - now)) // interval
        return _step((True, rate.capacity, remaining, new_tat, 0, new_tat, new_tat - now))
    retry = new_tat - tau - now
    if retry <= wait:  # a reservation: the caller sleeps ``retry`` first
        state = bucket_state(new_tat, now, tau)
        return _step((True, rate.capacity, 0, new_tat, retry, state, new_tat - now))
    remaining = (tau - (base - now)) // interval
    return _step((False, rate.capacity, remaining, base, retry, repair, repair_ttl))


def fixed_window(
    state: tuple[int, int] | None, now: int, rate: Rate, cost: int, wait: int = 0
) -> Step:
    """Counter per window aligned to the epoch; the state is ``(window_start, count)``.

    With ``wait``, a cost that fits in the next window, which starts within ``wait``,
    is reserved there (``window_step``)."""
    window = rate.window_us
    start = now - now % window
    return window_step(state, now, rate.limit, start, start + window, cost, wait)


def window_step(
    state: tuple[int, int] | None,
    now: int,
    limit: int,
    start: int,
    end: int,
    cost: int,
    wait: int = 0,
) -> Step:
    """A fixed window ``[start, end)``'s decision: the epoch-aligned one above, or a
    calendar month or year (``calendar.Calendar``), whose length varies (a calendar
    window never reserves: its next window is that far away).

    A reservation stores the next window's state, ``(end, cost)``: a state that starts
    after ``start`` says this window is full (it was, for the cost that reserved) and
    that later callers queue in the stored window (``_window_ahead``)."""
    if state is not None and state[0] > start:
        return _window_ahead(state, now, limit, end - start, cost, wait)
    count = state[1] if state is not None and state[0] == start else 0
    if count + cost <= limit:
        used = count + cost
        reset = end if used > 0 else now
        return _step((True, limit, limit - used, reset, 0, (start, used), reset - now))
    if wait and 0 < cost <= limit and end - now <= wait:  # reserved in the next window
        length = end - start
        return _step((True, limit, 0, end + length, end - now, (end, cost), end + length - now))
    reset = end if count > 0 else now
    # A cost above the limit never fits; say "one window" rather than "never".
    retry = end - now if cost <= limit else end - start
    return _step((False, limit, limit - count, reset, retry, state, 0))


def _window_ahead(
    state: tuple[int, int], now: int, limit: int, length: int, cost: int, wait: int
) -> Step:
    """A fixed window read before the window its state holds (a reservation's): every
    window before that one is full; callers reserve in it, or in the one after."""
    ahead, count = state
    ttl = ahead + length - now
    if cost == 0:  # takes nothing: admitted now, the state stays
        return _step((True, limit, 0, ahead + length, 0, state, ttl))
    if count + cost <= limit:
        retry = ahead - now
        if retry <= wait:
            return _step((True, limit, 0, ahead + length, retry, (ahead, count + cost), ttl))
    else:
        retry = ahead + length - now if cost <= limit else length
        if cost <= limit and retry <= wait:
            after = (ahead + length, cost)
            return _step((True, limit, 0, ahead + 2 * length, retry, after, ttl + length))
    return _step((False, limit, 0, ahead + length, retry, state, 0))


def sliding_window_log(
    log: tuple[int, ...] | None, now: int, rate: Rate, cost: int, wait: int = 0
) -> Step:
    """One timestamp per unit of cost, oldest first; entries older than a window drop out.

    With ``wait``, a cost that fits within ``wait`` is reserved: its entries carry the
    time it will be admitted, ahead of ``now``, and count from now on. A caller finding
    such entries queues behind them (never admitted before a reservation: FIFO, and the
    log stays in order)."""
    window = rate.window_us
    live = tuple(ts for ts in (log or ()) if ts > now - window)
    count = len(live)
    if live and live[-1] > now and cost:  # callers are waiting: queue behind them
        return _log_reserve(log, live, now, rate, cost, wait)
    if count + cost <= rate.limit:
        new = live + (now,) * cost
        reset = new[-1] + window if new else now
        return _step((True, rate.limit, rate.limit - len(new), reset, 0, new, reset - now))
    reset = live[-1] + window if live else now
    # The request fits once the (count + cost - limit) oldest entries have expired.
    if wait and 0 < cost <= rate.limit:
        return _log_reserve(log, live, now, rate, cost, wait)
    retry = live[count + cost - rate.limit - 1] + window - now if cost <= rate.limit else window
    return _step((False, rate.limit, rate.limit - count, reset, retry, log, 0))


def _log_reserve(
    log: tuple[int, ...] | None, live: tuple[int, ...], now: int, rate: Rate, cost: int, wait: int
) -> Step:
    """A log's reservation: its entries at the time the cost fits (once the oldest
    entries in its way expire), and never before the last waiter's."""
    window, count = rate.window_us, len(live)
    if cost > rate.limit:  # never fits: say one window
        return _step(
            (False, rate.limit, max(0, rate.limit - count), live[-1] + window, window, log, 0)
        )
    over = count + cost - rate.limit  # entries that must expire first
    at = max(live[over - 1] + window if over > 0 else now, live[-1])
    if at - now <= wait:
        new = live + (at,) * cost
        return _step((True, rate.limit, 0, at + window, at - now, new, at + window - now))
    return _step((False, rate.limit, max(0, rate.limit - count), at + window, at - now, log, 0))


def sliding_window_counter(
    state: tuple[int, int, int] | None, now: int, rate: Rate, cost: int, wait: int = 0
) -> Step:
    """Cloudflare's estimate: ``prev * (1 - elapsed/window) + cur``.

    The state is ``(window_start, previous_count, current_count)``. The previous
    window's weighted count is rounded up to a whole unit, in exact integers (the
    Lua twin's ``muldiv`` computes the same where the product passes 2^53).

    With ``wait``, a cost that fits within ``wait`` is reserved: counted now in the
    window it will be admitted in, this one (the previous window's weight decays) or
    the next, whose state is then stored ahead (``_counter_ahead``).
    """
    window = rate.window_us
    start = now - now % window
    if state is not None and state[0] > start:
        return _counter_ahead(state, now, rate, cost, wait)
    prev, cur = counter_counts(state, start, window)
    weighted = -(-prev * (window - (now - start)) // window)
    if weighted + cur + cost <= rate.limit:
        cur += cost
        reset = counter_reset(start, prev, cur, now, window)
        return _step(
            (
                True,
                rate.limit,
                rate.limit - weighted - cur,
                reset,
                0,
                (start, prev, cur),
                reset - now,
            )
        )
    remaining = max(0, rate.limit - weighted - cur)
    retry = _counter_retry(start, prev, cur, now, rate, cost)
    if 0 < cost <= rate.limit and retry <= wait:
        if now + retry < start + window:  # in this window, once the previous one decays
            held = (start, prev, cur + cost)
        else:  # in the next: stored ahead, so this window reads as full
            held = (start + window, cur, cost)
        reset = counter_reset(held[0], held[1], held[2], now, window)
        return _step((True, rate.limit, 0, reset, retry, held, reset - now))
    reset = counter_reset(start, prev, cur, now, window)
    return _step((False, rate.limit, remaining, reset, retry, state, 0))


def _counter_ahead(state: tuple[int, int, int], now: int, rate: Rate, cost: int, wait: int) -> Step:
    """A sliding counter read before the window its state holds (a reservation's): the
    windows before are full; callers reserve in the stored one as its previous
    window's weight decays."""
    window = rate.window_us
    ahead, prev, cur = state
    reset = counter_reset(ahead, prev, cur, now, window)
    if cost == 0:  # takes nothing: admitted now, the state stays
        return _step((True, rate.limit, 0, reset, 0, state, reset - now))
    if cost > rate.limit:  # never fits: say one window
        return _step((False, rate.limit, 0, reset, window, state, 0))
    need = rate.limit - cur - cost  # room the stored window's previous weight must leave
    if need >= 0:  # in the stored window
        at = ahead if need >= prev else ahead + window - need * window // prev
        held = (ahead, prev, cur + cost)
    else:  # in the one after, as the stored window's own count decays
        need = rate.limit - cost
        at = ahead + window if need >= cur else ahead + 2 * window - need * window // cur
        held = (ahead + window, cur, cost)
    retry = max(1, at - now)
    if retry > wait:
        return _step((False, rate.limit, 0, reset, retry, state, 0))
    reset = counter_reset(held[0], held[1], held[2], now, window)
    return _step((True, rate.limit, 0, reset, retry, held, reset - now))


def counter_counts(state: tuple[int, int, int] | None, start: int, window: int) -> tuple[int, int]:
    """The previous and current counts of the window at ``start``.

    One window later the stored current count becomes the previous one; older
    state counts for nothing.
    """
    if state is not None:
        if state[0] == start:
            return state[1], state[2]
        if state[0] == start - window:
            return state[2], 0
    return 0, 0


def counter_reset(start: int, prev: int, cur: int, now: int, window: int) -> int:
    """When a sliding counter with these counts is empty again."""
    if cur > 0:
        return start + 2 * window
    return start + window if prev > 0 else now


def _counter_retry(start: int, prev: int, cur: int, now: int, rate: Rate, cost: int) -> int:
    """Earliest wait after which the weighted estimate leaves room for ``cost``."""
    window = rate.window_us
    need = rate.limit - cur - cost
    if need >= 0:  # this window: wait for the previous window's weight to decay
        return max(1, start + window - need * window // prev - now)
    need = rate.limit - cost
    if need < 0:
        return window
    # Next window: today's count becomes the decaying "previous" one.
    return max(1, start + 2 * window - need * window // cur - now)


def bucket_ceiling(rate: Rate, now: int) -> int:
    """The latest TAT a charge may leave on a token bucket: empty, plus ``MAX_DEBT_US``."""
    return now + rate.capacity * rate.interval_us + MAX_DEBT_US


def charged_units(algorithm: Algorithm, rate: Rate, cost: int) -> int:
    """The units of a charge worth applying: a log keeps its newest ``limit + 1`` entries
    (see ``bound_debt``), so a larger charge is pushed as that many."""
    if algorithm is Algorithm.SLIDING_WINDOW_LOG:
        return min(cost, rate.limit + 1)
    return cost


def bound_debt(
    algorithm: Algorithm, state: Any, ttl_us: int, now: int, rate: Rate
) -> tuple[Any, int]:
    """The state (and TTL) a charge left, brought within the debt a charge may leave.

    Without a bound, ``quota.charge(10**14)`` on a 100/minute bucket owes 1.9 million
    years, and Lua, whose ``%d`` wraps past 2^63, stored a negative time (the debt
    forgiven). With it every stored number stays below 2^53, where Lua is exact:

    - token bucket: the TAT is at most ``bucket_ceiling`` (366 days of debt);
    - fixed window, sliding counter: the window's count is at most ``limit + MAX_LIMIT``;
      the debt ends with the window (two for the counter) anyway;
    - sliding log: the newest ``limit + 1`` entries. Dropping older ones changes no
      decision: with more than ``limit`` live entries any cost is denied until the
      newest ``limit + 1`` thin out, and the entry that decides the wait is among them.
      Only ``remaining`` stops at -1 instead of going further below zero.

    ``lua/charge.lua`` applies the same bounds.
    """
    if algorithm is Algorithm.TOKEN_BUCKET:
        ceiling = bucket_ceiling(rate, now)
        tau = rate.capacity * rate.interval_us
        tat = bucket_tat(state, now, tau)
        assert tat is not None
        if tat > ceiling:
            return bucket_state(ceiling, now, tau), ceiling - now
        return state, ttl_us
    if algorithm is Algorithm.FIXED_WINDOW:
        start, count = state
        return (start, min(count, rate.limit + MAX_LIMIT)), ttl_us
    if algorithm is Algorithm.SLIDING_WINDOW_COUNTER:
        start, prev, cur = state
        return (start, prev, min(cur, rate.limit + MAX_LIMIT)), ttl_us
    return state[-(rate.limit + 1) :], ttl_us


def block_gate(state: tuple[int, str] | None, now: int, rate: Rate, cost: int) -> Step:
    """Denied until the block ends; the state is ``(until, info)``. Never stores anything."""
    until = state[0] if state is not None else 0
    if until > now:
        return _step((False, 0, 0, until, until - now, state, 0))
    return _step((True, 0, 0, now, 0, None, 0))


ALGORITHMS: dict[Algorithm | Gate, Callable[[Any, int, Rate, int], Step]] = {
    Algorithm.TOKEN_BUCKET: token_bucket,
    Algorithm.FIXED_WINDOW: fixed_window,
    Algorithm.SLIDING_WINDOW_LOG: sliding_window_log,
    Algorithm.SLIDING_WINDOW_COUNTER: sliding_window_counter,
    Gate.BLOCK: block_gate,
}
