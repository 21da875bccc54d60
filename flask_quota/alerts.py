"""Threshold alerts (``QUOTA_ALERTS``) and the events a request decides.

A crossing is found where the count is kept: the storage's atomic reply says what a
calendar bucket held after the request, and exactly one admitted request of all the
workers takes it across a share's line (``core.near``'s rule, as
``QUOTA_NEAR_LIMIT``'s). A refund may bring the bucket back under the line, and the next
request would cross it again; so before telling anyone, the crossing is *claimed* in the
same storage (``Storage.claim``, a key held until the period ends): once per bucket,
share and period, across every worker and server. The claim is made by the ledger's
writer thread, never in a request: a request only notes the crossing in-process.

Then ``signals.quota_alert`` is sent (from that thread, inside an app context), the
``flask_quota_alerts`` metric counts it, and with ``QUOTA_WEBHOOK_URL`` a ``quota.alert``
event joins the outbox in the writer's next transaction. The first denial of a calendar
quota in its period is claimed the same way (``quota.exceeded``).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from flask import Flask

from . import signals
from .storage import Storage, StorageError

if TYPE_CHECKING:
    from .ledger import Ledger
    from .metrics import QuotaMetrics

__all__ = ["ALERT", "EXCEEDED", "Alerts", "Crossing", "claim_key", "event_data"]

log = logging.getLogger("flask_quota")

MAX_WAITING = 10_000  # crossings waiting for their claim (the storage is down): more drop
ALERT, EXCEEDED = "quota.alert", "quota.exceeded"


@dataclass(frozen=True, slots=True)
class Crossing:
    """A calendar bucket taken across a share (``kind`` ALERT), or its first denial in
    the period (EXCEEDED), noted by a request and waiting for its claim."""

    kind: str
    key: str  # the bucket's storage key
    share: float  # 1.0 for EXCEEDED
    period: tuple[int, int]  # the window's start and end, microseconds since the epoch
    identity: str
    tenant: str | None
    resource: str  # the tier's policy name: "user", "tenant", or the resource
    limit: int
    plan: str


class Alerts:
    """Crossings noted by requests, claimed and told by the writer thread (``process``)."""

    def __init__(
        self,
        app: Flask,
        storage: Storage,
        shares: Sequence[float],
        *,
        metrics: QuotaMetrics | None = None,
        client_of: Callable[[str], str | None] = lambda identity: None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.app = weakref.ref(app)  # the alerts live in app.extensions: no cycle
        self.storage, self.shares, self.metrics, self.now = storage, tuple(shares), metrics, now
        self.client_of = client_of  # an identity's SQL client id, if it is one
        self.outbox: Ledger | None = None  # where events go: with QUOTA_WEBHOOK_URL
        self.wake: Callable[[], None] = lambda: None  # starts the writer (``Ledger.poke``)
        self.dropped = 0
        self._lock = threading.Lock()
        self._waiting: list[Crossing] = []
        # Claims this worker already made or saw taken: a flood of denials of one spent
        # quota asks the storage once, not once per denial.
        self._settled: set[str] = set()

    def note(self, crossing: Crossing) -> bool:
        """Keep ``crossing`` for the next ``process``; False when it is settled already
        or too many wait."""
        claim = claim_key(crossing)
        with self._lock:
            if claim in self._settled:
                return False
            if len(self._waiting) >= MAX_WAITING:
                self.dropped += 1
                return False
            self._waiting.append(crossing)
            if len(self._settled) >= MAX_WAITING:
                self._settled.clear()  # forgetting costs one claim more, never an alert
            self._settled.add(claim)
        self.wake()
        return True

    def waiting(self) -> bool:
        return bool(self._waiting)

    def process(self) -> None:
        """Claim each waiting crossing; tell those this worker claimed. One the storage
        could not answer waits for the next call (the storage is down)."""
        with self._lock:
            todo, self._waiting = self._waiting, []
        if not todo:
            return
        now_us = int(self.now().timestamp() * 1_000_000)
        keep: list[Crossing] = []
        for i, crossing in enumerate(todo):
            end = crossing.period[1]
            if end <= now_us:
                continue  # its period is over: nobody is told of last month's crossing
            seconds = max(1, math.ceil((end - now_us) / 1_000_000))
            try:
                claimed = self.storage.claim(claim_key(crossing), seconds)
            except StorageError as exc:
                keep.extend(todo[i:])
                log.warning("flask-quota: alerts wait for the storage (%s)", exc)
                break
            if claimed:
                self._tell(crossing)
        if keep:
            with self._lock:
                for crossing in keep:
                    self._settled.discard(claim_key(crossing))  # noted again, if it comes
                self._waiting[:0] = keep[: MAX_WAITING - len(self._waiting)]

    def _tell(self, crossing: Crossing) -> None:
        period = _period(crossing.period)
        client = self.client_of(crossing.identity)
        if crossing.kind == ALERT:
            if self.metrics is not None:
                self.metrics.alert(crossing.resource, crossing.share)
            app = self.app()
            if app is not None and signals.quota_alert.receivers:
                with app.app_context():
                    signals.notify(
                        signals.quota_alert, app, identity=crossing.identity,
                        client=client, tenant=crossing.tenant,
                        resource=crossing.resource, share=crossing.share, period=period,
                    )  # fmt: skip
        if self.outbox is not None:
            from .webhooks import new_event  # only with QUOTA_WEBHOOK_URL

            data = event_data(crossing, client)
            self.outbox.event(new_event(crossing.kind, data, self.now()))


def _period(period: tuple[int, int]) -> dict[str, str]:
    """A window as ISO 8601 instants (UTC): from its start, until its end (excluded)."""
    start, end = (datetime.fromtimestamp(us / 1_000_000, UTC).isoformat() for us in period)
    return {"start": start, "end": end}


def claim_key(crossing: Crossing) -> str:
    """The storage key a crossing is claimed under: its bucket's, what, and the period."""
    what = "exceeded" if crossing.kind == EXCEEDED else f"alert:{crossing.share:g}"
    return f"{crossing.key}:{what}:{crossing.period[0]}"


def event_data(crossing: Crossing, client: str | None) -> dict[str, Any]:
    """The ``data`` of a crossing's webhook event."""
    data: dict[str, Any] = {
        "identity": crossing.identity,
        "client": client,
        "tenant": crossing.tenant,
        "resource": crossing.resource,
        "limit": crossing.limit,
        "plan": crossing.plan,
        "period": _period(crossing.period),
    }
    if crossing.kind == ALERT:
        data["share"] = crossing.share
    return data
