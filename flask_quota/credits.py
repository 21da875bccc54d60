"""Prepaid credits between the counter storage and SQL: seeds, checkpoints, grants, events.

The balance of record lives in the counter storage (Redis), where a request spends it in
the same atomic call as its other checks (``core/credits.py``, ``lua/credits.lua``). SQL
keeps what it is rebuilt from:

- **Grants** (``quota_credit_grants``): written first, then added to the balance the
  storage holds (``push``, idempotent by id). Every worker's writer pushes each grant of
  the last day once more, so a grant whose own push failed reaches every server within
  the sync interval of the storage answering.
- **Checkpoints** (``quota_credit_balances``): each worker notes the balances its
  requests changed (``spent``), and its writer thread copies their states to SQL every
  ``QUOTA_SYNC_INTERVAL``, a newer version over an older one.
- **Seeds.** A request whose balance the storage does not hold (never used, expired
  after 30 idle days, or lost: ``FLUSHALL``, a failover to an empty replica) is refused
  by the storage with a seed mark and nothing charged; ``seed`` puts back the last
  checkpoint plus every grant made since (``SET NX``: the first of many workers wins),
  then the request is asked again. Grants committed while a seed was built are pushed
  after it, so none is missed.

What a fault can lose (docs/credits.md states it for users): a lost balance comes back as
its last checkpoint, so the units spent after it are given back to the caller, at most
what it spent in the last ``QUOTA_SYNC_INTERVAL`` before the loss (plus one writer's
round). Nothing is ever spent twice: a seed only ever restores a state the storage had.

The writer also tells ``credits.low`` (the balance at or under a ``QUOTA_ALERTS`` share of
the last grant used up) and ``credits.exhausted`` (at or under zero): each once per
balance and grant across every worker (``Storage.claim``), as signals and webhook events.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfo

from flask import Flask
from sqlalchemy.exc import SQLAlchemyError

from . import signals
from .core.credits import TTL_US, Balance, dump, parse, seeded
from .core.keys import KeyBuilder
from .core.plans import Plan
from .core.rates import Credits as CreditRates
from .sql.credits import (
    GrantInfo,
    checkpoint_of,
    credit_resources,
    expiry,
    grants_of,
    new_grant,
    recent_grants,
    write_checkpoints,
)
from .sql.store import SqlStore
from .storage import Storage, StorageError
from .writer import start_writer

if TYPE_CHECKING:
    from .ledger import Ledger
    from .metrics import QuotaMetrics

__all__ = ["CreditStore", "Credits", "backend_of"]

log = logging.getLogger("flask_quota")

LOW, EXHAUSTED = "credits.low", "credits.exhausted"
REPUSH = timedelta(days=1)  # grants this recent are pushed once more by every worker
CLAIM_SECONDS = 366 * 86400  # an event is told once per balance and grant: for long
_MAX_PENDING = 100_000  # balances waiting for their checkpoint (the database is away)


class CreditStore(Protocol):
    """What a backend offers for balances off the request path (memory, Redis, Cluster)."""

    def credit_states(self, keys: Sequence[str]) -> list[str | None]: ...

    def credit_seed(self, key: str, text: str, ttl_us: int) -> bool: ...

    def credit_grant(self, key: str, grant: tuple[int, int, int]) -> bool: ...

    def claim(self, key: str, seconds: int) -> bool: ...


def backend_of(storage: Storage) -> CreditStore:
    """The backend under the in-process layers (deny cache, prefetch), which hold no
    balance: a balance is read and seeded where it is decided."""
    found: Any = storage
    while not hasattr(found, "credit_states") and hasattr(found, "storage"):
        found = found.storage
    if not hasattr(found, "credit_states"):
        raise TypeError(f"the {storage.name} storage keeps no prepaid credits")
    return found  # type: ignore[no-any-return]


class Credits:
    """One app's prepaid balances: the enforcer's ``CreditBook`` (``seed``, ``spent``), the
    grants' push, the writer thread's checkpoints and events, and reads for operators."""

    def __init__(
        self,
        app: Flask,
        storage: Storage,
        sql: SqlStore,
        keys: KeyBuilder,
        *,
        interval: float,
        alerts: Sequence[float] = (),
        outbox: Callable[[], Ledger | None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.app = weakref.ref(app)  # the credits live in app.extensions: no cycle
        self._storage = storage
        self.sql, self.keys, self.interval, self.clock = sql, keys, interval, clock
        self.shares = tuple(sorted(s for s in alerts if 0 < s < 1))  # 1.0: exhausted
        self.outbox = outbox
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, str]] = {}  # key -> (caller, resource)
        self._pushed: set[int] = set()  # grants this worker pushed (REPUSH)
        self._told: set[str] = set()  # claims this worker made or saw taken
        self._thread_pid: int | None = None
        self._wake = threading.Event()

    @property
    def store(self) -> CreditStore:
        return backend_of(self._storage)

    def key(self, caller: str, resource: str) -> str:
        """The storage key of ``caller``'s balance of ``resource`` (the policy's)."""
        return self.keys.credits_key(KeyBuilder.identity_tag(caller), resource)

    # -- the request path (CreditBook) ----------------------------------------------

    def seed(self, items: Sequence[tuple[str, str, str]]) -> None:
        """Put each balance back where the storage holds none: its checkpoint and every
        grant since. Raises (SQL or storage errors) when it cannot: the request is 503."""
        store = self.store
        for key, caller, resource in items:
            found = checkpoint_of(self.sql, caller, resource)
            grants = grants_of(self.sql, caller, resource)
            checkpoint = parse(found[0]) if found is not None else None
            # Expiry is judged by the storage's clock, at its next decision: none here.
            state = seeded(checkpoint, [g.entry for g in grants], 0)
            store.credit_seed(key, dump(state), TTL_US)
            # A grant committed after the read above, whose own push found no balance.
            known = {g.id for g in state.grants}
            for grant in grants_of(self.sql, caller, resource):
                if grant.id not in known:
                    store.credit_grant(key, grant.entry[:3])

    def spent(self, items: Sequence[tuple[str, str, str]]) -> None:
        """Balances a request changed: checkpointed by the writer within an interval."""
        with self._lock:
            for key, caller, resource in items:
                if len(self._pending) < _MAX_PENDING or key in self._pending:
                    self._pending[key] = (caller, resource)
        if self._thread_pid != os.getpid():
            self._start()

    def _metrics(self) -> QuotaMetrics | None:
        """The app's metrics (``QUOTA_METRICS_URL``), if any: made before these credits."""
        app = self.app()
        state = app.extensions.get("quota") if app is not None else None
        return getattr(state, "metrics", None)

    # -- operators ----------------------------------------------------------------

    def push(self, grant: GrantInfo) -> bool:
        """Add a new grant (just written: ``quota.grant``, the CLI, the dashboard) to the
        balance the storage holds (none held: its seed reads it). Counted as granted in
        the metrics, whether or not the storage answers: the grant is saved."""
        metrics = self._metrics()
        if metrics is not None:
            metrics.credits_granted_units(grant.resource, grant.units)
        return self._add(grant)

    def _add(self, grant: GrantInfo) -> bool:
        added = self.store.credit_grant(self.key(grant.caller, grant.resource), grant.entry[:3])
        with self._lock:
            self._pushed.add(grant.id)
        return added

    def grant(
        self,
        caller: str,
        resource: str,
        units: object,
        expires: datetime | date | str | None,
        note: str,
        *,
        actor: str,
        zone: ZoneInfo,
    ) -> tuple[GrantInfo, Exception | None]:
        """Write a grant (``sql.credits.new_grant``: validated, audited under ``actor``;
        bad input raises ``AdminError`` and writes nothing; a date ``expires`` is midnight
        in ``zone``), then ``push`` it. Returns it and the push's error, if any: the grant
        is saved, and every worker adds it within the sync interval. The one way a grant
        is made: ``quota.grant``, ``flask quota credits grant`` and the dashboard."""
        info = new_grant(
            self.sql, actor=actor, caller=caller, resource=resource,
            units=units,  # type: ignore[arg-type]  # new_grant refuses a non-int
            expires_at=expiry(expires, zone), note=note,
        )  # fmt: skip
        try:
            self.push(info)
        except StorageError as exc:  # the storage away: every worker's writer pushes it again
            log.warning("flask-quota: grant %d saved; adding it waits for the storage (%s)",
                        info.id, exc)  # fmt: skip
            return info, exc
        return info, None

    def balance(self, caller: str, resource: str) -> Balance:
        """``caller``'s balance of ``resource`` as the storage holds it, seeded first when
        it holds none (raises ``StorageError`` or an SQL error when it cannot)."""
        key = self.key(caller, resource)
        text = self.store.credit_states([key])[0]
        if text is None:
            self.seed([(key, caller, resource)])
            text = self.store.credit_states([key])[0]
        return parse(text) if text is not None else Balance(0, 0, ())

    def report(self, caller: str, resources: Sequence[str] = ()) -> list[dict[str, Any]]:
        """``caller``'s balances, one per resource it has grants of (or in ``resources``):
        ``{"resource", "balance", "grants": [{"id", "units", "left", "expires", "expired",
        "note", "created", "by"}]}``,
        the balance as the storage holds it (None while it cannot answer; ``left`` is then
        None too). What ``flask quota credits show``, the status endpoint and the
        dashboard show."""
        grants = grants_of(self.sql, caller)
        names = sorted({g.resource for g in grants} | set(resources))
        now = self.clock()
        now_us = int(now.timestamp() * 1_000_000)
        found = []
        for resource in names:
            try:
                state: Balance | None = self.balance(caller, resource)
            except Exception as exc:  # the storage (or SQL) away: the grants still show
                log.warning("flask-quota: the balance of %r could not be read (%s)", caller, exc)
                state = None
            held = {g.id: g for g in state.grants} if state is not None else {}
            found.append({
                "resource": resource,
                "balance": state.available(now_us) if state is not None else None,
                "grants": [
                    {
                        "id": g.id,
                        "units": g.units,
                        "left": (held[g.id].left if g.id in held and held[g.id].live(now_us)
                                 else 0) if state is not None else None,
                        "expires": None if g.expires_at is None else g.expires_at.isoformat(),
                        "expired": g.expires_at is not None and g.expires_at <= now,
                        "note": g.note,
                        "created": g.created_at.isoformat(),
                        "by": g.created_by,
                    }
                    for g in grants if g.resource == resource
                ],
            })  # fmt: skip
        return found

    def resources(self, plan: Plan | None = None) -> list[str]:
        """The credits resources of ``plan``, or of every plan in force (sorted)."""
        if plan is None:
            return sorted(credit_resources(self.sql))
        return sorted(r for r, rates in plan.resources.items() if isinstance(rates, CreditRates))

    def status(
        self, caller: str, plan: Plan, declared: Mapping[str, str | None]
    ) -> list[dict[str, Any]] | None:
        """The status endpoint's ``credits``: per resource of ``plan``'s credits (and any
        other the caller holds grants of), ``{"resource", "balance", "unit", "grants":
        [{"units", "left", "expires"}]}`` with the grants that still count, soonest
        expiring first (never-expiring last). No note, id or operator: those are the
        operators'. None while the database cannot answer; ``balance`` and ``left`` are
        None while the storage cannot. ``declared``: each resource's decorator unit."""
        try:
            found = self.report(caller, self.resources(plan))
        except SQLAlchemyError as exc:
            log.warning("flask-quota: the status endpoint could not read credits (%s)", exc)
            return None
        return [
            {
                "resource": r["resource"],
                "balance": r["balance"],
                "unit": plan.unit_for(r["resource"], declared.get(r["resource"])),
                "grants": [
                    {"units": g["units"], "left": g["left"], "expires": g["expires"]}
                    for g in sorted(r["grants"], key=_spending_order)
                    if not g["expired"]
                ],
            }
            for r in found
        ]

    # -- the writer ---------------------------------------------------------------

    def flush(self) -> None:
        """Checkpoint the balances noted since the last flush, tell their events, and push
        the grants of the last day this worker has not pushed. A balance the database
        could not take waits for the next flush."""
        with self._lock:
            pending, self._pending = self._pending, {}
        try:
            if pending:
                self._checkpoint(pending)
            self._repush()
        except Exception as exc:  # SQL or storage away: kept, tried again next interval
            with self._lock:
                for key, value in pending.items():
                    self._pending.setdefault(key, value)
            log.warning("flask-quota: prepaid credits wait to be checkpointed (%s)", exc)

    def _checkpoint(self, pending: dict[str, tuple[str, str]]) -> None:
        keys = list(pending)
        states = self.store.credit_states(keys)
        rows, read = [], []
        for key, text in zip(keys, states, strict=True):
            if text is None:
                continue  # lost meanwhile: its seed restores the last checkpoint
            caller, resource = pending[key]
            state = parse(text)
            rows.append((caller, resource, text, state.version))
            read.append((key, caller, resource, state))
        write_checkpoints(self.sql, rows)
        now_us = int(self.clock().timestamp() * 1_000_000)
        for key, caller, resource, state in read:
            self._events(key, caller, resource, state, now_us)

    def _repush(self) -> None:
        for grant in recent_grants(self.sql, self.clock() - REPUSH):
            if grant.id not in self._pushed:
                self._add(grant)  # pushed again, not granted again: not counted

    def _events(self, key: str, caller: str, resource: str, state: Balance, now_us: int) -> None:
        """``credits.low`` and ``credits.exhausted`` of one balance, each claimed once per
        grant across every worker (the last grant's id names the claim)."""
        last = state.last_grant()
        if last is None:
            return
        balance = state.available(now_us)
        found = [(LOW, s) for s in self.shares if balance <= (1 - s) * last.units]
        if balance <= 0:
            found.append((EXHAUSTED, 1.0))
        for kind, share in found:
            claim = f"{key}:{kind}:{last.id}:{share:g}"
            if claim in self._told:
                continue
            try:
                claimed = self.store.claim(claim, CLAIM_SECONDS)
            except StorageError:
                return  # told at the next flush that reads this balance
            self._told.add(claim)
            if claimed:
                self._tell(kind, caller, resource, balance, share, last.id, last.units)

    def _tell(
        self, kind: str, caller: str, resource: str, balance: int, share: float, grant: int,
        units: int,
    ) -> None:  # fmt: skip
        data = {"caller": caller, "resource": resource, "balance": balance, "grant": grant,
                "units": units}  # fmt: skip
        if kind == LOW:
            data["share"] = share
        app = self.app()
        metrics = self._metrics()
        if metrics is not None:
            metrics.credits_event(resource, kind)
        signal = signals.credits_low if kind == LOW else signals.credits_exhausted
        if app is not None and signal.receivers:
            with app.app_context():
                signals.notify(signal, app, **data)
        outbox = self.outbox()
        if outbox is not None:
            from .webhooks import new_event  # only with QUOTA_WEBHOOK_URL

            outbox.event(new_event(kind, data, self.clock()))

    def _start(self) -> None:
        # Started lazily, in the worker that spends (gunicorn forks after init_app).
        with self._lock:
            if self._thread_pid == os.getpid():
                return
            self._thread_pid = os.getpid()
            self._wake = threading.Event()
        start_writer(self, "flask-quota-credits")


def _spending_order(grant: dict[str, Any]) -> tuple[bool, str, int]:
    """A reported grant's place in spending order (``core.credits``): soonest expiry
    first, never-expiring last, then by id (every expiry is UTC: its text sorts)."""
    expires = grant["expires"]
    return expires is None, expires or "", grant["id"]
