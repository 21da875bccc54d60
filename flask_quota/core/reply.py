"""The storage's flat answer for one request, and the one place its layout is known.

A decide call answers ``[now_us, all_allowed, then per check: allowed, remaining,
reset_us, retry_us]`` (flags as 1/0): the decide script's own reply, so no object
is made per check on the request path. Every reader goes through ``Reply``'s
accessors; ``i`` counts the checks in the order they were asked (a route's block
gate is check 0, its tiers follow).

When every check allowed, the script answers a shorter form, which ``Reply.read``
makes long: ``[now_us, 2, then per check: remaining, reset_us]`` (an allowed check's
retry is 0), leaving out a first check that is a block gate letting by (``1, 0,
now_us, 0``). Each integer of a reply is work for Redis, which every web server
shares; rebuilding the long form is a few list operations here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .algorithms import Outcome

__all__ = ["HeldReply", "LocalReply", "Reply"]

_HEAD = 2  # now_us, all_allowed
_STRIDE = 4  # allowed, remaining, reset_us, retry_us
_REMAINING = _HEAD + 1  # check 0's remaining (its reset_us follows)
_SHORT = 2  # all_allowed in the short form: every check allowed (see the module docstring)


class Reply(list[int]):
    """A verdict as flat integers (see the module docstring)."""

    __slots__ = ()

    @classmethod
    def of(cls, now_us: int, allowed: bool, outcomes: Iterable[Outcome]) -> Reply:
        """The reply that says ``outcomes`` at ``now_us``."""
        reply = cls((now_us, int(allowed)))
        for o in outcomes:
            reply += (int(o.allowed), o.remaining, o.reset_us, o.retry_after_us)
        return reply

    @classmethod
    def read(cls, raw: Sequence[int], checks: int) -> Reply:
        """The reply the decide script answered ``checks`` checks with, ``raw``: its
        long form as it is, its short form made long (see the module docstring)."""
        if raw[1] != _SHORT:
            return cls(raw)
        now = raw[0]
        pairs = (len(raw) - _HEAD) // 2
        body = [1, 0, 0, 0] * pairs  # one C loop per column, not a Python loop per check
        body[1::_STRIDE] = raw[_HEAD::2]
        body[2::_STRIDE] = raw[_HEAD + 1 :: 2]
        reply = cls((now, 1, 1, 0, now, 0) if pairs < checks else (now, 1))
        reply += body
        return reply

    @property
    def now_us(self) -> int:
        return int(self[0])

    @property
    def all_allowed(self) -> bool:
        """True when every enforced check allowed (a shadow denial does not deny)."""
        return bool(self[1])

    def deny_all(self) -> None:
        """Mark the whole request denied (a check denied after this reply was begun)."""
        self[1] = 0

    @property
    def checks(self) -> int:
        """How many checks this reply answers."""
        return (len(self) - _HEAD) // _STRIDE

    def allowed(self, i: int) -> bool:
        return bool(self[_HEAD + _STRIDE * i])

    def remaining(self, i: int) -> int:
        return int(self[_HEAD + _STRIDE * i + 1])

    def reset_us(self, i: int) -> int:
        return int(self[_HEAD + _STRIDE * i + 2])

    def crossings(self, lines: Sequence[tuple[int, int, int]]) -> list[int]:
        """Of ``lines`` ((check, room, cost) each), the checks that allowed and whose cost
        took what is left of them from above ``room`` to ``room`` or below: the checks
        that crossed the near-limit line (``core.near``)."""
        found = []
        for i, room, cost in lines:
            j = _HEAD + _STRIDE * i
            left = self[j + 1]
            if left <= room < left + cost and self[j]:
                found.append(i)
        return found

    def outcome(self, i: int, limit: int) -> Outcome:
        """Check ``i``'s outcome; the reply does not carry limits, the caller knows them."""
        j = _HEAD + _STRIDE * i
        return Outcome(bool(self[j]), limit, int(self[j + 1]), int(self[j + 2]), int(self[j + 3]))

    def set_retry(self, i: int, retry_us: int) -> None:
        """Make check ``i``'s retry ``retry_us`` (a credits check's seed mark made a plain
        refusal: ``Enforcer._credited``)."""
        self[_HEAD + _STRIDE * i + 3] = retry_us

    def wait_us(self) -> int:
        """How long a caller admitted by reservation must sleep before it acts: the
        longest wait among the checks that allowed (0: none reserved). Only a check
        that may wait (``Check.wait_us``) allows with a wait."""
        longest = 0
        for j in range(_HEAD, len(self), _STRIDE):
            if self[j] and self[j + 3] > longest:
                longest = self[j + 3]
        return int(longest)

    def denied(self, among: Sequence[int]) -> int:
        """Of the checks ``among``, the first denial with the longest wait; -1 if none."""
        found, wait = -1, -1
        for i in among:
            j = _HEAD + _STRIDE * i
            if not self[j] and self[j + 3] > wait:
                found, wait = i, self[j + 3]
        return found

    def closest(self, among: Sequence[int]) -> int:
        """Of the checks ``among`` (at least one), the first with the fewest remaining
        and, among those, the latest reset."""
        return self._closest(among)[0]

    def _closest(self, among: Sequence[int]) -> tuple[int, int, int]:
        """``closest`` with that check's remaining and reset_us."""
        found = among[0]
        j = _REMAINING + _STRIDE * found
        fewest, latest = self[j], self[j + 1]
        for i in among[1:]:  # the request path: a few list reads per tier, nothing made
            j = _REMAINING + _STRIDE * i
            left = self[j]
            if left < fewest or (left == fewest and self[j + 1] > latest):
                found, fewest, latest = i, left, self[j + 1]
        return found, fewest, latest

    def shown(self, among: Sequence[int]) -> int:
        """The check the rate-limit headers describe: the denying one, else the closest
        to its limit. The one rule for "which tier is shown"."""
        if not self[1]:  # some check denied: look for it (shadow checks are not ``among``)
            found = self.denied(among)
            if found >= 0:
                return found
        return self.closest(among)

    def shown_state(self, among: Sequence[int]) -> tuple[int, int, int, int]:
        """(``shown(among)``, its remaining, its reset_us, now_us): what the headers
        write, read in one call (the after-request path)."""
        if self[1]:  # all allowed (the usual case): the closest, with its numbers
            found, fewest, latest = self._closest(among)
            return found, fewest, latest, self[0]
        found = self.shown(among)
        j = _REMAINING + _STRIDE * found
        return found, self[j], self[j + 1], self[0]


class LocalReply(Reply):
    """A reply of the in-process fallback (fail mode ``local``), not of the storage:
    made only while the storage fails, so metrics can tell the two apart for free."""

    __slots__ = ()


class HeldReply(Reply):
    """A reply answered in-process from what the storage said before, without asking it
    (``QUOTA_PREFETCH``'s shares, the deny cache's denials): no sign the storage is up,
    so the circuit breaker does not count it as a success."""

    __slots__ = ()
