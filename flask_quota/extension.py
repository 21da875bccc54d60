"""The Flask extension: thin wiring between requests and the decision objects."""

from __future__ import annotations

import functools
import logging
import os
import shlex
import sys
import weakref
from collections.abc import Callable
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from blinker import NamedSignal
from flask import Blueprint, Flask, Request, Response, current_app, has_request_context, request

from . import blocking, edge, signals
from .alerts import Alerts
from .cli import quota_cli
from .core import leases, validators, waiting
from .core.enforcer import Enforcer
from .core.facts import Facts, facts_of
from .core.identity import Identity
from .core.keys import KeyBuilder, remote_ip_tag
from .core.limited import Limited, limited_spec
from .core.observers import combined
from .core.policy import Decision, LimitSpec, Policy, TierResult
from .core.priority import Priority, parse_priority
from .core.rates import Rate, Rates, parse_rates
from .core.status import status_budget
from .credits import Credits
from .ledger import Ledger
from .otel import span_observer
from .overload import Shedder
from .recorder import UsageRecorder, usage_sink
from .settings import DEFAULTS, Settings, reference
from .sql import plansync
from .sql.credits import GrantInfo, client_caller
from .sql.errors import AdminError
from .sql.store import SqlStore
from .state import QuotaState, get_state
from .storage import Storage, storage_from_url
from .storage.breaker import CircuitBreaker
from .storage.denycache import DenyCache
from .storage.failover import GuardedStorage
from .storage.prefetch import Prefetch
from .tools import blocks, inspection
from .tools.blocks import Block
from .views import add_limit, exempt, set_priority

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

    from .metrics import QuotaMetrics

__all__ = ["Quota"]

log = logging.getLogger("flask_quota")

V = TypeVar("V", bound=Callable[..., Any] | Blueprint)


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
        # Who calls: shared with the request edge, so a loader registered after
        # init_app applies too.
        self._loaders = edge.Loaders()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Set up quota enforcement on ``app``: read its ``QUOTA_*`` configuration
        once, register the request hooks, the ``flask quota`` commands and, with
        ``QUOTA_DASHBOARD_URL``, the dashboard. Raises ``ValueError`` naming the key
        and the fix for invalid configuration, ``RuntimeError`` when called twice.

        Configuration keys read (default in brackets):

        {keys}
        """
        if "quota" in app.extensions:
            raise RuntimeError(
                "flask-quota is already initialised on this app; call init_app once per app."
            )
        deny_cache_set = "QUOTA_DENY_CACHE" in app.config
        for key, default in DEFAULTS.items():
            app.config.setdefault(key, default)
        settings = Settings.from_config(app.config)
        storage = self._storage
        if storage is not None and deny_cache_set and settings.deny_cache:
            raise ValueError(
                "QUOTA_DENY_CACHE applies to the storage built from QUOTA_STORAGE_URL, not to "
                "one passed as Quota(app, storage=...): wrap yours yourself "
                "(flask_quota.storage.denycache.DenyCache(storage)), or leave the key unset"
            )
        if storage is None:
            storage = storage_from_url(settings.storage_url, timeout=settings.storage_timeout)
        breaker = CircuitBreaker(
            storage.name,
            cooldown=settings.breaker_cooldown,
            threshold=settings.breaker_threshold,
        )
        metrics = _metrics(settings)
        breaker.on_change = _storage_signals(app, metrics)
        # Plans, API keys and overrides come from SQL: the host's `db`, or our own
        # engine for QUOTA_DATABASE_URL (a SQLite file in the instance folder by default).
        sql = SqlStore(settings, db=self._db, instance_path=app.instance_path)
        # When the tables are first ready: apply QUOTA_PLANS, or warn how SQL differs from it.
        sql.on_ready(functools.partial(plansync.at_start, sql))
        usage = None
        if settings.dashboard_url is not None:
            usage = UsageRecorder(usage_sink(storage, settings.key_prefix))
        if settings.prefetch is not None and storage.name == "memory":
            log.warning(
                "flask-quota: QUOTA_PREFETCH with memory storage saves no round trip (the "
                "counters are in this process already) and only under-admits; it is meant "
                "for Redis or Valkey"
            )
        if settings.prefetch is not None:
            # Shares of busy buckets spent in-process; a change in SQL drops them all, and
            # each expires within the sync interval anyway (storage/prefetch.py).
            storage = Prefetch(storage, fraction=settings.prefetch, horizon=settings.sync_interval)
            sql.on_change(storage.forget)
            if metrics is not None:
                storage.on_hit = metrics.prefetch_hit
        if self._storage is None and settings.deny_cache and storage.name != "memory":
            # A flood of denials stays off Redis; each is trusted for a sync interval.
            storage = DenyCache(storage, horizon=settings.sync_interval)
            # A reset, an unblock or a plan change anywhere bumps the SQL version:
            # then this worker's cached denials may be stale, so they go.
            sql.on_change(storage.forget)
            if metrics is not None:
                storage.on_hit = metrics.deny_cache_hit
        workers = _gunicorn_workers()
        # Fail mode local: each worker sheds against its share of QUOTA_CAPACITY.
        guard = GuardedStorage(storage, settings.fail_mode, breaker, workers=workers or 1)
        policy = Policy(
            KeyBuilder(settings.key_prefix),
            settings.algorithm,
            shadow=settings.shadow,
            calendar=settings.calendar,
            lease_seconds=settings.lease_seconds,
            capacity=settings.capacity,
            reserve=settings.reserve,
        )
        state: QuotaState  # made below; the callbacks here reach it when called
        escalate = None
        if settings.block_after is not None:
            escalate = functools.partial(
                blocking.escalate, storage, guard, settings, policy.keys,
                # A block sets off a caller.blocked event.
                on_block=lambda tag, seconds, reason: blocking.blocked_event(
                    state, tag, seconds, reason, "auto"
                ),
            )  # fmt: skip
        enforcer = Enforcer(
            guard=guard,
            policy=policy,
            catalog=sql.catalog,
            anonymous_plan=settings.anonymous_plan,
            default_plan=settings.default_plan,
            # The state is made just below; a block is read through it (its cache).
            refusal=lambda decision, gate, key: blocking.refusal(state, decision, gate, key),
            escalate=escalate,
            events=_Signals(app),
            observer=combined(metrics, span_observer()),
            near=settings.near_limit,
            alerts=settings.alerts,
        )
        # Prepaid balances: seeded from SQL, checkpointed to it by a writer per worker.
        credits = Credits(
            app, storage, sql, policy.keys, interval=settings.sync_interval,
            alerts=settings.alerts, outbox=lambda: state.outbox,
        )  # fmt: skip
        enforcer.credits = credits
        state = app.extensions["quota"] = QuotaState(
            settings=settings,
            storage=storage,
            guard=guard,
            policy=policy,
            sql=sql,
            enforcer=enforcer,
            usage=usage,
            metrics=metrics,
            credits=credits,
        )
        if settings.overload:
            state.shedder = Shedder(settings, enforcer, metrics=metrics)
        writes = settings.ledger or settings.webhook_url is not None
        if writes or settings.alerts:
            _writer(app, state)
        sql.autostart(app, needed=settings.dashboard_url is not None or writes)
        # Hooks bound to this app's state: a request looks up no ``current_app`` for it.
        # The teardown hook is added at the first lease (``edge.lease_teardown``), or now
        # when every request holds a slot in its worker (overload protection).
        start_leasing = edge.lease_teardown(app, state)
        if state.shedder is not None:
            start_leasing()
        app.before_request(edge.before_hook(state, self._loaders, start_leasing))
        app.after_request(edge.after_hook(state))
        if settings.dashboard_url is not None:
            from .dashboard import make_blueprint  # the dashboard is loaded only when mounted

            app.register_blueprint(make_blueprint(), url_prefix=settings.dashboard_url)
        if metrics is not None and settings.metrics_url is not None:
            app.add_url_rule(settings.metrics_url, "flask_quota_metrics", _metrics_view(metrics))
        if settings.status_url is not None:
            view = edge.status_view(state, self._loaders, status_budget(settings.status_rate))
            app.add_url_rule(settings.status_url, "flask_quota_status", view)
        if self._loaders.api_key is None:
            self._loaders.api_key = _sql_api_key  # a loader registered later replaces it
        app.cli.add_command(quota_cli)
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
        rate: str | Rate | Rates | Callable[[], str] | None = None,
        *,
        resource: str | None = None,
        cost: int | Callable[[], int] = 1,
        key: Callable[[], str | None] | None = None,
        per_method: bool = True,
        charge_when: Callable[[Response], bool] | None = None,
        exempt_when: Callable[[], bool] | None = None,
        concurrent: int | None = None,
        error_message: str | Callable[[], str] | None = None,
        unit: str | None = None,
        priority: str | None = None,
        delay: float | None = None,
    ) -> Callable[[V], V]:
        """Add the endpoint tier to a view, or to every view of a blueprint.

        The rates come from the caller's plan for ``resource``, falling back to
        the literal ``rate`` (one rate or several, ``"10/second, 10000/day"``), or to
        what a callable ``rate()`` returns for the request (parsed once per distinct
        answer; the bucket stays the same whatever the rate).
        ``cost`` (an int or a callable returning one) weighs the request.
        ``key()`` names the bucket's owner (e.g. an organisation) instead of the
        caller. ``per_method=False`` shares one bucket across methods (``HEAD``
        always counts as ``GET``). ``charge_when(response)`` returning False
        refunds the request after the response. ``exempt_when()`` returning True
        skips this limit for the request. ``concurrent=N`` lets at most ``N`` requests
        of the caller (or of the ``key()`` owner) run at once on the resource; alone, it
        is the whole limit. ``error_message`` (a str, or a callable returning one) is
        the 429's ``detail`` when this limit denies.

        ``unit`` names what the resource counts (``"tokens"``) in the 429's detail,
        the CLI and the dashboard; a plan's wins.

        ``priority`` (``"critical"``, ``"default"``, ``"sheddable"``) is the route's class
        for overload protection (``QUOTA_CAPACITY``, ``QUOTA_ADAPTIVE``,
        ``QUOTA_MAX_QUEUE_MS``); ``QUOTA_PRIORITY``'s answer wins over it.

        ``delay`` (seconds, at most ``core.waiting.MAX_DELAY``): a request this limit's
        rates would refuse, but that fits within ``delay``, is reserved and held until
        its time instead of getting a 429 (``X-RateLimit-Delayed`` says how long).

        Limits stack: several on one view are all checked, all-or-nothing, in one
        storage call, each with its own bucket and options.
        """
        if callable(rate):  # asked per request (see ``enforcer.rated``)
            rate_of, parsed = rate, None
        else:
            rate_of, parsed = None, parse_rates(rate) if rate is not None else None
        if resource is not None:
            validators.resource_name(resource)
        if concurrent is not None:
            leases.slots(concurrent)
        if parsed is None and rate_of is None and resource is None and concurrent is None:
            raise ValueError(
                "quota.limit() needs a rate such as '10/minute' or a resource whose rate the "
                "plans define, e.g. quota.limit(resource='ai_inference')"
            )
        if not callable(cost) and not validators.is_count(cost):
            raise ValueError(f"cost must be a non-negative int or a callable, got {cost!r}")
        hooks = {"key": key, "charge_when": charge_when, "exempt_when": exempt_when}
        for name, hook in hooks.items():
            if hook is not None and not callable(hook):
                raise ValueError(f"{name} must be a callable, got {hook!r}")
        if error_message is not None and not (
            isinstance(error_message, str) or callable(error_message)
        ):
            raise ValueError(f"error_message must be a str or a callable, got {error_message!r}")
        if unit is not None:
            validators.unit_name(unit)
        cls = parse_priority(priority) if priority is not None else None
        waits = waiting.delay_us(delay) if delay is not None else 0
        if waits and parsed is None and rate_of is None and resource is None:
            raise ValueError(
                "quota.limit(delay=...) waits for a rate's room; concurrent= alone has no rate"
            )
        spec = LimitSpec(
            parsed, resource, cost, key, bool(per_method), charge_when, exempt_when,
            concurrent=concurrent, rate_of=rate_of, error_message=error_message, unit=unit,
            priority=cls, wait_us=waits,
        )  # fmt: skip

        def decorator(view: V) -> V:
            add_limit(view, spec)
            return view

        return decorator

    def limited(
        self,
        rate: str | Rate | Rates | Callable[[], str],
        *,
        resource: str | None = None,
        key: str | None = None,
        cost: int = 1,
        wait: float | None = None,
    ) -> Limited:
        """A limit for code that is not a view: ``with quota.limited("5/minute",
        resource="send_sms", key=phone): send()``, or as a decorator on a function.
        ``rate`` may be a callable, asked on every entry as ``@quota.limit``'s is (then
        ``resource`` names the bucket).

        Entering charges ``cost`` on that one bucket (no other tier) or raises
        ``QuotaExceeded``. The bucket is ``key``'s, else the current request's caller;
        outside a request ``key`` is required. The caller's plan may set the
        resource's rate, as for ``@quota.limit``; outside a request the default plan's.

        ``wait`` (seconds): when the bucket has no room, wait up to that long for it
        instead of raising at once. The room is reserved in the storage (one call; the
        waiters of a bucket across the fleet go in the order they asked) and entering
        sleeps until its time; a wait that would be longer raises ``QuotaExceeded`` at
        once. An interrupted wait gives its reservation back.
        """
        spec = limited_spec(rate, resource, key, cost, wait)
        return Limited(spec, self._limited_context, edge.note_inner_denial, edge.note_wait)

    def _limited_context(self) -> tuple[Enforcer, Facts | None] | None:
        """What a ``quota.limited`` decides with on entry: the enforcer and the request's
        caller (None outside a request); None when quota is switched off."""
        state = get_state()
        if not state.settings.enabled:
            return None
        if not has_request_context():
            return state.enforcer, None
        req: Request = request._get_current_object()  # type: ignore[attr-defined]
        identity = edge.identify(self._loaders, state.settings, req)
        return state.enforcer, facts_of(
            req.method, req.endpoint, remote_ip_tag(req.remote_addr), identity
        )

    def exempt(self, view: V) -> V:
        """No tier applies to this view, or to any view of this blueprint."""
        return exempt(view)

    def priority(self, priority: str) -> Callable[[V], V]:
        """``@quota.priority("sheddable")``: a view's class for overload protection
        without a limit of its own (on a view, a class-based view or one of its methods,
        or a blueprint: all its views); it wins over its limits' ``priority=``, a
        blueprint's over nothing but the default. ``QUOTA_PRIORITY``'s answer wins over
        both. ``ValueError`` for anything but ``critical``, ``default`` or ``sheddable``."""
        cls = parse_priority(priority)

        def decorator(view: V) -> V:
            return set_priority(view, cls)

        return decorator

    def request_filter(self, check: Callable[[], bool]) -> Callable[[], bool]:
        """Register ``check() -> bool``; True: no tier applies to the request, no headers."""
        self._loaders.filters.append(check)
        return check

    def settle(self, actual: int) -> None:
        """Make this request's endpoint-tier charge exactly ``actual`` units, after the
        response: the difference from the admitted cost is refunded, or charged (into
        debt if need be). ``quota.charge(n)`` adds on top of it, called before or after;
        with stacked limits it applies to each of them. Call it in a view with
        ``@quota.limit``; the last call wins.
        """
        if not validators.is_count(actual):
            raise ValueError(f"quota.settle() takes an int >= 0, got {actual!r}")
        _limited_view("quota.settle()")
        edge.current().actual = actual

    def charge(self, units: int) -> None:
        """Charge ``units`` more on this request's endpoint tier, after the response.

        For work known only at the end (tokens an AI model generated). The charge
        is made whether or not it fits: the bucket may go into debt, and the next
        request waits until it is paid off. Call it in a view with ``@quota.limit``.
        """
        if not validators.is_count(units):
            raise ValueError(f"quota.charge() takes an int >= 0, got {units!r}")
        _limited_view("quota.charge()")
        edge.current().extra += units

    def grant(
        self,
        client: str | None = None,
        resource: str = "",
        units: int = 0,
        expires: datetime | date | str | None = None,
        note: str = "",
        *,
        identity: str | None = None,
        actor: str = "api",
    ) -> GrantInfo:
        """Grant prepaid credits: ``units`` of ``resource`` (a plan's ``"credits"``
        resource) to ``client`` (an SQL client's name or id) or ``identity`` (an id your
        identity loader returns), spendable until ``expires`` (a timezone-aware datetime,
        a date or ``"2027-01-01"``: midnight in ``QUOTA_TIMEZONE``; None: never). Written
        to SQL and the audit log (``actor``), then added to the live balance: spendable at
        once on this server, on every other within ``QUOTA_SYNC_INTERVAL``. Bad input
        raises ``AdminError`` and changes nothing. Needs an app context."""
        state = get_state()
        if (client is None) == (identity is None):
            raise AdminError("quota.grant() takes client= (an SQL client) or identity=")
        assert state.credits is not None  # made by init_app
        caller = identity if identity is not None else client_caller(state.sql, str(client))
        info, _ = state.credits.grant(
            caller, resource, units, expires, note, actor=actor, zone=state.settings.calendar.zone
        )
        return info

    def identity_loader(
        self, loader: Callable[[], Identity | None]
    ) -> Callable[[], Identity | None]:
        """Register ``loader() -> Identity | None``: who is calling (e.g. the logged-in user)."""
        self._loaders.identity = loader
        return loader

    def api_key_loader(
        self, loader: Callable[[str], Identity | None]
    ) -> Callable[[str], Identity | None]:
        """Register ``loader(key) -> Identity | None`` mapping an API key to its client.

        ``None`` (unknown or revoked) makes the caller anonymous, or 401 with
        ``QUOTA_REJECT_UNKNOWN_KEYS``; an unknown key never gets a bucket of its own.
        """
        self._loaders.api_key = loader
        return loader

    # -- inspection -----------------------------------------------------------

    def peek(
        self, identity: str | None = None, ip: str | None = None, *, tenant: str | None = None
    ) -> list[inspection.BucketState]:
        """The current state of every bucket of a caller, charging nothing.

        ``identity`` is an identity or client id; ``ip`` a client address (its
        global tier; alone, the anonymous caller from that address); ``tenant``
        adds the identity's tenant bucket (alone: just the tenant's bucket). Needs
        an app context. Raises ``StorageError`` when the storage cannot answer.
        """
        state = get_state()
        return inspection.peek(state, self._buckets(state, identity, ip, tenant))

    def reset(
        self, identity: str | None = None, ip: str | None = None, *, tenant: str | None = None
    ) -> int:
        """Empty every bucket of a caller so its limits start afresh; returns how many.

        Takes the same arguments as ``peek``: ``reset(tenant="acme")`` empties the
        tenant's own bucket, shared by all its callers. Needs an app context.
        """
        state = get_state()
        return inspection.reset(state, self._buckets(state, identity, ip, tenant))

    @staticmethod
    def _buckets(
        state: QuotaState, identity: str | None, ip: str | None, tenant: str | None
    ) -> list[inspection.TierCheck]:
        if tenant is not None and identity is None and ip is None:
            return inspection.tenant_checks(state, tenant)
        caller = inspection.Caller.of(identity, ip, tenant)
        plan = inspection.plan_of(state, caller)
        return inspection.caller_checks(current_app, state, caller, plan)

    def block(
        self,
        identity: str | None = None,
        ip: str | None = None,
        seconds: int = 600,
        reason: str = "",
        *,
        public: bool = False,
    ) -> list[str]:
        """Refuse a caller with 429 ``"tier": "blocked"`` for ``seconds``; returns the
        blocked key tags.

        ``identity`` blocks that identity; ``ip`` the anonymous caller from that
        address. The caller's 429 says an operator blocked it, and gives ``reason`` only
        when ``public``. Audited (actor ``api``) before the storage changes. Needs an app
        context.

        ``ip`` may be a network (``"203.0.113.0/24"``, ``"2001:db8::/48"``): it is denied
        for ``seconds`` as a timed network rule (403 ``"tier": "network"``, audited as
        ``network.deny``, in every worker within the sync interval), and its CIDR is
        among the returned tags. A /32 or /128 is the plain address.
        """
        state = get_state()
        address, network = blocks.split_ip(ip)
        denied: list[str] = []
        if network is not None:  # first: its arguments are checked before anything changes
            denied = [blocks.block_network(state, network, seconds, reason, "api", public=public)]
        if network is None or identity is not None:
            caller = inspection.Caller.of(identity, address)
            return blocks.block(state, caller, seconds, reason, "api", public=public) + denied
        return denied

    def unblock(self, identity: str | None = None, ip: str | None = None) -> list[str]:
        """Lift ``block``'s blocks (in every worker within the sync interval); returns
        the tags that were blocked. Audited before the storage changes. A network ``ip``
        (``"203.0.113.0/24"``) lifts that network's denial, and returns its CIDR if it
        was denied."""
        state = get_state()
        address, network = blocks.split_ip(ip)
        lifted: list[str] = []
        if network is None or identity is not None:
            lifted = blocks.unblock(state, inspection.Caller.of(identity, address), "api")
        if network is not None:
            lifted += blocks.unblock_network(state, network, "api")
        return lifted

    def blocks(self) -> list[Block]:
        """Every live block, automatic or by hand. Needs an app context."""
        return blocks.list_blocks(get_state())

    def current_decision(self) -> Decision | None:
        """The decision made for the current request, if any tier applied."""
        return edge.current_decision()


def _limited_view(what: str) -> None:
    """Refuse ``what`` (``quota.charge()``, ``quota.settle()``) outside a limited view."""
    endpoint = request.endpoint
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    if endpoint is None or not get_state(app).view_limit(app, endpoint, request.method)[1]:
        raise RuntimeError(
            f"{what} in {endpoint!r}, which has no @quota.limit: there is no "
            "endpoint tier to charge; decorate the view with @quota.limit(...)"
        )


class _Signals:
    """The enforcer's ``Events``: ``quota_exceeded`` / ``quota_shadow_exceeded`` for ``app``."""

    def __init__(self, app: Flask) -> None:
        self.app = weakref.ref(app)  # the enforcer lives in app.extensions: no cycle

    def exceeded(self, decision: Decision) -> None:
        self._send(signals.quota_exceeded, decision)

    def shadow_exceeded(self, decision: Decision) -> None:
        self._send(signals.quota_shadow_exceeded, decision)

    def near_limit(self, decision: Decision, result: TierResult) -> None:
        self._send(signals.quota_near_limit, decision, check=result)

    def shed(self, priority: Priority, reason: str, *, shadow: bool) -> None:
        app = self.app()
        if app is not None and signals.quota_shed.receivers:
            signals.notify(
                signals.quota_shed, app, priority=priority.value, reason=reason, shadow=shadow
            )

    def _send(self, signal: NamedSignal, decision: Decision, **extra: Any) -> None:
        app = self.app()
        if app is not None and signal.receivers:
            signals.notify(signal, app, decision=decision, **extra)


def _writer(app: Flask, state: QuotaState) -> None:
    """The background writer (one thread per worker, started at its first use): the
    ledger (``QUOTA_LEDGER``), the alerts' claims (``QUOTA_ALERTS``), the outbox of
    events; with ``QUOTA_WEBHOOK_URL`` also the outbox's sender."""
    settings, sql = state.settings, state.sql
    alerts = None
    if settings.alerts or settings.webhook_url is not None:  # the latter: quota.exceeded
        alerts = Alerts(
            app, state.storage, settings.alerts, metrics=state.metrics,
            client_of=lambda identity: identity if sql.catalog().client_plan(identity) else None,
        )  # fmt: skip
    writer = Ledger(
        lambda: sql.engine,
        settings.calendar.zone,
        usage=settings.ledger,
        ready=sql.ensure_ready,
        before=alerts.process if alerts is not None else lambda: None,
        interval=settings.sync_interval,
    )
    if settings.ledger:
        state.ledger = writer
    if alerts is not None:
        alerts.wake = writer.poke
        state.alerts = alerts
    if settings.webhook_url is not None:
        state.outbox = writer
        if alerts is not None:
            alerts.outbox = writer
    if settings.webhook_url is not None and settings.webhook_secret is not None:
        from .webhooks import WebhookSender

        sender = WebhookSender(lambda: sql.engine, settings.webhook_url, settings.webhook_secret)
        sender.start()
        # gunicorn forks its workers after init_app: each starts its own sender thread.
        os.register_at_fork(after_in_child=sender.start)


def _metrics(settings: Settings) -> QuotaMetrics | None:
    """The app's metrics with ``QUOTA_METRICS_URL``; only then is prometheus_client imported."""
    if settings.metrics_url is None:
        return None
    try:
        from .metrics import QuotaMetrics
    except ImportError as exc:
        if not (exc.name or "").startswith("prometheus_client"):
            raise
        raise ValueError(
            f"QUOTA_METRICS_URL={settings.metrics_url!r} needs prometheus_client, which is not "
            "installed: pip install 'flask-quota[metrics]'"
        ) from None
    return QuotaMetrics()


def _metrics_view(metrics: QuotaMetrics) -> Callable[[], Response]:
    """The ``QUOTA_METRICS_URL`` view, exempt from every tier: scrapes are never limited."""

    @exempt
    def flask_quota_metrics() -> Response:
        return metrics.view()

    return flask_quota_metrics


def _storage_signals(
    app: Flask, metrics: QuotaMetrics | None = None
) -> Callable[[BaseException | None], None]:
    """The breaker's ``on_change``: ``storage_failed`` / ``storage_recovered`` for ``app``,
    and the breaker gauge with metrics."""
    ref = weakref.ref(app)  # the breaker lives in app.extensions: no cycle through it

    def on_change(error: BaseException | None) -> None:
        if metrics is not None:
            metrics.breaker_changed(error)
        sender = ref()
        if sender is None:
            return
        if error is None:
            signals.notify(signals.storage_recovered, sender)
        else:
            signals.notify(signals.storage_failed, sender, error=error)

    return on_change


Quota.init_app.__doc__ = (Quota.init_app.__doc__ or "").replace(
    "{keys}",
    "\n        ".join(f"- ``{key}`` [{default}]: {doc}" for key, default, doc in reference()),
)


def _sql_api_key(key: str) -> Identity | None:
    """The default API-key loader: the live SQL client with this key (from the snapshot)."""
    return get_state().sql.identify(key)
