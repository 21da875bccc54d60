"""Each process's sync thread: it keeps the served snapshot current, and says how current.

The thread (``supervise``) runs one attempt at a time in a short-lived thread of its
own and watches it, so a database that hangs is noticed and logged like one that
fails, once per change of state. What an attempt does (set up the tables, reload if
the version moved) and what is logged are the store's (``Synced``); the timing is here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["FIRST_LOAD_GRACE", "STALE_AFTER", "Sync", "SyncHealth", "Synced", "supervise"]

log = logging.getLogger("flask_quota")

STALE_AFTER = 5.0  # seconds without a confirmed sync before the snapshot counts as stale
# API-key requests arriving this soon after the sync started wait (at most that long)
# for the first load, so a healthy database verifies keys from the very first request.
FIRST_LOAD_GRACE = 1.0


@dataclass(frozen=True)
class SyncHealth:
    """How current this process's copy of the quota tables is (``SqlStore.health()``)."""

    started: bool  # the sync runs in this process
    loaded: bool  # a snapshot from the database is served (else: the configured plans)
    age: float | None  # seconds since it was last confirmed current (or since start)
    stale: bool  # age beyond STALE_AFTER: changes made since may not apply here
    stale_events: int  # how often it went stale in this process
    error: str | None  # why the last sync attempt failed, while they fail


class Sync:
    """One process's sync thread and what it has observed (reset at fork)."""

    def __init__(self) -> None:
        self.started_at = time.monotonic()
        self.error: str | None = None
        self.first_done = threading.Event()  # the first attempt ended, well or not
        self.stop = threading.Event()
        self.failing = False  # as last logged
        self.stale = False  # as last logged
        self.stale_events = 0
        self.thread: threading.Thread | None = None  # the supervisor
        self.attempt: threading.Thread | None = None  # the attempt it watches


class Synced(Protocol):
    """What the sync thread drives: the store (``SqlStore``)."""

    def _attempt(self, sync: Sync) -> None: ...

    def _observe(self, sync: Sync, running_for: float) -> None: ...


def supervise(ref: Callable[[], Synced | None], sync: Sync, interval: float) -> None:
    """Body of each process's sync thread; it ends when its store is closed or collected
    (``ref`` is a weak reference to it).

    Each attempt runs in a short-lived thread of its own, one at a time: an attempt
    stuck on a hung database delays no other work, and is seen and logged here.
    """
    attempt_began = 0.0
    while True:
        store = ref()
        if store is None:
            return
        try:
            if sync.attempt is None or not sync.attempt.is_alive():
                sync.attempt = threading.Thread(
                    target=store._attempt,
                    args=(sync,),
                    name="flask-quota-sync-attempt",
                    daemon=True,
                )
                attempt_began = time.monotonic()
                sync.attempt.start()
            store._observe(sync, time.monotonic() - attempt_began)
        except Exception:  # the thread must outlive anything
            log.exception("flask-quota: the quota sync thread hit an error")
        finally:
            del store
        if sync.stop.wait(interval):
            return
