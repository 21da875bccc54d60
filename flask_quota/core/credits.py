"""Prepaid credits as pure functions of ``(balance, now, cost)``: no Flask, SQL or Redis.

A credits resource (``{"resources": {"ai_tokens": "credits"}}``) is a balance per
caller that time never refills: grants add to it, admitted units spend it. The counter
storage holds the balance of record between checkpoints (``flask_quota.credits``); its
state is a ``Balance``, stored as the text ``dump`` writes, which ``lua/credits.lua``
reads and writes with the same rules, so memory and Redis decide alike.

- **Soonest-expiring first.** Grants are kept in spending order: the one that expires
  first, then the next; grants without an expiry last, oldest first. Spending takes from
  the front, so units that would lapse go first.
- **Expiry on the storage's clock.** A grant counts while ``now < expires_us``; at its
  expiry what is left of it stops counting (and is dropped at the next write).
- **Debt.** A decision never spends more than the balance. A charge after the fact
  (``quota.settle`` above the admitted cost) takes what is left and owes the rest: the
  balance goes negative by at most that difference, and the next grant pays it first.
- **Idempotent grants.** A grant is added once by its id (``add_grant``): pushing it
  again, from any worker, changes nothing. An entry stays until its grant expires, so a
  grant cannot come back as new while it still counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .algorithms import Step
from .rates import Rate

__all__ = [
    "SEED",
    "TTL_US",
    "Balance",
    "Grant",
    "add_grant",
    "charge",
    "credits_step",
    "dump",
    "parse",
    "refund",
    "seeded",
    "spend",
]

SEED = -1
"""A credits check's ``retry_us`` when the storage holds no balance for it (never
written, expired, or lost with the counters): the balance must be seeded from SQL
(``flask_quota.credits``) and the request asked again. A real wait is never negative."""

TTL_US = 30 * 86400 * 1_000_000
"""How long a balance stays in the counter storage after its last change. Its checkpoint
is written within a sync interval of each change, so one that expires is seeded again
from SQL, losing nothing."""


class Grant(NamedTuple):
    """One grant as the balance holds it: its SQL id, when it expires (microseconds on the
    storage's clock; 0: never), the units it gave and the units left of it."""

    id: int
    expires_us: int
    units: int
    left: int

    def live(self, now: int) -> bool:
        return self.expires_us == 0 or now < self.expires_us


class Balance(NamedTuple):
    """A caller's balance of one resource: ``version`` (one more per change: checkpoints
    keep the newest), ``debt`` (units owed by a charge past zero) and its grants in
    spending order."""

    version: int
    debt: int
    grants: tuple[Grant, ...]

    def available(self, now: int) -> int:
        """Units that may be spent at ``now``: what the live grants hold, less the debt."""
        return sum(g.left for g in self.grants if g.live(now)) - self.debt

    def last_grant(self) -> Grant | None:
        """The newest grant (highest id): ``credits.low`` is told in shares of it."""
        return max(self.grants, key=lambda g: g.id, default=None)


def _order(grant: Grant) -> tuple[bool, int, int]:
    """Spending order: soonest expiry first, never-expiring last, then by id."""
    return grant.expires_us == 0, grant.expires_us, grant.id


def parse(text: str | bytes) -> Balance:
    """A balance from its stored text: ``"version:debt|id:expires:units:left,..."``."""
    if isinstance(text, bytes):
        text = text.decode()
    head, _, body = text.partition("|")
    version, debt = (int(n) for n in head.split(":"))
    grants = tuple(Grant(*(int(n) for n in part.split(":"))) for part in body.split(",") if part)
    return Balance(version, debt, grants)


def dump(balance: Balance) -> str:
    """The stored text of ``balance`` (``parse``'s inverse; ``lua/credits.lua`` writes the same)."""
    grants = ",".join(f"{g.id}:{g.expires_us}:{g.units}:{g.left}" for g in balance.grants)
    return f"{balance.version}:{balance.debt}|{grants}"


def credits_step(state: Balance | None, now: int, rate: Rate, cost: int) -> Step:
    """The decision of a credits check (``Gate.CREDITS``): allowed when ``cost`` fits the
    available units, which it then spends. ``remaining`` is the balance after it, ``reset``
    ``now`` (nothing refills), ``retry`` 0 (waiting does not help) or ``SEED`` when the
    storage holds no balance. ``rate`` is the placeholder of ``rates.CREDITS``."""
    if state is None:
        return Step(False, 0, 0, now, SEED, None, 0)
    available = state.available(now)
    if cost > available:
        return Step(False, 0, available, now, 0, None, 0)
    if cost <= 0:  # a look: the state stays as it is
        return Step(True, 0, available, now, 0, state, TTL_US)
    return Step(True, 0, available - cost, now, 0, spend(state, now, cost), TTL_US)


def _live(grants: Iterable[Grant], now: int) -> list[Grant]:
    return [g for g in grants if g.live(now)]


def spend(state: Balance, now: int, cost: int) -> Balance:
    """``cost`` units taken from the live grants, soonest-expiring first; what they cannot
    cover becomes debt (a decision checks first that it fits: only a charge owes)."""
    grants = []
    for grant in _live(state.grants, now):
        take = min(cost, grant.left)
        cost -= take
        grants.append(grant._replace(left=grant.left - take))
    return Balance(state.version + 1, state.debt + cost, tuple(grants))


def charge(state: Balance | None, now: int, cost: int) -> Balance | None:
    """A charge after the fact (``quota.settle`` above the admitted cost): ``spend``, into
    debt if need be. None when the storage holds no balance (lost meanwhile): the charge
    is then lost, which the docs count among what a fault can give back."""
    return None if state is None else spend(state, now, cost)


def refund(state: Balance | None, now: int, cost: int) -> Balance | None:
    """``cost`` units given back (``quota.settle`` below the admitted cost, a refund of a
    denied request's other slot): the debt first, then the live grants with room, the
    latest-expiring first, each up to what it gave (the inverse of ``spend`` when no other
    request came between). Units whose grant has expired meanwhile are not given back."""
    if state is None:
        return None
    paid = min(cost, state.debt)
    cost -= paid
    grants = _live(state.grants, now)
    for i in range(len(grants) - 1, -1, -1):
        if cost <= 0:
            break
        grant = grants[i]
        back = min(cost, grant.units - grant.left)
        if back > 0:
            grants[i] = grant._replace(left=grant.left + back)
            cost -= back
    return Balance(state.version + 1, state.debt - paid, tuple(grants))


def add_grant(state: Balance, now: int, grant: Grant) -> Balance | None:
    """``state`` with ``grant`` (a new one: ``left == units``) added in spending order, its
    units paying the debt first; None when it is there already or has expired, so a grant
    pushed twice, or by every worker, counts once."""
    if not grant.live(now) or any(g.id == grant.id for g in state.grants):
        return None
    paid = min(state.debt, grant.left)
    added = grant._replace(left=grant.left - paid)
    grants = sorted((*_live(state.grants, now), added), key=_order)
    return Balance(state.version + 1, state.debt - paid, tuple(grants))


def seeded(checkpoint: Balance | None, grants: Iterable[Grant], now: int) -> Balance:
    """The balance to put back in a storage that holds none: its last checkpoint (from
    SQL), with each grant it does not know yet (made since) added whole."""
    state = checkpoint or Balance(0, 0, ())
    state = Balance(state.version, state.debt, tuple(sorted(_live(state.grants, now), key=_order)))
    for grant in sorted(grants, key=lambda g: g.id):
        added = add_grant(state, now, grant)
        if added is not None:
            state = added._replace(version=state.version)  # seeding is not a change
    return state
