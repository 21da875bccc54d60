"""What happens when the storage fails: ``QUOTA_FAIL_MODE`` behind a circuit breaker."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from ..core.algorithms import Gate
from ..core.clock import US
from ..core.errors import QuotaUnavailable
from ..core.rates import Rate
from ..core.reply import HeldReply, LocalReply, Reply
from . import Check, MemoryStorage, Storage, StorageError, Verdict
from .base import flat_decide, keyed
from .breaker import Attempt, CircuitBreaker

__all__ = ["FailMode", "GuardedStorage"]

log = logging.getLogger("flask_quota")
T = TypeVar("T")


class FailMode(StrEnum):
    """What requests get while the storage fails (``QUOTA_FAIL_MODE``)."""

    OPEN = "open"
    CLOSED = "closed"
    LOCAL = "local"


# When a give-back that may not have landed is sent again, in seconds after the first
# failure: a call that timed out may still run on the server after the first give-back
# (a stalled server runs what it had read once it resumes), so it is sent a few times.
RESEND_AFTER = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
MAX_PENDING = 10_000  # give-backs kept at most: past it, the oldest are dropped (they expire)
_LEASES = (Gate.LEASE, Gate.CAPACITY)


@dataclass(slots=True)
class _GiveBack:
    """Leases to give back to the storage that a failed call may have left there."""

    checks: list[Check]  # the lease checks, each key naming its set and member
    since: float  # monotonic seconds when it was first owed
    sent: int  # times sent so far (``RESEND_AFTER`` says when the next is due)
    until: float  # monotonic seconds after which the leases have expired anyway


def _share(check: Check, workers: int) -> Check:
    """``check`` as one of ``workers`` decides it alone: a fleet capacity's slots shared
    out (at least one each); any other check as it is."""
    if check.algorithm is not Gate.CAPACITY:
        return check
    rate = Rate(max(1, check.rate.limit // workers), check.rate.window)
    return Check(check.key, check.algorithm, rate, check.cost, check.shadow, check.calendar)


def lease_checks(checks: Sequence[Check], keys: Sequence[str]) -> list[Check]:
    """The leases a request's ``checks`` take, on its ``keys`` (members included)."""
    return [
        Check(key, c.algorithm, c.rate, c.cost, c.shadow, c.calendar)
        for c, key in zip(checks, keys, strict=True)
        if c.algorithm in _LEASES and c.cost > 0
    ]


class GuardedStorage:
    """Calls the storage while it works; otherwise applies the fail mode.

    ``open`` lets requests through unlimited, ``closed`` refuses them with 503,
    ``local`` limits them with an in-process memory store (per worker). The fail
    mode applies to a request whose storage call failed and to every request
    while the breaker is open.

    In ``local`` mode no request is counted twice while the breaker is closed. A
    call that failed (a timeout, say) may still have been counted by the storage,
    so its request is checked against the local limiter without being charged
    there. Requests that never reach the storage (breaker open) are charged
    locally, and so is a failed probe, so that a worker whose every request is
    a probe still limits. The one double count left: a failed probe that did
    run on the storage, at most one request per worker per breaker cooldown, and
    only while the breaker is open. The other way round, a failed call that never
    reached the storage is counted nowhere: at most ``threshold`` rounds of them
    (one per worker thread each) per worker as an outage begins.

    Leases are never left behind by a failure: a decide call that failed may still
    have taken its leases (a stalled server runs the call once it resumes), and a
    give-back may fail or meet the open breaker. Such leases are owed to the storage
    and given back on the request path once it answers: before the next decision that
    may use it, and again on the ``RESEND_AFTER`` schedule (a stalled call may land
    after the first give-back), until they would have expired anyway.
    """

    def __init__(
        self, storage: Storage, mode: FailMode, breaker: CircuitBreaker, *, workers: int = 1
    ) -> None:
        self.storage = storage
        self.mode = mode
        self.breaker = breaker
        self.workers = max(1, workers)  # the fleet capacity's share per worker, failing local
        self.fallback = MemoryStorage() if mode is FailMode.LOCAL else None
        # Answers from what the layers hold in-process (cached denials, shares in hand),
        # asked while the breaker is open: they stay true while the storage is down.
        self._held: Callable[[Sequence[Check], Sequence[str]], Reply | None] | None = getattr(
            storage, "held_reply", None
        )
        self.owed: list[_GiveBack] = []  # leases to give back to the storage (see above)
        self._owed_lock = threading.Lock()
        self._clock = time.monotonic
        if type(storage) is MemoryStorage and "decide" not in vars(storage):
            # The in-process store (exactly it: a subclass may fail on purpose) raises
            # no StorageError: its request path skips the breaker, which could never open.
            self.decide_flat = storage.decide_flat  # type: ignore[method-assign]

    @property
    def degraded(self) -> bool:
        """True while the breaker is open and the fail mode applies."""
        return self.breaker.is_open

    def decide_flat(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply | None:
        """The storage's reply for ``checks`` on ``keys`` (their own keys are ignored), or
        ``None`` for "fail open: no limit applies"; a ``LocalReply`` when the in-process
        fallback answered."""
        attempt = self.breaker.allow()
        charge_locally = True
        if attempt is not None:
            if self.owed and not attempt.probe:
                self._give_back_owed(attempt)
            try:
                reply = flat_decide(self.storage, checks, keys)
            except Exception as exc:
                self._count_failure(attempt, exc)
                self._owe(lease_checks(checks, keys))  # the call may have taken them
                charge_locally = attempt.probe
            else:
                if type(reply) is not HeldReply:
                    self.breaker.succeeded()
                elif attempt.probe:  # answered in-process: the storage was not probed
                    self.breaker.unused(attempt)
                return reply
        elif self._held is not None:
            # The breaker is open: a denial cached, or units in hand, still answer.
            held = self._held(checks, keys)
            if held is not None:
                return held
        local = self._failed(keyed(checks, keys), charge_locally)
        return None if local is None else LocalReply.of(local.now_us, local.allowed, local.outcomes)

    def _count_failure(self, attempt: Attempt, exc: Exception) -> None:
        """A storage call raised: count it towards the breaker, whatever it raised.

        ``StorageError`` is the storage saying it cannot answer. Anything else is a
        defect (ours, or a client library's) and is handled the same way, since a
        limiter must never turn a request into a 500; its traceback is logged once
        when a run of failures begins, not once per request.
        """
        if not isinstance(exc, StorageError) and not self.breaker.failing:
            log.error(
                "flask-quota: unexpected error in a %s storage call, handled as a storage "
                "failure (fail mode %r)",
                self.breaker.name,
                self.mode.value,
                exc_info=exc,
            )
        self.breaker.failed(attempt, exc, self.mode.value)

    def _failed(self, checks: Sequence[Check], charge_locally: bool) -> Verdict | None:
        """The fail mode's answer: the local verdict, ``None`` (open), or 503 (closed).
        Locally, the fleet's capacity (``QUOTA_CAPACITY``) is this worker's share of it."""
        if self.fallback is not None:
            if self.workers > 1:
                checks = [_share(c, self.workers) for c in checks]
            return self.fallback.decide(checks) if charge_locally else self.fallback.peek(checks)
        if self.mode is FailMode.CLOSED:
            raise QuotaUnavailable(math.ceil(self.breaker.seconds_to_probe()))
        return None

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        """Give a charge back (``charge_when`` said no). See ``adjust``."""
        self._after(lambda store: store.refund(checks, charged_at_us), "refund")

    def charge(self, checks: Sequence[Check]) -> None:
        """Charge after the response (``quota.charge``), past the limit if need be."""
        self._after(lambda store: store.charge(checks), "charge")

    def release(self, checks: Sequence[Check], *, local: bool) -> None:
        """Give leases back (``core/leases.py``): to the fallback when it took them
        (``local``), else to the storage. One the storage cannot take now (down, or
        the breaker open) is owed and given back once it answers (see the class)."""
        if local:
            if self.fallback is not None:
                self.fallback.refund(checks, 0)
            return
        attempt = self.breaker.allow()
        if attempt is None:
            self._owe(list(checks))
            return
        try:
            self.storage.refund(checks, 0)
        except Exception as exc:
            self._count_failure(attempt, exc)
            self._owe(list(checks))
            log.warning("flask-quota: a lease release failed, to be sent again: %s", exc)
        else:
            self.breaker.succeeded()
            if self.owed and attempt.probe:
                self._give_back_owed(self.breaker.allow())

    def _owe(self, checks: list[Check]) -> None:
        """Keep ``checks`` (leases) to give back to the storage once it answers."""
        if not checks:
            return
        now = self._clock()
        life = max(c.rate.window_us for c in checks) / US  # QUOTA_LEASE_SECONDS
        with self._owed_lock:
            if len(self.owed) >= MAX_PENDING:
                del self.owed[: len(self.owed) // 2]  # the oldest: nearest their expiry
            self.owed.append(_GiveBack(checks, now, 0, now + life))

    def _give_back_owed(self, attempt: Attempt | None) -> None:
        """Send the owed give-backs that are due, in one storage call; on the request
        path, before its decision (only while something is owed)."""
        if attempt is None:
            return
        now = self._clock()
        with self._owed_lock:
            due = [g for g in self.owed if now >= g.since + RESEND_AFTER[g.sent]]
            if not due:
                return
            for owed in due:
                owed.sent += 1
            self.owed = [g for g in self.owed if g.sent < len(RESEND_AFTER) and g.until > now]
        try:
            self.storage.refund([c for g in due for c in g.checks], 0)
        except Exception as exc:
            self._count_failure(attempt, exc)
            with self._owed_lock:
                for owed in due:  # not sent after all: due again at once
                    owed.sent -= 1
                    if owed not in self.owed and owed.until > now:
                        self.owed.append(owed)
        else:
            self.breaker.succeeded()

    def _after(self, call: Callable[[Storage], None], what: str) -> None:
        """Run a correction after the response, through the breaker like ``decide``.

        While the breaker is open the decision came from the fallback, so the
        correction goes there too (or nowhere, failing open or closed). A request
        checked locally after its own call failed (breaker still closed) has its
        correction sent to the storage, where that call may have charged it. A failed
        correction cannot refuse a response already made: it is lost, and logged
        once by the breaker (a lost refund only under-admits).
        """
        attempt = self.breaker.allow()
        if attempt is not None:
            try:
                call(self.storage)
            except Exception as exc:
                self._count_failure(attempt, exc)
                log.debug("flask-quota: %s lost: %s", what, exc)
            else:
                self.breaker.succeeded()
            return
        if self.fallback is not None:
            call(self.fallback)

    def attempt(self, call: Callable[[], T]) -> T | None:
        """Run a storage call made after the decision (a block escalation).

        ``None`` when the breaker is open or the call fails; failures count
        towards the breaker, but the fail mode does not apply: the request
        already has its answer.
        """
        attempt = self.breaker.allow()
        if attempt is None:
            return None
        try:
            result = call()
        except Exception as exc:
            self._count_failure(attempt, exc)
            return None
        self.breaker.succeeded()
        return result
