"""The Flask extension: thin wiring between requests and the decision objects."""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from flask import Flask, Request, Response, current_app, g, request

from .breaker import CircuitBreaker
from .denycache import DenyCache
from .errors import InvalidApiKey, QuotaExceeded
from .failover import GuardedStorage
from .headers import apply_headers, rate_limit_headers
from .identity import Identity, plausible_api_key
from .keys import KeyBuilder, remote_ip_tag
from .plans import PlanCatalog
from .policy import Decision, LimitSpec, Policy
from .rates import Rate, parse_rate
from .settings import DEFAULTS, Settings
from .sql_store import KeysUnavailable, SqlStore
from .storage import Storage, storage_from_url
from .usage import UsageRecorder, usage_sink

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = ["Quota", "QuotaState", "exempt", "get_state", "limited_endpoints"]

log = logging.getLogger("flask_quota")

F = TypeVar("F", bound=Callable[..., Any])

_LIMIT_ATTR = "__quota_limit__"
_EXEMPT_ATTR = "__quota_exempt__"
_RESOURCE_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass
class QuotaState:
    """Everything one app's quota needs, kept in ``app.extensions["quota"]``."""

    quota: Quota
    settings: Settings
    storage: Storage
    guard: GuardedStorage
    policy: Policy
    catalog: Callable[[], PlanCatalog]  # swapped for a SQL-backed source by the SQL layer
    usage: UsageRecorder | None = None  # per-minute counts for the dashboard, when mounted
    sql: SqlStore | None = None  # plans, clients and overrides in SQL; set by init_app


def get_state(app: Flask | None = None) -> QuotaState:
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
    """Mark a view as exempt from every tier (``@quota.exempt`` without an instance)."""
    setattr(view, _EXEMPT_ATTR, True)
    return view


def limited_endpoints(app: Flask) -> list[tuple[str, str, LimitSpec]]:
    """(method, resource, spec) for every route with ``@quota.limit``: the endpoint
    buckets an identity can have, for usage views and resets."""
    found: dict[tuple[str, str], LimitSpec] = {}
    for rule in app.url_map.iter_rules():
        spec = getattr(app.view_functions.get(rule.endpoint), _LIMIT_ATTR, None)
        if spec is None:
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            found.setdefault((method, spec.resource or rule.endpoint), spec)
    return [(method, resource, spec) for (method, resource), spec in sorted(found.items())]


def _gunicorn_workers() -> int | None:
    """Workers of the gunicorn serving us, from its command line; None if unknown."""
    try:
        args = shlex.split(os.environ.get("GUNICORN_CMD_ARGS", "")) + sys.argv[1:]
    except ValueError:
        return None
    workers: str | None = os.environ.get("WEB_CONCURRENCY", "1")
    for i, arg in enumerate(args):
        if arg in ("-w", "--workers"):
            workers = args[i + 1] if i + 1 < len(args) else None
        elif arg.startswith("--workers="):
            workers = arg.partition("=")[2]
        elif arg.startswith("-w") and arg[2:].isdigit():
            workers = arg[2:]
    return int(workers) if workers and workers.isdigit() else None


class Quota:
    """Rate limiting for a Flask app: ``Quota(app)`` or ``Quota()`` + ``init_app(app)``.

    ``storage`` replaces the backend built from ``QUOTA_STORAGE_URL`` (tests use it
    to inject a clock). ``db``, the app's Flask-SQLAlchemy, keeps the quota tables
    in the app's database; without it they live at ``QUOTA_DATABASE_URL``.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        storage: Storage | None = None,
        db: SQLAlchemy | None = None,
    ) -> None:
        self._storage = storage
        self._db = db
        self._identity_loader: Callable[[], Identity | None] | None = None
        self._api_key_loader: Callable[[str], Identity | None] | None = None
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        if "quota" in app.extensions:
            raise RuntimeError(
                "flask-quota is already initialised on this app; call init_app once per app."
            )
        for key, default in DEFAULTS.items():
            app.config.setdefault(key, default)
        settings = Settings.from_config(app.config)
        storage = self._storage
        if storage is None:
            storage = storage_from_url(settings.storage_url, timeout=settings.storage_timeout)
        breaker = CircuitBreaker(storage.name, cooldown=settings.breaker_cooldown)
        # Plans, API keys and overrides come from SQL: the host's `db`, or our own
        # engine for QUOTA_DATABASE_URL (a SQLite file in the instance folder by default).
        sql = SqlStore(settings, db=self._db, instance_path=app.instance_path)
        usage = None
        if settings.dashboard_url is not None:
            usage = UsageRecorder(usage_sink(storage, settings.key_prefix))
        if self._storage is None and settings.deny_cache and storage.name != "memory":
            storage = DenyCache(storage)  # a flood of denials stays off Redis
        app.extensions["quota"] = QuotaState(
            quota=self,
            settings=settings,
            storage=storage,
            guard=GuardedStorage(storage, settings.fail_mode, breaker),
            policy=Policy(KeyBuilder(settings.key_prefix), settings.algorithm),
            catalog=sql.catalog,
            usage=usage,
            sql=sql,
        )
        sql.autostart(app, needed=settings.dashboard_url is not None)
        app.before_request(self._before_request)
        app.after_request(self._after_request)
        if settings.dashboard_url is not None:
            from dashboard import make_blueprint  # the dashboard is loaded only when mounted

            app.register_blueprint(make_blueprint(), url_prefix=settings.dashboard_url)
        if self._api_key_loader is None:
            self._api_key_loader = _sql_api_key  # a loader registered later replaces it
        from .cli import quota_cli  # cli.py imports this module

        app.cli.add_command(quota_cli)
        workers = _gunicorn_workers()
        if storage.name == "memory" and workers != 1 and "gunicorn" in sys.modules:
            log.warning(
                "flask-quota: QUOTA_STORAGE_URL is memory:// under gunicorn with %s workers: "
                "every worker keeps its own counters, so each limit is multiplied by the "
                "number of workers. Set QUOTA_STORAGE_URL=redis://... to share one limit.",
                workers or "several",
            )

    # -- decorators ---------------------------------------------------------

    def limit(
        self,
        rate: str | Rate | None = None,
        *,
        resource: str | None = None,
        cost: int | Callable[[], int] = 1,
    ) -> Callable[[F], F]:
        """Add the endpoint tier to a view. The rate comes from the caller's plan
        for ``resource``, falling back to the literal ``rate``. ``cost`` (an int or a
        callable returning one) weighs the request in the endpoint tier.
        """
        parsed = parse_rate(rate) if rate is not None else None
        if resource is not None and not _RESOURCE_RE.fullmatch(resource):
            raise ValueError(f"resource {resource!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
        if parsed is None and resource is None:
            raise ValueError(
                "quota.limit() needs a rate such as '10/minute' or a resource whose rate the "
                "plans define, e.g. quota.limit(resource='ai_inference')"
            )
        if not callable(cost) and (isinstance(cost, bool) or not isinstance(cost, int) or cost < 0):
            raise ValueError(f"cost must be a non-negative int or a callable, got {cost!r}")
        spec = LimitSpec(parsed, resource, cost)

        def decorator(view: F) -> F:
            if hasattr(view, _LIMIT_ATTR):
                raise ValueError(f"{view.__name__} already has a @quota.limit; use one per view")
            setattr(view, _LIMIT_ATTR, spec)
            return view

        return decorator

    def exempt(self, view: F) -> F:
        """No tier applies to this view."""
        return exempt(view)

    def identity_loader(
        self, loader: Callable[[], Identity | None]
    ) -> Callable[[], Identity | None]:
        """Register ``loader() -> Identity | None``: who is calling (e.g. the logged-in user)."""
        self._identity_loader = loader
        return loader

    def api_key_loader(
        self, loader: Callable[[str], Identity | None]
    ) -> Callable[[str], Identity | None]:
        """Register ``loader(key) -> Identity | None`` mapping an API key to its client.

        ``None`` (unknown or revoked) makes the caller anonymous, or 401 with
        ``QUOTA_REJECT_UNKNOWN_KEYS``; an unknown key never gets a bucket of its own.
        """
        self._api_key_loader = loader
        return loader

    def current_decision(self) -> Decision | None:
        """The decision made for the current request, if any tier applied."""
        decision: Decision | None = g.get("_quota")
        return decision

    # -- request hooks ------------------------------------------------------

    def _before_request(self) -> None:
        # The proxies (request, current_app, g) cost ~1 us per access: unwrap them once.
        req: Request = request._get_current_object()  # type: ignore[attr-defined]
        app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        state = get_state(app)
        settings = state.settings
        if not settings.enabled:
            return
        endpoint = req.endpoint
        view = app.view_functions.get(endpoint) if endpoint else None
        if endpoint is not None and endpoint.rpartition(".")[2] == "static":
            return  # static files (the app's and blueprints') are not the API
        if getattr(view, _EXEMPT_ATTR, False):
            return
        spec: LimitSpec | None = getattr(view, _LIMIT_ATTR, None)

        identity = self._identify(settings, req)
        ip_tag = remote_ip_tag(req.remote_addr)
        catalog = state.catalog()
        if identity is None:
            tag = ip_tag
            plan = catalog.resolve(settings.anonymous_plan, None, fallback=settings.default_plan)
        else:
            tag = KeyBuilder.identity_tag(identity.id)
            plan_name = identity.plan or settings.default_plan
            plan = catalog.resolve(plan_name, identity.id, fallback=settings.default_plan)

        resource = (spec.resource or endpoint) if spec is not None else None
        cost = 1
        if spec is not None:
            cost = spec.cost() if callable(spec.cost) else spec.cost
            if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
                raise TypeError(f"cost callable of {endpoint!r} returned {cost!r}, not an int >= 0")
        checks = state.policy.checks(
            plan,
            ip_tag=ip_tag,
            identity_tag=tag,
            method=req.method,
            spec=spec,
            resource=resource,
            cost=cost,
        )
        if not checks:
            return
        verdict = state.guard.decide([c.check for c in checks])
        if verdict is None:  # storage down, failing open
            return
        decision = Decision.from_verdict(plan.name, checks, verdict)
        scope = g._get_current_object()
        scope._quota = decision
        scope._quota_who = tag
        denied = decision.denied
        if denied is not None:
            resource_name = denied.name if spec is not None and denied.name == resource else None
            upgrade = catalog.upgrade_hint(plan.name, denied.tier, resource_name)
            raise QuotaExceeded(decision, upgrade=upgrade)

    def _identify(self, settings: Settings, req: Request) -> Identity | None:
        if self._identity_loader is not None:
            identity = self._identity_loader()
            if identity is not None:
                if not isinstance(identity, Identity):
                    raise TypeError(
                        "the identity_loader must return flask_quota.Identity or None, "
                        f"not {type(identity).__name__}"
                    )
                return identity
        key = req.headers.get(settings.api_key_header)
        if key is None:
            return None
        if plausible_api_key(key) and self._api_key_loader is not None:
            try:
                identity = self._api_key_loader(key)
            except KeysUnavailable:
                return None  # cannot be checked yet: anonymous, never 401 (logged by the store)
            if identity is not None:
                return identity
        if settings.reject_unknown_keys:
            raise InvalidApiKey(settings.api_key_header)
        return None  # unknown keys are anonymous: inventing keys buys no fresh bucket

    def _after_request(self, response: Response) -> Response:
        scope = g._get_current_object()
        decision: Decision | None = scope.__dict__.pop("_quota", None)
        if decision is not None:
            state = get_state(current_app._get_current_object())  # type: ignore[attr-defined]
            apply_headers(response.headers, rate_limit_headers(decision, state.settings.headers))
            if state.usage is not None:
                state.usage.record(scope._quota_who, decision.plan, decision.usage_outcomes())
        return response


def _sql_api_key(key: str) -> Identity | None:
    """The default API-key loader: the live SQL client with this key (from the snapshot)."""
    sql = get_state().sql
    return sql.identify(key) if sql is not None else None
