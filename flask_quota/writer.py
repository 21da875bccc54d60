"""The background writer of the usage ledger and of the prepaid balances' checkpoints: a
daemon thread per worker that flushes its owner every interval.

The thread holds its owner weakly, so an app dropped (tests make many) takes its writer
with it; the owner is flushed once more at interpreter exit, in the process that wrote.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Protocol

__all__ = ["Flushed", "start_writer"]


class Flushed(Protocol):
    """What a writer flushes: ``flush()`` every ``interval`` seconds, sooner when
    ``_wake`` is set; ``_thread_pid`` is the process its writer runs in."""

    interval: float
    _wake: threading.Event
    _thread_pid: int | None

    def flush(self) -> object: ...


def start_writer(owner: Flushed, name: str) -> None:
    """Start ``owner``'s writer thread in this process (the caller has set its
    ``_thread_pid``: gunicorn forks after ``init_app``, so writers start lazily)."""
    ref = weakref.ref(owner)
    threading.Thread(target=_run, args=(ref,), name=name, daemon=True).start()
    atexit.register(_flush_at_exit, ref)


def _run(ref: weakref.ref[Flushed]) -> None:
    """A flush every interval, for as long as the owner lives."""
    while True:
        owner = ref()
        if owner is None:
            return
        wake, interval = owner._wake, owner.interval
        del owner  # not kept alive by its own thread while it sleeps
        wake.wait(interval)
        wake.clear()
        owner = ref()
        if owner is None:
            return
        owner.flush()
        del owner


def _flush_at_exit(ref: weakref.ref[Flushed]) -> None:
    owner = ref()
    if owner is not None and owner._thread_pid == os.getpid():
        owner.flush()
