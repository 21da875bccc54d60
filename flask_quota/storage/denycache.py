"""A local deny cache: a key Redis denied until T is answered 429 here until T.

A flood from one client is the moment the limiter is busiest; every request
of it would cost a Redis round trip only to hear "denied" again. Envoy's
ratelimit and rate-limiter-flexible remember such denials in-process; so does
this ``Storage`` wrapper. It only ever denies, so it cannot admit what Redis
would refuse. Its deadline starts when the request to Redis was *sent*, not
when the answer arrived: Redis decided somewhere in between, so a cached
denial never outlasts the real one.

The other way round, a cached denial must not promise a shorter wait than the
storage would give: a charge after the response (``quota.charge``, ``settle``) can
put the bucket deeper into debt after its denial was cached. This worker's own
charges forget the denials of their buckets; another server's cannot be seen here,
so a denial is trusted for at most ``horizon`` seconds (the SQL sync interval), and
then the storage is asked again. Its answers are ``HeldReply``: no sign the storage
is up, so the circuit breaker does not count them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.algorithms import Algorithm, Gate, Outcome
from ..core.clock import US
from ..core.rates import Rate
from ..core.reply import HeldReply
from . import Check, Storage, Verdict
from .base import (
    Reply,
    flat_decide,
    flat_reply,
    keyed,
    shadow_flags,
    verdict_of,
)
from .layer import Layer

__all__ = ["DenyCache"]


@dataclass(frozen=True, slots=True)
class _Denial:
    """Redis said no to ``cost`` units on a key under ``rate``, until ``deadline``."""

    rate: Rate
    cost: int
    deadline: float  # local monotonic seconds: the retry time the storage gave
    trusted: float  # local monotonic seconds until which it is answered here
    outcome: Outcome
    seen: tuple[tuple[str, Outcome], ...]  # every tier of the denied request, as Redis saw it
    server_now_us: int  # Redis time of the decision
    sent: float  # local monotonic time the decision was asked for


class DenyCache(Layer):
    """Wraps a ``Storage``; remembers each ``(key, cost)`` denial until its retry time.

    A denial for cost ``c`` also answers costs ``>= c`` (they need more room).
    An entry applies only to the rate it was made under, so a plan or override
    change is never answered from a stale denial. ``forget()`` drops every local
    denial: each worker calls it when the SQL version moves, which resets,
    unblocks and plan changes all bump (see ``SqlStore.on_change``).
    At most ``max_keys`` keys are remembered, each for at most ``horizon`` seconds
    (see the module docstring). ``on_hit()``, when set, is called for every decision
    answered here (the metrics count them).
    """

    on_hit: Callable[[], None] | None = None

    def __init__(
        self,
        storage: Storage,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
        horizon: float = 2.0,
    ) -> None:
        super().__init__(storage)
        self._clock = clock
        self.horizon = horizon
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._denials: dict[str, tuple[_Denial, ...]] = {}
        # key -> the cached denials' keys of requests that also asked for it: a cached
        # answer says every check of its request, so a charge of any of them drops it.
        self._asked_with: dict[str, set[str]] = {}
        self._forgot_at = float("-inf")  # denials asked for before this are stale
        self.hits = 0  # decisions answered here, without the storage

    def decide(self, checks: Sequence[Check]) -> Verdict:
        """Answer a cached denial here; otherwise ask the storage and remember its denials."""
        return verdict_of(checks, self.decide_flat(checks, [c.key for c in checks]))

    def decide_flat(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply:
        """``decide`` on ``keys``, as a flat ``Reply``; objects are made only for denials."""
        now = self._clock()
        # Nothing cached (the usual case): straight to the storage. A caller who may wait
        # asks it too: a denial for a plain caller says nothing of a reservation.
        if self._denials and not any(c.wait_us for c in checks):
            cached = self._cached(keyed(checks, keys), now)
            if cached is not None:
                self.hits += 1
                if self.on_hit is not None:
                    self.on_hit()
                found = flat_reply(cached)
                return HeldReply(found)
        reply = flat_decide(self.storage, checks, keys)
        if not reply.all_allowed:
            real = keyed(checks, keys)
            self._remember(real, verdict_of(real, reply), now)
        return reply

    def held_reply(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply | None:
        """The answer of a cached denial (or of the layer below's units in hand), else
        None, never asking the storage: asked while it is down (``GuardedStorage``)."""
        if self._denials:
            cached = self._cached(keyed(checks, keys), self._clock())
            if cached is not None:
                self.hits += 1
                if self.on_hit is not None:
                    self.on_hit()
                return HeldReply(flat_reply(cached))
        below = getattr(self.storage, "held_reply", None)
        return None if below is None else below(checks, keys)

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        """Refund in the storage; a denial cached for these keys may no longer hold."""
        self.storage.refund(checks, charged_at_us)
        self._forget(checks)

    def charge(self, checks: Sequence[Check]) -> None:
        """Charge in the storage (into debt, maybe): a cached denial of a request that
        asked for these keys would now promise too short a wait, whichever tier denied."""
        self.storage.charge(checks)
        if self._denials:
            with self._lock:
                for check in checks:
                    for key in self._asked_with.pop(check.key, ()):
                        self._denials.pop(key, None)

    def _forget(self, checks: Sequence[Check]) -> None:
        if self._denials:
            with self._lock:
                for check in checks:
                    self._denials.pop(check.key, None)

    def clear(self, keys: Sequence[str] = ()) -> None:
        """Forget ``keys`` in the storage and here; with no keys, forget every local denial."""
        self.storage.clear(keys)
        self.forget(keys)

    def forget(self, keys: Sequence[str] = ()) -> None:
        """Drop local denials of ``keys`` (all of them when empty); the storage is untouched.

        A decision asked for before this moment may still come back denied (the
        storage answered before the change): it is not remembered.
        """
        with self._lock:
            if keys:
                for key in keys:
                    self._denials.pop(key, None)
            else:
                self._denials.clear()
                self._asked_with.clear()
                self._forgot_at = self._clock()

    def close(self) -> None:
        """Forget every local denial and close the storage."""
        with self._lock:
            self._denials.clear()
            self._asked_with.clear()
        self.storage.close()

    def __len__(self) -> int:
        return len(self._denials)

    def _find(self, check: Check, now: float) -> _Denial | None:
        if check.shadow:
            return None  # a shadow check never denies, so no denial answers it
        for denial in self._denials.get(check.key, ()):
            if denial.trusted > now and denial.cost <= check.cost and denial.rate == check.rate:
                return denial
        return None

    def _cached(self, checks: Sequence[Check], now: float) -> Verdict | None:
        if not self._denials:
            return None
        found = [self._find(check, now) for check in checks]
        first = next((d for d in found if d is not None), None)
        if first is None:
            return None
        now_us = first.server_now_us + round((now - first.sent) * US)
        seen = dict(first.seen)
        outcomes = []
        for check, denial in zip(checks, found, strict=True):
            if denial is not None:
                o = denial.outcome
                retry = max(1, round((denial.deadline - now) * US))
                outcomes.append(Outcome(False, o.limit, o.remaining, o.reset_us, retry))
                continue
            # A tier the denial did not cover: its last answer from the storage if
            # the denied request had it (it is not charged either way), else unknown.
            last = seen.get(check.key)
            if last is not None:
                outcomes.append(Outcome(True, last.limit, last.remaining, last.reset_us, 0))
            else:
                tb = check.algorithm is Algorithm.TOKEN_BUCKET
                full = check.rate.capacity if tb else check.rate.limit
                outcomes.append(Outcome(True, full, full, now_us, 0))
        return Verdict(now_us, tuple(outcomes), shadow_flags(checks))

    def _remember(self, checks: Sequence[Check], verdict: Verdict, sent: float) -> None:
        seen = tuple((c.key, o) for c, o in zip(checks, verdict.outcomes, strict=True))
        with self._lock:
            if sent < self._forgot_at:
                return  # asked before a reset or unblock: the answer may be stale
            if len(self._denials) >= self._max_keys:
                self._prune(sent)
            for check, outcome in zip(checks, verdict.outcomes, strict=True):
                if outcome.allowed or outcome.retry_after_us <= 0 or check.shadow:
                    continue  # a shadow denial is no denial
                if check.algorithm is Gate.LEASE or check.algorithm is Gate.CAPACITY:
                    continue  # a slot frees whenever a request ends: never assume it stays full
                deadline = sent + outcome.retry_after_us / US
                denial = _Denial(
                    rate=check.rate,
                    cost=check.cost,
                    deadline=deadline,
                    trusted=min(deadline, sent + self.horizon),
                    outcome=outcome,
                    seen=seen,
                    server_now_us=verdict.now_us,
                    sent=sent,
                )
                # One denial per cost: a new one for the same cost replaces the old.
                kept = tuple(
                    d
                    for d in self._denials.get(check.key, ())
                    if d.cost != check.cost and d.trusted > sent
                )
                self._denials[check.key] = (*kept, denial)
                for other in checks:
                    self._asked_with.setdefault(other.key, set()).add(check.key)

    def _prune(self, now: float) -> None:
        """Drop expired denials; if still full, the oldest half (insertion order)."""
        live = {
            key: kept
            for key, denials in self._denials.items()
            if (kept := tuple(d for d in denials if d.trusted > now))
        }
        if len(live) >= self._max_keys:
            live = dict(list(live.items())[len(live) // 2 :])
        self._denials = live
        self._asked_with = {
            key: asked for key, found in self._asked_with.items() if (asked := found & live.keys())
        }
