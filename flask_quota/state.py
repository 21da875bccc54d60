"""Per-app state: what ``init_app`` builds and every other part reads.

The extension writes ``app.extensions["quota"]``; the CLI, the dashboard and
the inspection API read it through ``get_state``. Keeping it here (and not in
``extension.py``) is what keeps the import graph acyclic: nothing that the
extension imports needs to import the extension back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flask import Flask, current_app

from .alerts import Alerts
from .core.enforcer import Enforcer
from .core.generations import Generations
from .core.plans import PlanCatalog
from .core.policy import Policy
from .core.priority import Priority
from .credits import Credits
from .ledger import Ledger
from .overload import Shedder
from .recorder import UsageRecorder
from .settings import Settings
from .sql.store import SqlStore
from .storage import Storage
from .storage.failover import GuardedStorage
from .views import Found, Limits, Resolved, for_method, priority_of, resolve, watch

if TYPE_CHECKING:
    from .metrics import QuotaMetrics

__all__ = ["QuotaState", "get_state"]


@dataclass(eq=False)  # compared (and weakly referenced, ``views.watch``) by identity
class QuotaState:
    """Everything one app's quota needs, kept in ``app.extensions["quota"]``."""

    settings: Settings
    storage: Storage
    guard: GuardedStorage
    policy: Policy
    sql: SqlStore
    enforcer: Enforcer
    usage: UsageRecorder | None = None  # per-minute counts for the dashboard, when mounted
    metrics: QuotaMetrics | None = None  # with QUOTA_METRICS_URL
    # endpoint -> (exempt, limits), or those per method (``views.resolve``), resolved at
    # an endpoint's first request: one dict lookup per request instead of attribute
    # probes on the view and its blueprints. Emptied when a mark is added (``views``).
    views: dict[str, Resolved] = field(default_factory=dict)
    # (endpoint, method) -> its class (``views.priority_of``), with overload protection.
    priorities: dict[tuple[str, str], Priority | None] = field(default_factory=dict)
    shedder: Shedder | None = None  # overload protection's in-worker part, when on
    ledger: Ledger | None = None  # QUOTA_LEDGER: usage per caller and day, when on
    alerts: Alerts | None = None  # QUOTA_ALERTS: crossings of calendar quotas, when any
    # With QUOTA_WEBHOOK_URL: where events wait for the outbox (the ledger's writer,
    # which writes them also when the ledger is off).
    outbox: Ledger | None = None
    credits: Credits | None = None  # prepaid balances' seeds, checkpoints and events
    proxy_warned: bool = False  # X-Forwarded-For without ProxyFix has been checked (once)
    # A request of this app has held a lease: from then on the app has the teardown hook
    # that gives leases back (see ``after.lease_teardown``).
    leasing: bool = False
    # block key -> (expires, what its 429 may say), see ``blocking.refusal``
    block_infos: Generations[str, tuple[float, dict[str, str | None]]] = field(
        default_factory=lambda: Generations(1024)
    )

    def __post_init__(self) -> None:
        watch(self)  # a limit added later to a view empties ``views``

    def forget_views(self) -> None:
        """Resolve every endpoint again (a mark was added to a view)."""
        self.views.clear()
        self.priorities.clear()

    def priority(self, app: Flask, endpoint: str, method: str, specs: Limits) -> Priority | None:
        """``views.priority_of``, once per endpoint and method."""
        key = (endpoint, method)
        if key in self.priorities:
            return self.priorities[key]
        found = self.priorities[key] = priority_of(app, endpoint, method, specs)
        return found

    def view_limit(self, app: Flask, endpoint: str, method: str) -> Found:
        """``(exempt, limits)`` of ``endpoint`` for a request of ``method`` (``views.resolve``),
        resolved once per endpoint."""
        found = self.views.get(endpoint)
        if found is None:
            found = self.views[endpoint] = resolve(app, endpoint)
        return for_method(found, method)

    def catalog(self) -> PlanCatalog:
        """The plans, clients and overrides requests are decided with right now."""
        return self.sql.catalog()


def get_state(app: Flask | None = None) -> QuotaState:
    """The quota state of ``app`` (default: the current app).

    Raises ``RuntimeError`` with the fix when the extension was never initialised.
    """
    app = app or current_app
    try:
        state: QuotaState = app.extensions["quota"]
    except KeyError:
        raise RuntimeError(
            "flask-quota is not initialised on this app. Did you forget to call "
            "Quota(app) or quota.init_app(app)?"
        ) from None
    return state
