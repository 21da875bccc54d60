"""Usage recording for the dashboard: allowed/denied counts per minute, tier and identity.

Nothing here touches the request's storage round trip: ``UsageRecorder.record``
only bumps in-process counters; a background thread flushes them to a sink
(``storage/usage.py``) about once a second (on Redis, one script call per minute
and 500 callers in the flush). The first count after a quiet interval is flushed at
once, so the dashboard shows a request within its poll, not a poll plus a flush.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping

from .storage.usage import (
    REQUESTS,
    US_PER_MINUTE,
    Batch,
    Mark,
    MemoryUsageSink,
    UsageHost,
    UsageSink,
)

__all__ = ["UsageRecorder", "usage_sink"]

log = logging.getLogger("flask_quota")


def usage_sink(storage: object, prefix: str) -> UsageSink:
    """The sink ``storage`` hosts; a storage that hosts none gets an in-process one.

    A wrapper (the deny cache, the fail-mode guard) hosts what the ``storage`` it
    wraps hosts: it is looked through here instead of each wrapper passing it on.
    """
    while not isinstance(storage, UsageHost):
        storage = getattr(storage, "storage", None)
        if storage is None:
            return MemoryUsageSink()
    return storage.usage_sink(prefix)


class UsageRecorder:
    """Aggregates per-request outcomes in-process and flushes them in the background.

    Counts are stamped with the sink's ``stamp`` clock and filed by the storage's
    clock, so a test that freezes the storage's clock moves usage with it, and two
    servers whose clocks differ file one request under the same minute. At most ``max_pending``
    counts wait for a flush; more are dropped, never held.
    """

    def __init__(self, sink: UsageSink, *, interval: float = 1.0, max_pending: int = 50_000):
        self.sink = sink
        self.interval = interval
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: Batch = {}
        self._plans: dict[str, str] = {}
        self._dropped = 0
        self._thread_pid: int | None = None
        self._wake = threading.Event()  # set by the first count into an empty batch
        self._flushing = threading.Lock()  # the sink gets batches one at a time, in order
        self._sent = -math.inf  # time.monotonic() of the last flush that carried counts

    def record(
        self,
        identity: str,
        plan: str,
        outcomes: Iterable[tuple[str, Mark]],
        units: Mapping[str, int] | None = None,
    ) -> None:
        """Count one request: ``outcomes`` is (tier name, mark) per applied tier; the
        request was admitted unless a tier is marked False (denied). ``units`` gives a
        tier the units it counts (a resource's tokens), 1 otherwise; the request itself
        counts 1 whatever it weighs."""
        minute = self.sink.stamp() // US_PER_MINUTE
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self._dropped += 1  # the sink is unreachable or slow; drop, never grow
                return
            wake = not self._pending
            admitted = True
            for tier, mark in outcomes:
                key = (minute, identity, tier, mark)
                n = 1 if units is None else units.get(tier, 1)
                self._pending[key] = self._pending.get(key, 0) + n
                admitted = admitted and mark is not False
            key = (minute, identity, REQUESTS, admitted)
            self._pending[key] = self._pending.get(key, 0) + 1
            self._plans[identity] = plan
        if self._thread_pid != os.getpid():
            self._start()
        elif wake:  # at most once a flush: the rest of a busy interval skips this
            self._wake.set()

    def flush(self) -> None:
        """Hand the pending counts to the sink (also when there are none: it may age out)."""
        with self._flushing:
            with self._lock:
                batch, plans, self._pending, self._plans = self._pending, self._plans, {}, {}
                dropped, self._dropped = self._dropped, 0
            if batch:
                self._sent = time.monotonic()
            try:
                self.sink.add(batch, plans)
            except Exception as exc:  # the dashboard's data may lag; requests must not care
                if batch:  # an empty flush lost nothing: no log line every second while down
                    log.warning(
                        "flask-quota: usage flush failed (%s); %d counts lost", exc, len(batch)
                    )
        if dropped:  # the sink was too slow for the traffic: the dashboard undercounts
            log.warning(
                "flask-quota: %d requests not recorded for the dashboard: more than %d counts "
                "waited for a flush",
                dropped,
                self.max_pending,
            )

    def _start(self) -> None:
        # Started lazily, after gunicorn forked the worker that records.
        with self._lock:
            if self._thread_pid == os.getpid():
                return
            self._thread_pid = os.getpid()
            # A fork copies the parent flusher's event and lock in whatever state that
            # thread held them: this process's flusher gets its own.
            self._wake, self._flushing = threading.Event(), threading.Lock()
            self._wake.set()  # the count that started it is pending
        threading.Thread(target=self._run, name="flask-quota-usage", daemon=True).start()

    def _run(self) -> None:
        # Counts go out at most once an interval, and at once when the last counts
        # went out longer ago than that; an empty flush (aging only) still comes
        # every interval.
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            wait = self._sent + self.interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.flush()
