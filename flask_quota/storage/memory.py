"""In-process backend: exact under threads, bounded by expiry. One process only."""

from __future__ import annotations

import fnmatch
import heapq
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..core.adjust import CHARGES, REFUNDS, Change, charge_window, refund_window
from ..core.algorithms import (
    ALGORITHMS,
    Algorithm,
    Gate,
    Step,
    block_gate,
    bound_debt,
    charged_units,
    window_step,
)
from ..core.calendar import Calendar
from ..core.credits import TTL_US, Balance, Grant, add_grant, credits_step, dump, parse
from ..core.credits import charge as credit_charge
from ..core.credits import refund as credit_refund
from ..core.generations import Generations
from ..core.leases import lease_step, release, split
from ..core.rates import Rate
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
from .usage import MemoryUsageSink, UsageSink

__all__ = ["MemoryStorage"]

# A check as the decision loop reads it: its algorithm's step function, rate, cost, shadow flag.
_Shape = tuple[Callable[[Any, int, Rate, int], Step], Rate, int, bool]
_SLOT_US = 1_000_000  # expiry is swept in one-second slots
_COMPACT_MIN = 4096  # tables smaller than this are never rebuilt
_SHAPES = 2048  # request shapes per generation of the shape cache


@storage_errors()  # no client: its only errors are defects, which the guard handles
class MemoryStorage:
    """Counters in a dict guarded by one lock.

    One lock makes every multi-tier decision atomic, which is what "exact"
    means here; under the GIL a finer lock would buy little. Expired keys are
    dropped in one-second slots so memory follows the active key set.
    """

    name = "memory"

    def __init__(self, clock: Clock = wall_clock_us) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[str, tuple[Any, int]] = {}  # key -> (state, expires_at_us)
        self._slots: dict[int, set[str]] = {}  # slot -> keys expiring in it
        self._slot_heap: list[int] = []
        self._high = 0  # most keys seen at a sweep since the tables were last rebuilt
        # id(checks) -> (checks, its steps): a request shape reused across requests
        # (a tuple, see ``Route``) has its algorithm functions looked up once. Held, so
        # the id stays its own; bounded by generations, so shapes in use stay cached.
        self._shapes: Generations[int, tuple[Sequence[Check], list[_Shape]]] = Generations(_SHAPES)

    def __len__(self) -> int:
        return len(self._data)

    def decide(self, checks: Sequence[Check]) -> Verdict:
        """Charge every check if all of them allow; otherwise charge none."""
        return verdict_of(checks, self._run(checks, [c.key for c in checks], commit=True))

    def peek(self, checks: Sequence[Check]) -> Verdict:
        """Answer as ``decide`` would without changing anything."""
        return verdict_of(checks, self._run(checks, [c.key for c in checks], commit=False))

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        with self._lock:
            now = self._clock()
            for check in checks:
                if check.algorithm in _LEASES:
                    self._release(check.key, now)
                elif check.algorithm is Gate.CREDITS and check.cost > 0:
                    self._credit(check.key, credit_refund(self._live(check.key, now), now,
                                                          check.cost), now)  # fmt: skip
                elif check.cost > 0 and isinstance(check.algorithm, Algorithm):
                    state = self._live(check.key, now)
                    calendar, unit = check.calendar, check.rate.calendar
                    if calendar is not None and unit is not None:
                        start = calendar.span(unit, charged_at_us)[0]
                        change = refund_window(state, check.cost, start)
                    else:
                        refund = REFUNDS[check.algorithm]
                        change = refund(state, now, check.rate, check.cost, charged_at_us)
                    if change is not None:
                        self._apply(check.key, change, now)

    def charge(self, checks: Sequence[Check]) -> None:
        with self._lock:
            now = self._clock()
            self._sweep(now)
            for check in checks:
                algorithm, rate = check.algorithm, check.rate
                if algorithm is Gate.CREDITS and check.cost > 0:
                    self._credit(check.key, credit_charge(self._live(check.key, now), now,
                                                          check.cost), now)  # fmt: skip
                if check.cost > 0 and isinstance(algorithm, Algorithm):
                    state = self._live(check.key, now)
                    cost = charged_units(algorithm, rate, check.cost)
                    if check.calendar is not None and rate.calendar is not None:
                        start, end = check.calendar.span(rate.calendar, now)
                        change = charge_window(state, now, cost, start, end)
                    else:
                        change = CHARGES[algorithm](state, now, rate, cost)
                    if change.state is not None and change.ttl_us is not None:
                        change = Change(
                            *bound_debt(algorithm, change.state, change.ttl_us, now, rate)
                        )
                    self._apply(check.key, change, now)

    def clear(self, keys: Sequence[str]) -> None:
        """Forget the state of ``keys`` (a reset)."""
        with self._lock:
            for key in keys:
                self._drop(key)

    def block(self, key: str, seconds: int, info: str) -> None:
        with self._lock:
            now = self._clock()
            until = now + seconds * 1_000_000
            self._store(key, (until, info), until - now, now)

    def blocks(self, match: str) -> list[BlockEntry]:
        with self._lock:
            now = self._clock()
            return [
                BlockEntry(key, state[0] - now, state[1])
                for key, (state, expires) in self._data.items()
                if expires > now and fnmatch.fnmatchcase(key, match)
            ]

    def block_info(self, key: str) -> str | None:
        with self._lock:
            found = self._data.get(key)
            if found is None or found[1] <= self._clock():
                return None
            info: str = found[0][1]
            return info

    def claim(self, key: str, seconds: int) -> bool:
        with self._lock:
            now = self._clock()
            found = self._data.get(key)
            if found is not None and found[1] > now:
                return False
            until = now + seconds * 1_000_000
            self._store(key, (until, "claimed"), until - now, now)
            return True

    def holders(self, key: str) -> list[str]:
        with self._lock:
            now = self._clock()
            live = self._live(key, now) or ()
            return [member for expires, member in live if expires > now]

    def ping(self) -> float:
        """Always 0: there is no round trip."""
        return 0.0

    def close(self) -> None:
        """Forget every key."""
        with self._lock:
            self._data.clear()
            self._slots.clear()
            self._slot_heap.clear()

    def sweep(self) -> None:
        """Drop expired keys now (``decide`` also does it as time passes)."""
        with self._lock:
            self._sweep(self._clock())

    def decide_flat(
        self, checks: Sequence[Check], keys: Sequence[str], *, commit: bool = True
    ) -> Reply:
        """``decide`` on ``keys``, as a flat ``Reply`` (the request path); with ``commit``
        False, ``peek``'s answer (nothing changes)."""
        found = self._shapes.current.get(id(checks))
        shape = found[1] if found is not None and found[0] is checks else self._shape(checks)
        with self._lock:
            now = self._clock()
            heap = self._slot_heap
            if heap and heap[0] <= now // _SLOT_US:
                self._sweep(now)
            data = self._data
            get, gate = data.get, block_gate  # locals: read once per check
            reply = Reply((now, 1))
            admitted = True  # what reply.all_allowed says, kept in a local
            writes = []  # (key, state, ttl) of each check that allowed
            for key, (step_of, rate, cost, shadow) in zip(keys, shape, strict=True):
                entry = get(key)
                if entry is None and step_of is gate:  # no block: what block_gate(None) says
                    reply += (1, 0, now, 0)
                    continue
                if step_of is _LEASE:  # the key names a lease set and this request's member
                    key, member = split(key)
                    held = get(key)
                    live = held[0] if held is not None and held[1] > now else None
                    step = lease_step(live, now, rate, cost, member)
                    entry = held if cost else None  # a look (cost 0) writes nothing
                else:
                    live = entry[0] if entry is not None and entry[1] > now else None
                    step = step_of(live, now, rate, cost)
                allowed, _, remaining, reset, retry, state, ttl = step
                reply += (1 if allowed else 0, remaining, reset, retry)
                if allowed:  # a shadow check that would deny is not charged
                    if ttl > 0 or entry is not None:  # else: nothing stored, nothing to drop
                        writes.append((key, state, ttl))
                else:
                    if ttl > 0 and commit:  # a repair, not a charge (see ``Step``)
                        self._store(key, state, ttl, now)
                    if not shadow:
                        reply.deny_all()
                        admitted = False
            if commit and admitted:
                slots = self._slots
                for key, state, ttl in writes:
                    if ttl <= 0:
                        self._drop(key)
                        continue
                    expires = now + ttl
                    # Read again, not taken from the loop above: two checks may share a key.
                    old = get(key)
                    data[key] = (state, expires)
                    # Keys expire in one-second slots: re-file the key only when its slot moves.
                    slot = expires // _SLOT_US + 1
                    if old is not None:
                        old_slot = old[1] // _SLOT_US + 1
                        if slot == old_slot:
                            continue
                        slots[old_slot].discard(key)
                    filed = slots.get(slot)
                    if filed is None:
                        self._file(key, slot)
                    else:
                        filed.add(key)
            return reply

    # ``decide`` and ``peek`` run this one: a subclass's own ``decide_flat`` changes neither.
    _run = decide_flat

    def _shape(self, checks: Sequence[Check]) -> list[_Shape]:
        if type(checks) is not tuple:  # a list is made per call: not worth keeping
            return [(_step_of(c), c.rate, c.cost, c.shadow) for c in checks]
        found = self._shapes.recall(id(checks))
        if found is not None and found[0] is checks:
            return found[1]
        shape = [(_step_of(c), c.rate, c.cost, c.shadow) for c in checks]
        self._shapes.put(id(checks), (checks, shape))
        return shape

    def _release(self, key: str, now: int) -> None:
        """Give a lease back: its member leaves the set."""
        set_key, member = split(key)
        state, ttl = release(self._live(set_key, now), now, member)
        self._store(set_key, state, ttl, now)

    def _live(self, key: str, now: int) -> Any:
        entry = self._data.get(key)
        return entry[0] if entry is not None and entry[1] > now else None

    def _apply(self, key: str, change: Change, now: int) -> None:
        if change.state is None:
            self._drop(key)
        elif change.ttl_us is None:  # same expiry: only the state changes
            entry = self._data.get(key)
            if entry is not None:
                self._data[key] = (change.state, entry[1])
        else:
            self._store(key, change.state, change.ttl_us, now)

    def _store(self, key: str, state: Any, ttl_us: int, now: int) -> None:
        if ttl_us <= 0:
            self._drop(key)
            return
        expires = now + ttl_us
        old = self._data.get(key)
        self._data[key] = (state, expires)
        slot, old_slot = expires // _SLOT_US + 1, (old[1] // _SLOT_US + 1) if old else None
        if slot == old_slot:
            return
        if old_slot is not None:
            self._slots[old_slot].discard(key)
        self._file(key, slot)

    def _file(self, key: str, slot: int) -> None:
        """Put ``key`` in the expiry slot ``slot``."""
        keys = self._slots.get(slot)
        if keys is None:
            keys = self._slots[slot] = set()
            heapq.heappush(self._slot_heap, slot)
        keys.add(key)

    def _drop(self, key: str) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self._slots[old[1] // _SLOT_US + 1].discard(key)

    def _sweep(self, now: int) -> None:
        # A key in slot s expired before s * _SLOT_US, so the whole slot can go.
        current = now // _SLOT_US
        heap = self._slot_heap
        if not heap or heap[0] > current:
            return
        data = self._data
        self._high = max(self._high, len(data))
        while heap and heap[0] <= current:
            for key in self._slots.pop(heapq.heappop(heap)):
                del data[key]
        # A dict keeps its table when keys are deleted: after a burst of keys has
        # expired, copy the survivors so the memory goes back (amortised O(1):
        # only after the key count fell to a quarter).
        if self._high >= _COMPACT_MIN and len(data) * 4 <= self._high:
            self._data = dict(data)
            self._slots = dict(self._slots)
            self._high = len(data)

    def usage_sink(self, prefix: str) -> UsageSink:
        """Dashboard usage stays in this process, on this storage's clock."""
        return MemoryUsageSink(clock=self._clock)

    # -- prepaid credits (flask_quota.credits): off the request path --------------

    def credit_states(self, keys: Sequence[str]) -> list[str | None]:
        """The stored text of each balance (None: not held)."""
        with self._lock:
            now = self._clock()
            return [None if (b := self._live(key, now)) is None else dump(b) for key in keys]

    def credit_seed(self, key: str, text: str, ttl_us: int) -> bool:
        """Put a balance rebuilt from SQL where none is held: True when it was."""
        with self._lock:
            now = self._clock()
            if self._live(key, now) is not None:
                return False
            self._store(key, parse(text), ttl_us, now)
            return True

    def credit_grant(self, key: str, grant: tuple[int, int, int]) -> bool:
        """Add a grant ``(id, expires_us, units)`` to a held balance, once by its id."""
        with self._lock:
            now = self._clock()
            state = self._live(key, now)
            added = None if state is None else add_grant(state, now, Grant(*grant, grant[2]))
            self._credit(key, added, now)
            return added is not None

    def _credit(self, key: str, state: Balance | None, now: int) -> None:
        """Store a balance changed off the decision path (None: nothing changed)."""
        if state is not None:
            self._store(key, state, TTL_US, now)


def _lease(state: Any, now: int, rate: Rate, cost: int) -> Step:  # pragma: no cover
    """Marks a lease check in a shape: ``_run`` calls ``lease_step`` with its member."""
    raise AssertionError("a lease is decided with its member")


_LEASE = _lease
_LEASES = (Gate.LEASE, Gate.CAPACITY)  # decided as leases (``lease_step``)


def _step_of(check: Check) -> Callable[[Any, int, Rate, int], Step]:
    """The step function deciding ``check``: its algorithm's, or for a calendar rate a
    fixed window whose edges the calendar gives at the storage's ``now``."""
    if check.algorithm in _LEASES:
        return _LEASE
    if check.algorithm is Gate.CREDITS:
        return credits_step  # a prepaid balance (core/credits.py), stored as a Balance
    calendar, unit = check.calendar, check.rate.calendar
    if calendar is None or unit is None:
        step = ALGORITHMS[check.algorithm]
        # A caller who may wait (a reservation): the step with its wait, made once per shape.
        return partial(step, wait=check.wait_us) if check.wait_us else step  # type: ignore[call-arg]
    return _calendar_step(calendar, unit)  # a calendar window never reserves


def _calendar_step(calendar: Calendar, unit: str) -> Callable[[Any, int, Rate, int], Step]:
    def step(state: Any, now: int, rate: Rate, cost: int) -> Step:
        _, start, end, _ = calendar.bounds(unit, now)
        return window_step(state, now, rate.limit, start, end, cost)

    return step
