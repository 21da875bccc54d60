"""Waiting for room instead of refusing: ``delay=`` on a view, ``wait=`` on ``quota.limited``.

A caller who may wait asks the storage once, with how long (``Check.wait_us``). A cost
that fits within that is reserved there, in the same atomic call as any other check:
counted from now, admitted at the time the reply names (``Reply.wait_us``). Later
callers see the reservation and queue behind it, so waiters of one bucket are admitted
in the order the storage saw them, across processes and servers, at the bucket's rate,
and two waiters never take the same unit. The caller then sleeps until its own time:
one storage call per admission, no polling, and no herd waking at once (each waiter
has its own time, so no jitter is needed to spread them). A caller whose cost does not
fit within its wait is refused at once, with the time it would have had to wait.

A waiter interrupted while it sleeps (a worker timeout, a task revoked) gives its
reservation back: it takes nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from .clock import US

__all__ = ["MAX_DELAY", "delay_us", "sleep_reserved", "wait_us"]

log = logging.getLogger("flask_quota")

MAX_DELAY = 5.0
"""The longest ``delay=`` a view may have, in seconds. A delayed request holds its
worker (a sync worker, or a thread of a threaded one) while it sleeps, and a worker
held is capacity every other caller loses: past a few seconds, a 429 with
``Retry-After`` lets the client wait without holding the server."""

MAX_WAIT = 366 * 24 * 3600.0  # the longest window a rate may have (``rates.MAX_WINDOW``)


def _seconds(name: str, value: object, most: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{name} takes a number of seconds, got {value!r}")
    if not 0 <= value <= most:
        raise ValueError(f"{name} takes from 0 to {most:g} seconds, got {value!r}")
    return float(value)


def delay_us(seconds: object) -> int:
    """``delay=`` checked, in microseconds: 0 to ``MAX_DELAY`` seconds (see there)."""
    return round(_seconds("delay=", seconds, MAX_DELAY) * US)


def wait_us(seconds: object) -> int:
    """``wait=`` checked, in microseconds: 0 up to a year (a caller outside a request,
    such as a task, chooses what it may be held for)."""
    return round(_seconds("wait=", seconds, MAX_WAIT) * US)


def sleep_reserved(
    wait: int, give_back: Callable[[], None], sleep: Callable[[float], None] = time.sleep
) -> None:
    """Sleep ``wait`` microseconds, the time a reservation is admitted at. Interrupted
    (any exception, ``KeyboardInterrupt`` and a task's time limit included), the
    reservation is given back first (``give_back``) and the interruption goes on; a
    give-back that fails is logged, never raised over it."""
    try:
        sleep(wait / US)
    except BaseException:
        try:
            give_back()
        except Exception:  # the storage down: the reservation stays counted
            log.warning("flask-quota: a cancelled wait could not give its reservation back")
        raise
