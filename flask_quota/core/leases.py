"""Concurrency limits: a lease is one of ``N`` slots a request holds while it runs.

A lease check rides in the same storage call as the request's rates (a
``Gate.LEASE`` check). Its storage key names the lease set *and* the request's
member, ``"<set key> <member>"``: the set holds each live member with its expiry,
the member is a random id made per request. The key travels through every
layer untouched (the deny cache, the fail modes, Cluster's slot grouping by hash
tag) and each backend splits it at its one space; a member never holds a space,
and a set key's client parts are escaped (``keys.escape`` encodes spaces).

Admission takes a slot when fewer than ``N`` members are live; giving back is a
refund of the check (the member leaves the set); a member no one gave back (a
killed worker) expires ``QUOTA_LEASE_SECONDS`` after admission, on the storage's
clock. Pure functions of ``(state, now)`` here; ``storage/lua/lease.lua`` is the
Redis twin.
"""

from __future__ import annotations

import os

from .algorithms import Step
from .clock import US
from .plans import PlanCatalog
from .rates import Rate
from .validators import MAX_SLOTS

__all__ = [
    "RETRY_US",
    "Leases",
    "lease_key",
    "lease_step",
    "new_member",
    "release",
    "slots",
    "split",
    "upgrade_hint",
]

RETRY_US = US
"""A denied lease's wait: a slot frees when any request in flight ends, which nothing
predicts; one second is the shortest whole ``Retry-After``. (The storage cannot tell a
holder that died from one still working: the oldest lease's expiry, the latest moment a
slot is sure to be free, is the denial's ``reset`` instead.)"""

Leases = tuple[tuple[int, str], ...]
"""A lease set's state in memory: (expires_at_us, member) of each slot held."""


def slots(value: object) -> int:
    """A concurrency limit's slots (``concurrent=N``): an int from 1 to ``MAX_SLOTS``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise ValueError(
            f"concurrent must be an int from 1 to {MAX_SLOTS:,} (requests in flight at once), "
            f"got {value!r}"
        )
    return value


def new_member() -> str:
    """A request's own member in its lease sets: 64 random bits, hex."""
    return os.urandom(8).hex()


def lease_key(set_key: str, member: str = "") -> str:
    """A lease check's key: the set and the member (none: a peek or a reset)."""
    return f"{set_key} {member}"


def split(key: str) -> tuple[str, str]:
    """``(set key, member)`` of a lease check's key."""
    set_key, _, member = key.rpartition(" ")
    return set_key, member


def lease_step(state: Leases | None, now: int, rate: Rate, cost: int, member: str) -> Step:
    """Take a slot for ``member`` if one of ``rate.limit`` is free (``cost`` 1), or
    only look (``cost`` 0). The state to store is the live members plus this one, for
    ``rate.window_us`` (``QUOTA_LEASE_SECONDS``): the newest member lives longest."""
    live = tuple(e for e in state if e[0] > now) if state else ()
    held, limit = len(live), rate.limit
    if held + cost > limit:
        sure = min(e[0] for e in live) if live else now + RETRY_US  # the oldest's expiry
        return Step(False, limit, 0, sure, RETRY_US, None, 0)
    if cost == 0:
        return Step(True, limit, limit - held, now, 0, None, 0)
    ttl = rate.window_us
    return Step(True, limit, limit - held - 1, now, 0, (*live, (now + ttl, member)), ttl)


def release(state: Leases | None, now: int, member: str) -> tuple[Leases | None, int]:
    """The set without ``member`` (and its expired members), and how long it lives."""
    live = tuple(e for e in state if e[0] > now and e[1] != member) if state else ()
    if not live:
        return None, 0
    return live, max(e[0] for e in live) - now


def upgrade_hint(catalog: PlanCatalog, plan: str, *, of_plan: bool) -> str | None:
    """The 429's ``upgrade`` for a concurrency denial: for a plan's limit (``of_plan``)
    the next plan that allows more in flight. A limit's ``concurrent=`` is the same on
    every plan, so none is offered; nor the plan's own ``upgrade`` text, which is about
    its rates."""
    current = catalog.get(plan)
    if current is None or not of_plan:
        return None
    mine = current.concurrent or 0
    later = list(catalog)[list(catalog).index(plan) + 1 :]
    for name in later:
        theirs = catalog[name].concurrent
        if theirs is not None and theirs > mine:
            return (
                f"{name.capitalize()} raises this to {theirs} in flight: see {catalog.upgrade_url}"
            )
    return None
