"""Per-app state: what ``init_app`` builds and every other part reads.

The extension writes ``app.extensions["quota"]``; the CLI, the dashboard and
the inspection API read it through ``get_state``. Keeping it here (and not in
``extension.py``) is what keeps the import graph acyclic: nothing that the
extension imports needs to import the extension back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from flask import Blueprint, Flask, current_app

from .core.enforcer import Enforcer, RouteKey
from .core.generations import Generations
from .core.plans import Plan, PlanCatalog
from .core.policy import LimitSpec, Policy
from .core.route import Route
from .settings import Settings
from .sql.store import SqlStore
from .storage import Storage
from .storage.failover import GuardedStorage
from .tools.usage import UsageRecorder

if TYPE_CHECKING:
    from .metrics import QuotaMetrics

__all__ = [
    "EXEMPT_ATTR",
    "LIMIT_ATTR",
    "QuotaState",
    "add_limit",
    "exempt",
    "get_state",
    "limit_of",
    "limited_endpoints",
    "view_limit",
]

F = TypeVar("F", bound=Callable[..., Any] | Blueprint)
Limits = tuple[LimitSpec, ...]  # a view's limits, the one nearest the function first

# What the decorators leave on a view function; read once per request.
LIMIT_ATTR = "__quota_limit__"
EXEMPT_ATTR = "__quota_exempt__"


@dataclass
class QuotaState:
    """Everything one app's quota needs, kept in ``app.extensions["quota"]``."""

    # The ``Quota`` that built this state. Not typed as one: the state sits below the
    # extension, and nothing here (or in what reads the state) uses it.
    quota: Any
    settings: Settings
    storage: Storage
    guard: GuardedStorage
    policy: Policy
    sql: SqlStore
    enforcer: Enforcer
    usage: UsageRecorder | None = None  # per-minute counts for the dashboard, when mounted
    metrics: QuotaMetrics | None = None  # with QUOTA_METRICS_URL
    # endpoint -> (exempt, limits), resolved at an endpoint's first request: one dict
    # lookup per request instead of attribute probes on the view and its blueprints.
    views: dict[str, tuple[bool, Limits]] = field(default_factory=dict)
    proxy_warned: bool = False  # X-Forwarded-For without ProxyFix has been checked (once)
    # A request of this app has held a lease: from then on the app has the teardown hook
    # that gives leases back (see ``after.lease_teardown``).
    leasing: bool = False
    # block key -> (expires, what its 429 may say), see ``blocks.refusal``
    block_infos: Generations[str, tuple[float, dict[str, str | None]]] = field(
        default_factory=lambda: Generations(1024)
    )

    def view_limit(self, app: Flask, endpoint: str) -> tuple[bool, Limits]:
        """``view_limit(app, endpoint)``, cached (routes are fixed once requests run)."""
        found = self.views.get(endpoint)
        if found is None:
            found = self.views[endpoint] = view_limit(app, endpoint)
        return found

    @property
    def routes(self) -> Generations[RouteKey, Route]:
        """The enforcer's route cache."""
        return self.enforcer.routes

    @property
    def routes_of(self) -> PlanCatalog | None:
        """The catalog the cached routes were built from."""
        return self.enforcer.routes_of

    def route(
        self,
        catalog: PlanCatalog,
        plan: Plan,
        endpoint: str | None,
        method: str,
        spec: LimitSpec | None,
        resource: str | None,
        cost: int,
    ) -> Route:
        """The request's ``Route`` (see ``Enforcer.route``)."""
        return self.enforcer.route(catalog, plan, endpoint, method, spec, resource, cost)

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


def exempt(view: F) -> F:
    """Mark a view (or a blueprint: all its views) as exempt from every tier."""
    setattr(view, EXEMPT_ATTR, True)
    return view


def limit_of(view: Any) -> Limits:
    """The ``@quota.limit`` decorators recorded on a view function (or a blueprint), the
    one nearest the function first; empty when there is none."""
    specs: Limits = getattr(view, LIMIT_ATTR, ())
    return specs


def add_limit(view: Any, spec: LimitSpec) -> None:
    """Record one more ``@quota.limit`` on ``view``; two explicit resources must differ
    (they would be one bucket charged twice)."""
    found = limit_of(view)
    if spec.resource is not None and any(s.resource == spec.resource for s in found):
        what = getattr(view, "name", None) or getattr(view, "__name__", repr(view))
        raise ValueError(
            f"{what} already has a @quota.limit with resource {spec.resource!r}; "
            "give each limit stacked on a view its own resource"
        )
    setattr(view, LIMIT_ATTR, (*found, spec))


def view_limit(app: Flask, endpoint: str) -> tuple[bool, Limits]:
    """``(exempt, limits)`` of an endpoint: the view's own decorators win, then its
    blueprints', innermost first. Static files are exempt: they are not the API."""
    if endpoint.rpartition(".")[2] == "static":
        return True, ()
    view = app.view_functions.get(endpoint)
    if getattr(view, EXEMPT_ATTR, False):
        return True, ()
    specs = limit_of(view)
    name = endpoint.rpartition(".")[0]
    while not specs and name:  # "parent.child.view": child first, then parent
        blueprint = app.blueprints.get(name)
        if getattr(blueprint, EXEMPT_ATTR, False):
            return True, ()
        specs = limit_of(blueprint)
        name = name.rpartition(".")[0]
    return False, named(specs, endpoint)


def named(specs: Limits, endpoint: str) -> Limits:
    """Stacked limits with their resources set, so each has a bucket of its own: the
    first without one (nearest the function) takes the endpoint's name, as a lone
    limit does, and the n-th is named ``ENDPOINT.n``; adding a limit above the others
    leaves their buckets' keys as they were. A name another limit of the stack gives
    itself (``resource=``) is skipped: two limits never share a bucket. A lone limit is
    left as it is."""
    if len(specs) < 2:
        return specs
    taken = {spec.resource for spec in specs if spec.resource is not None}
    out: list[LimitSpec] = []
    unnamed = 0
    for spec in specs:
        name = spec.resource
        while name is None or (spec.resource is None and name in taken):
            unnamed += 1
            name = endpoint if unnamed == 1 else f"{endpoint}.{unnamed}"
        out.append(replace(spec, resource=name, stacked=True))
    return tuple(out)


def limited_endpoints(app: Flask) -> list[tuple[str, str, LimitSpec]]:
    """(method, resource, spec) for every limit of every limited route: the endpoint
    buckets an identity can have, for usage views and resets. A limit with
    ``per_method=False`` has one bucket, under the method ``*``."""
    found: dict[tuple[str, str], LimitSpec] = {}
    for rule in app.url_map.iter_rules():
        exempt, specs = view_limit(app, rule.endpoint)
        if exempt:
            continue
        methods = (rule.methods or set()) - {"HEAD", "OPTIONS"}
        for spec in specs:
            for method in sorted({spec.method_of(m) for m in methods}):
                found.setdefault((method, spec.resource or rule.endpoint), spec)
    return [(method, resource, spec) for (method, resource), spec in sorted(found.items())]
