"""Corrections after a decision: refund a charge, or charge without asking.

Pure functions of ``(state, now, rate, cost)`` like ``algorithms.py``, one per
algorithm and state shape. ``lua/refund.lua`` and ``lua/charge.lua`` mirror
them for Redis. A refund undoes a charge made at ``charged_at`` (a
``charge_when`` that said no); a forced charge adds ``cost`` even past the
limit (``quota.charge(n)``), so the bucket goes into debt and the next request
waits until it is paid off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .algorithms import (
    Algorithm,
    BucketState,
    bucket_state,
    bucket_tat,
    counter_counts,
    counter_reset,
)
from .rates import Rate

__all__ = ["CHARGES", "REFUNDS", "Change", "charge_window", "refund_window"]


@dataclass(frozen=True, slots=True)
class Change:
    """A key's new state. ``state`` None drops the key; ``ttl_us`` None keeps its expiry."""

    state: Any
    ttl_us: int | None


def refund_bucket(
    state: BucketState | None, now: int, rate: Rate, cost: int, charged_at: int
) -> Change | None:
    """GCRA cannot be undone exactly once others charged: take back the charge minus
    the time since it was made, an upper bound that never over-credits. A reservation
    (``wait``) is charged at the time it is admitted, ahead of the decision: given back
    before then, it was never spent, and comes back whole."""
    tau = rate.capacity * rate.interval_us
    tat = bucket_tat(state, now, tau)
    if tat is None or tat <= now:
        return None  # full again: the charge is gone
    credit = cost * rate.interval_us - max(0, now - charged_at)
    if credit <= 0:
        return None
    new_tat = tat - credit
    if new_tat <= now:
        return Change(None, None)
    return Change(bucket_state(new_tat, now, tau), new_tat - now)


def refund_fixed(
    state: tuple[int, int] | None, now: int, rate: Rate, cost: int, charged_at: int
) -> Change | None:
    window = rate.window_us
    start = charged_at - charged_at % window
    return refund_window(state, cost, start, ahead=start > now - now % window)


def refund_window(
    state: tuple[int, int] | None, cost: int, start: int, *, ahead: bool = False
) -> Change | None:
    """A fixed window's refund of a charge made in the window starting at ``start``. A
    window ``ahead`` of now (a reservation's) keeps its state even at 0: it also says
    the windows before it are full (``algorithms.window_step``)."""
    if state is None or state[0] != start:
        return None  # that window is over
    count = max(0, state[1] - cost)
    return Change((state[0], count) if count or ahead else None, None)


def refund_log(
    log: tuple[int, ...] | None, now: int, rate: Rate, cost: int, charged_at: int
) -> Change | None:
    """Entries are bare timestamps: the first ``cost`` equal to ours are ours to drop."""
    if not log or charged_at not in log:
        return None
    kept, left = [], cost
    for ts in log:
        if left and ts == charged_at:
            left -= 1
        else:
            kept.append(ts)
    return Change(tuple(kept) if kept else None, None)


def refund_counter(
    state: tuple[int, int, int] | None, now: int, rate: Rate, cost: int, charged_at: int
) -> Change | None:
    if state is None:
        return None
    window = rate.window_us
    start, prev, cur = state
    charged_start = charged_at - charged_at % window
    if start == charged_start:
        cur = max(0, cur - cost)  # still the current window
    elif start == charged_start + window:
        prev = max(0, prev - cost)  # the window rolled: our charge is now "previous"
    elif start + window == charged_at:
        # A reservation admitted as the window it is counted in ends (the previous
        # weight gone at the boundary: ``algorithms.sliding_window_counter``).
        cur = max(0, cur - cost)
    else:
        return None
    return Change((start, prev, cur) if prev or cur else None, None)


def charge_bucket(state: BucketState | None, now: int, rate: Rate, cost: int) -> Change:
    """The TAT moves forward by ``cost`` tokens, past the bucket's depth if need be (a
    debt, stored with the time it was charged: ``algorithms.bucket_state``)."""
    tau = rate.capacity * rate.interval_us
    tat = bucket_tat(state, now, tau)
    base = now if tat is None or tat < now else tat
    new_tat = base + cost * rate.interval_us
    if new_tat <= now:
        return Change(None, None)
    return Change(bucket_state(new_tat, now, tau), new_tat - now)


def charge_fixed(state: tuple[int, int] | None, now: int, rate: Rate, cost: int) -> Change:
    window = rate.window_us
    start = now - now % window
    return charge_window(state, now, cost, start, start + window)


def charge_window(
    state: tuple[int, int] | None, now: int, cost: int, start: int, end: int
) -> Change:
    """A fixed window ``[start, end)``'s forced charge (epoch-aligned or calendar). A
    state held ahead (a reservation's, ``algorithms.window_step``) takes it there."""
    if state is not None and state[0] > start:
        return Change((state[0], state[1] + cost), None)
    count = state[1] if state is not None and state[0] == start else 0
    return Change((start, count + cost), end - now)


def charge_log(log: tuple[int, ...] | None, now: int, rate: Rate, cost: int) -> Change:
    window = rate.window_us
    live = tuple(ts for ts in (log or ()) if ts > now - window)
    at = max(now, live[-1]) if live else now  # behind any reservation: the log stays in order
    new = live + (at,) * cost
    return Change(new, new[-1] + window - now) if new else Change(None, None)


def charge_counter(state: tuple[int, int, int] | None, now: int, rate: Rate, cost: int) -> Change:
    window = rate.window_us
    if state is not None and state[0] > now - now % window:  # held ahead: charged there
        return Change((state[0], state[1], state[2] + cost), None)
    start = now - now % window
    prev, cur = counter_counts(state, start, window)
    cur += cost
    reset = counter_reset(start, prev, cur, now, window)
    return Change((start, prev, cur), reset - now) if reset > now else Change(None, None)


REFUNDS: dict[Algorithm, Callable[[Any, int, Rate, int, int], Change | None]] = {
    Algorithm.TOKEN_BUCKET: refund_bucket,
    Algorithm.FIXED_WINDOW: refund_fixed,
    Algorithm.SLIDING_WINDOW_LOG: refund_log,
    Algorithm.SLIDING_WINDOW_COUNTER: refund_counter,
}

CHARGES: dict[Algorithm, Callable[[Any, int, Rate, int], Change]] = {
    Algorithm.TOKEN_BUCKET: charge_bucket,
    Algorithm.FIXED_WINDOW: charge_fixed,
    Algorithm.SLIDING_WINDOW_LOG: charge_log,
    Algorithm.SLIDING_WINDOW_COUNTER: charge_counter,
}
