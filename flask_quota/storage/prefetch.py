"""Prefetched shares (``QUOTA_PREFETCH``): a worker takes part of a bucket ahead in
one storage call and spends it in-process, asking again only when it runs out.

The storage still decides every unit: a share is charged there, exactly, when it is
taken, so the storage never hands out more than its algorithm allows. What a share
must not do is outlive its units' meaning, and that bound is the whole design:

- **Fixed window** (calendar windows too): a share is spent only inside the window
  it was charged to. No window admits more than its limit.
- **Token bucket** (GCRA): a share of ``s`` units taken when the bucket's TAT became
  ``tat`` is spent only before ``tat - s * interval``. Until then the bucket, even
  refilling undisturbed, stays at least ``s`` units below full, so the units held
  outside it (every worker's valid shares) never make more than its capacity. Then
  every sequence of admitted requests is one the exact bucket admits too: bursts
  are never larger, and the long-run rate is never higher. The rule the issue
  sketched ("within the time its units take to refill") alone would allow a
  burst of capacity plus a share; ``tests/test_prefetch_model.py`` checks ours
  over random interleavings. A share taken while the bucket is near full also burns
  a *guard*: units that push the bucket's TAT out far enough for the share to be
  spent at this worker's pace, at most the largest share (``fraction`` of the
  bucket). A bucket that refills faster than one worker spends (a high limit shared
  by several workers) so stays up to a largest share below full while it is busy;
  near its limit a bucket takes no guard (its own deficit gives the time).
- **Sliding windows** are never prefetched: their window moves with every request,
  so a unit held for any time may be spent in a window that no longer counts it.
  Routes with a sliding check, a shadow check or a concurrency lease are decided
  in storage every time, exactly as without prefetch.

Every share also expires after ``horizon`` seconds (the SQL sync interval), and the
block gate's "not blocked" is trusted for as long: a reset, block, plan change or
override reaches a prefetching worker within that interval, as it reaches its deny
cache. ``forget()`` (called on every SQL version change) drops every share at once.

Deadlines start when the storage call was *sent*: the storage decided later, so a
share never outlives its storage-side bound. The price is under-admission: a
share left unspent when it expires or is dropped is lost, at most one share per
worker and bucket at a time, plus the guards (at most a largest share per worker
and bucket, and none once the bucket lacks what they would buy). A worker halves
its next share of a bucket when one expires mostly unspent, and doubles it (up to
``fraction`` of the bucket) when one runs out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.algorithms import Algorithm, Gate
from ..core.clock import US
from ..core.generations import Generations
from ..core.rates import Rate
from ..core.reply import HeldReply
from . import Check, Storage, Verdict
from .base import Reply, flat_decide
from .layer import Layer

__all__ = ["MAX_FRACTION", "Prefetch", "share_size"]

log = logging.getLogger("flask_quota")

MAX_FRACTION = 0.5
"""The largest share ``QUOTA_PREFETCH`` may ask for: half a bucket per worker."""

_SHAPES = 1024  # augmented request shapes kept (the storage caches encodings by identity)
# Members read per check of every request, as module constants: on Python 3.11 a member
# read through its class (``Gate.BLOCK``) runs ``EnumType.__getattr__``'s slow path,
# about ten times a global's cost.
_BLOCK, _TOKEN_BUCKET, _FIXED_WINDOW = Gate.BLOCK, Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW


_NONE_FRESH: dict[str, float] = {}  # ``_keep`` with no bucket new (read, never written)
_NOT_ASKING = float("-inf")  # ``_Share.asking`` when no take of the bucket is in flight


def share_size(fraction: float, rate: Rate, algorithm: Algorithm) -> int:
    """The largest share of a bucket under ``rate``: ``fraction`` of it, at least 1."""
    size = rate.capacity if algorithm is Algorithm.TOKEN_BUCKET else rate.limit
    return max(1, int(size * fraction))


@dataclass(slots=True)
class _Share:
    """What this worker knows of one bucket: its share (units charged in storage and
    not yet spent here), the bucket's room at the last storage answer, and how often
    the bucket is asked for here (a share is worth taking only for a busy bucket)."""

    rate: Rate
    left: int  # the share's units not yet spent
    taken: int  # the share's size when taken
    deadline: float  # local monotonic seconds: the share is spent only before
    remaining: int  # the bucket's remaining in storage at the last answer
    reset_us: int  # the bucket's reset then (storage clock)
    now_us: int  # the storage's time of that answer
    charged_us: int  # the storage's time the share was taken (its window's)
    took: float  # local time the share was asked for
    got: float  # local time that answer arrived (so ``now_us`` + time since never
    # runs ahead of the storage's clock: a refund's charge time must not be later)
    size: int  # the next share's size (halved when unspent or refused, doubled when used up)
    seen: float  # local time of the last request for this bucket here
    gap: float  # seconds between its requests here, smoothed (what a share can be spent at)
    # Local time a take of a share of this bucket was sent, while its answer is awaited
    # (``_NOT_ASKING`` otherwise): one take at a time per worker and bucket, so a thread
    # never keeps its share over another thread's live one (whose units storage charged).
    asking: float = float("-inf")


class Prefetch(Layer):
    """Wraps a ``Storage``: decides a request from this worker's shares when every
    check of it has one that covers its cost, otherwise in storage, taking new
    shares in the same call. All-or-nothing across the checks either way.
    ``on_hit()``, when set, is called for every decision answered from shares (the
    metrics count them)."""

    on_hit: Callable[[], None] | None = None

    def __init__(
        self,
        storage: Storage,
        *,
        fraction: float,
        horizon: float,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        if not 0 < fraction <= MAX_FRACTION:
            raise ValueError(f"a prefetch share is a fraction in (0, {MAX_FRACTION}]")
        super().__init__(storage)
        self.fraction = fraction
        self.horizon = horizon
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._shares: dict[str, _Share] = {}
        self._gates: dict[str, float] = {}  # block key -> "not blocked" trusted until
        self._seen: dict[str, float] = {}  # bucket key -> its one request so far, when
        self._forgot_at = float("-inf")  # a take asked for before this is not kept
        self._forgot: dict[str, float] = {}  # the same, per key (``forget(keys)``)
        # (id(checks), costs) -> (checks, the same checks with those costs)
        self._shapes: Generations[tuple[int, tuple[int, ...]], tuple[object, tuple[Check, ...]]]
        self._shapes = Generations(_SHAPES)
        # id(checks) -> (checks, whether shares may decide them): asked on every request
        self._kinds: dict[int, tuple[Sequence[Check], bool]] = {}
        self.local = 0  # decisions answered from shares, without the storage

    # -- deciding -------------------------------------------------------------

    def decide(self, checks: Sequence[Check]) -> Verdict:
        """Exactly, in storage: only the request path (``decide_flat``) spends shares.
        The other callers (the ``QUOTA_BLOCK_AFTER`` denial counter) count each call."""
        return self.storage.decide(checks)

    def decide_flat(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply:
        """From shares when they cover every check, else one storage call (two when a
        share asked for did not fit: then the request is decided again without)."""
        kind = self._kinds.get(id(checks))
        if kind is None or kind[0] is not checks:  # a shape not seen (or its id reused)
            if len(self._kinds) >= _SHAPES:
                self._kinds.clear()
            kind = self._kinds[id(checks)] = (checks, _prefetchable(checks))
        if not kind[1]:
            return flat_decide(self.storage, checks, keys)
        with self._lock:  # one acquire: spent from shares, or what to ask the storage
            # Read once the lock is held: a thread that waited for it (another worker
            # thread's take, under load) must judge deadlines by now, not by before.
            now = self._clock()
            local = self._spend(checks, keys, now)
            if local is None:
                extra, guards, refunds, fresh = self._asks(checks, keys, now)
            else:
                self.local += 1
        if local is not None:
            if self.on_hit is not None:
                self.on_hit()
            return local
        for unspent, charged_at_us in refunds:
            self._give_back(unspent, charged_at_us)
        if extra is None:
            return self._exact(checks, keys, now, fresh)
        assert guards is not None  # made with ``extra``
        asked = self._shape(
            checks, [c.cost + x + g for c, x, g in zip(checks, extra, guards, strict=True)]
        )
        try:
            reply = flat_decide(self.storage, asked, keys)
        except BaseException:
            self._asked(checks, keys, extra, refused=False)
            raise
        if reply.all_allowed:
            self._keep(checks, keys, reply, extra, now, fresh or _NONE_FRESH)
            return reply
        self._asked(checks, keys, extra, refused=True)  # a share did not fit
        return self._exact(checks, keys, now, fresh or _NONE_FRESH)

    def _asked(
        self, checks: Sequence[Check], keys: Sequence[str], extra: Sequence[int], *, refused: bool
    ) -> None:
        """A take that kept nothing (storage refused it, or the call failed): the buckets
        may be asked for again, a refused one for half as much."""
        with self._lock:
            for check, key, x in zip(checks, keys, extra, strict=True):
                known = self._shares.get(key)
                if x and known is not None and known.rate == check.rate:
                    known.asking = _NOT_ASKING
                    if refused:
                        known.size //= 2

    def held_reply(self, checks: Sequence[Check], keys: Sequence[str]) -> Reply | None:
        """The request's reply from this worker's shares, spent, or None (nothing spent),
        never asking the storage: asked while it is down (``GuardedStorage``)."""
        kind = self._kinds.get(id(checks))
        if kind is None or kind[0] is not checks or not kind[1]:
            return None
        with self._lock:
            local = self._spend(checks, keys, self._clock())
            if local is not None:
                self.local += 1
        if local is not None and self.on_hit is not None:
            self.on_hit()
        return local

    def _give_back(self, unspent: Check, charged_at_us: int) -> None:
        """Refund an expired window share's unspent units; one that fails is lost."""
        try:
            self.storage.refund([unspent], charged_at_us)
        except Exception:  # the request is what matters; the units are under-admission
            log.debug("flask-quota: an unspent share could not be given back", exc_info=True)

    def _exact(
        self,
        checks: Sequence[Check],
        keys: Sequence[str],
        sent: float,
        fresh: dict[str, float] | None,
    ) -> Reply:
        """The request decided in storage as asked; its answers update what is known
        (``fresh``: as ``_asks`` says; None: nothing to update, a cold caller's case)."""
        reply = flat_decide(self.storage, checks, keys)
        if fresh is not None:
            self._keep(checks, keys, reply, None, sent, fresh)
        return reply

    def _spend(self, checks: Sequence[Check], keys: Sequence[str], now: float) -> Reply | None:
        """The request's reply from this worker's shares, spent; None when any check has
        none that covers its cost (then nothing is spent). Every request answered from
        shares runs this, so it reads each attribute once."""
        shares, gates = self._shares, self._gates
        found: list[_Share | None] = []
        base: _Share | None = None  # the first share: its answer's time is the reply's
        for check, key in zip(checks, keys, strict=True):
            if check.algorithm is _BLOCK:
                if gates.get(key, 0.0) <= now:
                    return None
                found.append(None)
                continue
            share = shares.get(key)
            if share is None or share.left < check.cost or share.deadline <= now:
                return None
            # The same rate is the same object (the plan's) but after a plan change: ``is``
            # first spares the dataclass's ``__eq__``, a Python call per check.
            rate = share.rate
            if rate is not check.rate and rate != check.rate:
                return None
            found.append(share)
            if base is None:
                base = share
        assert base is not None  # a prefetchable request has a bucket (``_prefetchable``)
        now_us = base.now_us + round((now - base.got) * US)
        out = [now_us, 1]
        for check, share in zip(checks, found, strict=True):
            if share is None:
                out += (1, 0, now_us, 0)  # the block gate: not blocked
                continue
            cost = check.cost
            left = share.left = share.left - cost
            _tick(share, now)
            took = share.took
            if left < cost and now - took < (share.deadline - took) / 2:
                # Used up in the first half of its life: ask more. (Used up later, the
                # size was right; doubling then would undo the halving that a burst's
                # unspent end brings, burst after burst.)
                share.size = min(share.size * 2, self._max(check))
            out += (1, share.remaining + left, _reset(check, share), 0)
        return HeldReply(out)

    def _asks(
        self, checks: Sequence[Check], keys: Sequence[str], now: float
    ) -> tuple[
        list[int] | None, list[int] | None, list[tuple[Check, int]], dict[str, float] | None
    ]:
        """Per check, the share to take with this request and the guard to burn with it
        (both None when no check takes one: a cold caller's usual request). None for
        gates, for buckets whose share still covers the cost, for a bucket seen here
        for the first time, and for one asked for too seldom to spend a share.
        Also the unspent units of expired window shares, to give back (their charge
        time with each): a window's count may shrink by what was never spent. (A
        token bucket's may not: refilled meanwhile, it could then hold more than its
        capacity alongside other workers' shares.) Last, ``_keep``'s ``fresh``: the
        buckets asked for the second time within the horizon (when first asked), or
        None when the storage's answer teaches nothing (every bucket new here).

        A bucket is known from its second request within the horizon on: its first
        costs one entry in ``_seen``, made here, so a cold caller's answer is not read."""
        extra: list[int] | None = None
        guards: list[int] | None = None
        refunds: list[tuple[Check, int]] = []
        learn = False  # some bucket or gate is known here: its answer is kept
        fresh: dict[str, float] | None = None
        shares, seen, horizon = self._shares, self._seen, self.horizon
        for i, (check, key) in enumerate(zip(checks, keys, strict=True)):
            if check.algorithm is _BLOCK:
                learn = learn or key in self._gates  # trusted open: kept open by the answer
                continue
            known = shares.get(key)
            if known is None or (known.rate is not check.rate and known.rate != check.rate):
                # First sight (or a new rate): decided exactly; the second within the
                # horizon makes it known, from its answer.
                first = seen.pop(key, None)
                if first is not None and now - first <= horizon:
                    if fresh is None:
                        fresh = {}
                    fresh[key] = first
                else:
                    if len(seen) >= self._max_keys:
                        seen.clear()
                    seen[key] = now
                continue
            learn = True
            _tick(known, now)
            if known.deadline > now and known.left >= check.cost:
                continue
            if known.asking > now - horizon:
                # Another thread of this worker is taking a share of this bucket: decided
                # exactly, so the two takes never meet (see ``_Share.asking``). Bounded by
                # the horizon, should that take's answer never be kept.
                continue
            if known.left and known.left * 2 > known.taken:
                # Expired mostly unspent: next time, what this one was spent on.
                known.size = max(1, _power_below(known.taken - known.left))
            if known.left and check.algorithm is _FIXED_WINDOW:
                refunds.append((Check(key, check.algorithm, check.rate, known.left,
                                      False, check.calendar), known.charged_us))  # fmt: skip
            known.left = 0
            # No more than this worker could spend before a share expires, nor than the
            # bucket had left at its last answer (such a take would only be refused).
            gap = known.gap
            uses = int(self.horizon / gap) * check.cost if gap > 0 else known.size
            # Powers of two: few distinct costs, so few request shapes to encode.
            size = _power_below(min(known.size, uses, known.remaining - check.cost))
            if size <= 0:
                continue
            if extra is None or guards is None:
                extra, guards = [0] * len(checks), [0] * len(checks)
            extra[i] = size
            known.asking = now
            if check.algorithm is _TOKEN_BUCKET:
                guards[i] = _guard(check, known, size, gap, self._max(check), now)
        if fresh is None and learn:
            fresh = _NONE_FRESH  # an answer to keep, though no bucket becomes known
        return extra, guards, refunds, fresh

    def _keep(
        self,
        checks: Sequence[Check],
        keys: Sequence[str],
        reply: Reply,
        extra: Sequence[int] | None,
        sent: float,
        fresh: dict[str, float],
    ) -> None:
        """Keep the shares an allowed call took (``extra``: None when it asked for none),
        and the block gates it read open; the reply then counts each share as the
        caller's (approximate headers). A denied call takes nothing: it only tells the
        buckets' room (the next shares' bound). A bucket in ``fresh`` (asked for the
        second time within the horizon: ``_asks``) becomes known here."""
        now_us, allowed = reply.now_us, reply.all_allowed
        took = allowed and extra is not None
        got = self._clock()
        with self._lock:
            if sent < self._forgot_at:
                return  # asked before a reset or plan change: what it took is dropped
            if len(self._shares) >= self._max_keys or len(self._gates) >= self._max_keys:
                self._prune(sent)
            forgot, shares, horizon = self._forgot, self._shares, self.horizon
            j = -2  # a check's answer in the reply: allowed, remaining, reset, retry from j
            for i, (check, key) in enumerate(zip(checks, keys, strict=True)):
                j += 4
                if forgot and forgot.get(key, float("-inf")) > sent:
                    continue  # reset or blocked while this call was in flight
                if check.algorithm is _BLOCK:
                    # Trusted only where shares may be spent: not for every cold caller.
                    if allowed and (took or key in self._gates):
                        self._gates[key] = sent + horizon
                    continue
                remaining, reset_us = reply[j + 1], reply[j + 2]
                known = shares.get(key)
                if known is None or (known.rate is not check.rate and known.rate != check.rate):
                    first = fresh.get(key)
                    if first is None:  # its first request (``_asks`` noted it): not yet
                        continue
                    known = shares[key] = _Share(
                        check.rate, 0, 0, sent, remaining, reset_us, now_us, now_us, sent,
                        got, self._max(check), sent, sent - first,
                    )  # fmt: skip
                known.remaining, known.reset_us, known.now_us, known.got = (
                    remaining, reset_us, now_us, got,
                )  # fmt: skip
                s = extra[i] if extra is not None else 0
                if s:
                    known.asking = _NOT_ASKING  # this take's answer: the bucket is free again
                if not took:
                    s = 0
                if s <= 0:
                    if allowed and known.size == 0 and remaining >= check.cost + 2:
                        known.size = 1  # room again after refusals: start small
                    continue
                if check.algorithm is _TOKEN_BUCKET:
                    until_us = reset_us - s * check.rate.interval_us
                else:
                    until_us = reset_us  # the window's end
                known.left = known.taken = s
                known.charged_us, known.took = now_us, sent
                known.deadline = sent + min(horizon, (until_us - now_us) / US)
                # The reply says the share is the caller's to spend.
                reply[j + 1] = remaining + s
                reply[j + 2] = _reset(check, known)

    def _shape(self, checks: Sequence[Check], costs: list[int]) -> tuple[Check, ...]:
        """``checks`` with ``costs``, the same object for the same costs (the storage
        caches a shape's encoding by identity)."""
        key = (id(checks), tuple(costs))
        found = self._shapes.current.get(key) or self._shapes.recall(key)
        if found is None or found[0] is not checks:
            made = tuple(
                Check(c.key, c.algorithm, c.rate, cost, c.shadow, c.calendar)
                for c, cost in zip(checks, costs, strict=True)
            )
            found = (checks, made)
            self._shapes.put(key, found)
        return found[1]

    def _max(self, check: Check) -> int:
        assert isinstance(check.algorithm, Algorithm)
        return share_size(self.fraction, check.rate, check.algorithm)

    def _prune(self, now: float) -> None:
        self._shares = {k: s for k, s in self._shares.items() if s.deadline > now}
        self._gates = {k: t for k, t in self._gates.items() if t > now}
        if len(self._shares) >= self._max_keys:
            self._shares.clear()
        if len(self._gates) >= self._max_keys:
            self._gates.clear()

    # -- changes ----------------------------------------------------------------

    def forget(self, keys: Sequence[str] = ()) -> None:
        """Drop the shares (and trusted gates) of ``keys``, all of them when empty; their
        unspent units are lost. A take asked for before an empty ``forget`` is not kept."""
        with self._lock:
            now = self._clock()
            if keys:
                if len(self._forgot) >= self._max_keys:
                    self._forgot.clear()
                    self._forgot_at = now  # as strict as remembering each key
                for key in keys:
                    self._shares.pop(key, None)
                    self._gates.pop(key, None)
                    self._forgot[key] = now
            else:
                self._shares.clear()
                self._gates.clear()
                self._seen.clear()
                self._forgot.clear()
                self._forgot_at = now

    def clear(self, keys: Sequence[str]) -> None:
        self.storage.clear(keys)
        self.forget(keys)

    def block(self, key: str, seconds: int, info: str) -> None:
        self.storage.block(key, seconds, info)
        self.forget([key])

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        """Refund in storage. A token bucket's TAT falls by up to the refunded units'
        worth, and a share held on it must fall due as much sooner: its bound was
        reckoned from the higher TAT (the refunded cost may be the very request's that
        took the share)."""
        self.storage.refund(checks, charged_at_us)
        with self._lock:
            for check in checks:
                share = self._shares.get(check.key)
                if share is not None and check.algorithm is _TOKEN_BUCKET:
                    share.deadline -= check.cost * check.rate.interval_us / US

    def charge(self, checks: Sequence[Check]) -> None:
        """Charge in storage, into debt if need be; this worker's shares of those
        buckets go, since the exact algorithm now denies until the debt is paid."""
        self.storage.charge(checks)
        self.forget([check.key for check in checks])

    def close(self) -> None:
        self.forget()
        self.storage.close()

    def __len__(self) -> int:
        return len(self._shares)

    def held(self) -> dict[str, int]:
        """The units this worker holds now, per bucket key (shares not yet expired)."""
        now = self._clock()
        with self._lock:
            return {k: s.left for k, s in self._shares.items() if s.left and s.deadline > now}


def _prefetchable(checks: Sequence[Check]) -> bool:
    """True when shares may decide the request: only block gates and non-shadow token
    buckets and fixed windows, at least one of those, none of whose callers may wait (a
    reservation is made in the storage, where the queue is; see the module docstring)."""
    bucket = False
    for c in checks:
        if c.algorithm is _BLOCK:
            continue
        if c.shadow or c.wait_us or c.algorithm not in (_TOKEN_BUCKET, _FIXED_WINDOW):
            return False
        bucket = True
    return bucket


def _tick(share: _Share, now: float) -> None:
    """A request for ``share``'s bucket at ``now``: its smoothed gap follows."""
    share.gap += (now - share.seen - share.gap) / 4
    share.seen = now


def _guard(check: Check, known: _Share, size: int, gap: float, most: int, now: float) -> int:
    """The units to burn with a token bucket's share of ``size`` so that it can be spent
    at this worker's pace (a request every ``gap`` s): a share is spendable for as many
    intervals as the bucket then lacks, less the share (see the module docstring), so
    a bucket with less room needs less. A power of two (few request shapes), at most
    the largest share (``most``) however slowly this worker spends: a bucket that
    refills faster than one worker spends (high limits, many workers) stays that far
    below full, and no farther, while it is busy. None when the room lacks."""
    interval = check.rate.interval_us
    wanted = -(-round(size / check.cost * gap * US) // interval)  # intervals to spend it in
    # What the bucket lacks now: at its last answer, less what it has refilled since (a
    # high limit's bucket refills much in a horizon; an old lack would buy too short a
    # share). Taken by other workers meanwhile, it lacks more: the guard then burns more.
    refilled = int((now - known.got) * US) // interval
    lacking = max(0, check.rate.capacity - known.remaining - refilled) + check.cost
    short = wanted - lacking
    if short <= 0:
        return 0
    guard = min(1 << (short - 1).bit_length(), _power_below(most))  # rounded up, capped
    return guard if known.remaining >= check.cost + size + guard else 0


def _reset(check: Check, share: _Share) -> int:
    """A bucket's reset as this worker sees it: a token bucket refills its unspent
    share sooner; a window resets at its end."""
    if check.algorithm is _TOKEN_BUCKET:
        return share.reset_us - share.left * check.rate.interval_us
    return share.reset_us


def _power_below(n: int) -> int:
    """The largest power of two <= ``n`` (0 when ``n < 1``)."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 0
