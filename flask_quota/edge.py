"""The request edge: what flask-quota does for one request, from its hook to its headers.

- **before**: who calls (``identify``), the operators' network rules (``networks.check``:
  a denied network's 403, an allowed one's pass on the global tier), the request's facts
  (``core.facts.facts_of``: the view's limits, their callables asked),
  ``Enforcer.decide``; what is decided
  is kept in one ``RequestQuota`` on ``g`` (``g._flask_quota``), the one attribute
  flask-quota sets there.
- **after**: the response's rate-limit headers (``Route.headers``, settled when the
  view charged, settled or has a ``charge_when``), usage counts, and for a streamed
  response its settlement and leases' give-back when it is closed.
- **teardown**: the leases of a request whose response was not streamed, or never
  sent.

``Quota`` (``extension.py``) keeps the decorators and wires these hooks in
``init_app``; everything a request does between them is here.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Request, Response, current_app, g, has_request_context, jsonify, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.datastructures import Headers

from .alerts import ALERT, EXCEEDED, Crossing
from .core.clock import US
from .core.enforcer import Decided, counted_by, kept_units
from .core.errors import InvalidApiKey, QuotaExceeded, RequestShed
from .core.facts import Facts, facts_of
from .core.headers import DELAYED as DELAYED_HEADER
from .core.headers import ENVIRON_KEY, OURS, HeaderMode, Renamer, apply_headers
from .core.identity import Identity, plausible_api_key
from .core.keys import KeyBuilder, remote_ip_tag
from .core.policy import Decision, LimitSpec
from .core.priority import Priority
from .core.status import caller_status
from .core.tiers import Tier
from .core.waiting import sleep_reserved
from .ledger import period_usage
from .networks import check as check_network
from .overload import Ticket
from .settings import Settings
from .sql.errors import KeysUnavailable
from .state import QuotaState, get_state
from .views import exempt, limited_endpoints

__all__ = [
    "G_ATTR",
    "Loaders",
    "RequestQuota",
    "after_hook",
    "before_hook",
    "current",
    "identify",
    "lease_teardown",
    "status_view",
]

log = logging.getLogger("flask_quota")

G_ATTR = "_flask_quota"  # the one attribute of ``g`` flask-quota sets: a RequestQuota
_NO_HEADERS = HeaderMode.NONE  # a module constant: see ``core.route``'s
_UNLOADED = object()  # ``identify``: the identity loader has not been asked yet


class RequestQuota:
    """What flask-quota keeps about one request, on ``g``. Made only when there is
    something to keep, its fields' defaults on the class: a request sets only what it
    has (one attribute, the usual admitted request's decision)."""

    decided: Decided | None = None  # the request's decision, when a tier applied
    denial: QuotaExceeded | None = None  # raised before the view (its Retry-After)
    extra: int = 0  # quota.charge's units, charged after the response
    actual: int | None = None  # quota.settle's actual cost
    inner: bool = False  # a quota.limited inside the view denied: the 429 is that limit's
    leased: bool = False  # the decision holds leases, given back at teardown
    ticket: Ticket | None = None  # its place in the worker (overload protection)
    release: Release | None = None  # a streamed response's give-back, at its close
    caller: Identity | None = None  # whom the ledger and the alerts count it for
    delayed_us: int = 0  # how long a ``delay=`` held it before its view (its header)


def current() -> RequestQuota:
    """The current request's ``RequestQuota``, made when it has none yet."""
    scope = g._get_current_object().__dict__
    found: RequestQuota | None = scope.get(G_ATTR)
    if found is None:
        found = scope[G_ATTR] = RequestQuota()
    return found


def current_decision() -> Decision | None:
    """The decision made for the current request, if any tier applied."""
    found: RequestQuota | None = g.get(G_ATTR)
    decided = found.decided if found is not None else None
    return None if decided is None else decided.decision()


def note_inner_denial() -> None:
    """A ``quota.limited`` denied inside a request: noted for the after-request hook."""
    if has_request_context():
        current().inner = True


def note_wait(resource: str, seconds: float) -> None:
    """A ``quota.limited(wait=...)`` slept ``seconds`` for its reservation: counted."""
    metrics = get_state().metrics
    if metrics is not None:
        metrics.waited(resource, "wait", seconds)


def _delay(state: QuotaState, decided: Decided, found: RequestQuota) -> None:
    """Hold an admitted request until its reservation's time (``delay=``); interrupted,
    give the reservation back (``core.waiting``)."""
    wait = decided.reply.wait_us()
    if not wait:
        return
    found.delayed_us = wait
    at = decided.reply.now_us + wait
    waiting = [t for t in decided.route.tier_checks(decided.keys) if t.check.wait_us]
    sleep_reserved(wait, lambda: state.enforcer.guard.refund([t.check for t in waiting], at))
    if state.metrics is not None:
        state.metrics.waited(waiting[0].resource or "", "delay", wait / US)


@dataclass
class Loaders:
    """Who calls: the app's loaders and filters as registered on ``Quota``, shared with
    the hooks (a loader registered after ``init_app`` applies too)."""

    identity: Callable[[], Identity | None] | None = None
    api_key: Callable[[str], Identity | None] | None = None
    filters: list[Callable[[], bool]] = field(default_factory=list)


def identify(
    loaders: Loaders, settings: Settings, req: Request, loaded: object = _UNLOADED
) -> Identity | None:
    """The caller: the identity loader's answer (``loaded``, when the caller asked it
    already), else the API key's client, else None (anonymous)."""
    if loaders.identity is not None:
        identity = loaders.identity() if loaded is _UNLOADED else loaded
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
    if plausible_api_key(key) and loaders.api_key is not None:
        try:
            identity = loaders.api_key(key)
        except KeysUnavailable:
            return None  # cannot be checked yet: anonymous, never 401 (logged by the store)
        if identity is not None:
            return identity
    if settings.reject_unknown_keys:
        raise InvalidApiKey(settings.api_key_header)
    return None  # unknown keys are anonymous: inventing keys buys no fresh bucket


def before_hook(
    state: QuotaState, loaders: Loaders, start_leasing: Callable[[], None]
) -> Callable[[], None]:
    """The before-request hook of the app whose quota ``state`` is: a plain function,
    the cheapest for the coroutine check Flask makes of every hook on every request.
    ``start_leasing()`` adds the teardown hook when a request first holds a lease."""

    def before_request() -> None:
        # The proxies (request, current_app, g) cost ~1 us per access: unwrap them once.
        req: Request = request._get_current_object()  # type: ignore[attr-defined]
        settings = state.settings
        environ = req.environ
        if settings.renamer is not None:  # for the headers of the errors we raise
            environ[ENVIRON_KEY] = settings.renamer
        method = req.method
        if not settings.enabled or method in settings.exempt_methods:
            return
        for check in loaders.filters:
            if check():
                return
        endpoint = req.endpoint
        specs: tuple[LimitSpec, ...] = ()
        if endpoint is not None:
            resolved = state.views.get(endpoint)
            if isinstance(resolved, tuple):  # one answer for every method (the usual)
                exempted, specs = resolved
            else:  # not resolved yet, or per method (a class-based view's)
                app = current_app._get_current_object()  # type: ignore[attr-defined]
                exempted, specs = state.view_limit(app, endpoint, method)
            if exempted:
                return
        loader = loaders.identity
        identity = loader() if loader is not None else None
        if type(identity) is not Identity:  # else what identify would return (the usual case)
            identity = identify(loaders, settings, req, identity)
        if "HTTP_X_FORWARDED_FOR" in environ and not state.proxy_warned:
            _warn_no_proxy_fix(state, req)
        shedder = state.shedder
        ip_tag = remote_ip_tag(req.remote_addr)
        # Operators' network rules (``networks``): a denied network's 403 here, before any
        # storage call; an allowed one's route has no global tier. No rules: one check.
        allowed = state.sql.networks is not None and check_network(state, req.remote_addr)
        try:
            if shedder is None:  # overload protection off (the usual case)
                facts = facts_of(method, endpoint, ip_tag, identity, specs)
            else:
                priority = shedder.classify(_route_priority(state, endpoint, method, specs))
                # Shed here (503), or a ticket: its slot in the worker, given back at the end.
                current().ticket = shedder.admit(priority, environ.get("HTTP_X_REQUEST_START"))
                facts = facts_of(method, endpoint, ip_tag, identity, specs, priority)
            if allowed:
                facts.allowed = True
            decided = state.enforcer.decide(facts, _keep)
        except QuotaExceeded as exc:
            # Noted so the after-request hook can give its Retry-After to a response
            # the app's own error handler made.
            found = current()
            found.denial = exc
            if identity is not None:
                if state.ledger is not None:
                    _record_denied(state, identity, found.decided)
                if state.alerts is not None and found.decided is not None:
                    _note_exceeded(state, identity, found.decided)
            raise
        except RequestShed as shed:
            if state.usage is not None:  # the dashboard's sheds per minute
                tag = KeyBuilder.identity_tag(identity.id) if identity is not None else ip_tag
                state.usage.record(tag, "-", [(f"shed ({shed.tier})", False)])
            raise
        if decided is not None:
            scope = g._get_current_object().__dict__
            found = scope.get(G_ATTR)
            if found is None:
                found = scope[G_ATTR] = RequestQuota()
            found.decided = decided
            if identity is not None and (state.ledger is not None or decided.route.alert_lines):
                found.caller = identity  # counted with what it kept, after the response
            if decided.route.held and decided.reply.all_allowed:
                if not state.leasing:  # the first lease: the teardown hook joins
                    start_leasing()
                found.leased = True  # given back after the response (see below)
            spec = decided.spec
            if (
                spec is not None
                and (spec.wait_us or (decided.more and any(m.wait_us for m in decided.more)))
                and decided.reply.all_allowed
            ):
                _delay(state, decided, found)

    return before_request


def _route_priority(
    state: QuotaState, endpoint: str | None, method: str, specs: tuple[LimitSpec, ...]
) -> Priority | None:
    """The class the request's route gives it (``views.priority_of``), or None."""
    if endpoint is None:
        return None
    found = state.priorities.get((endpoint, method), _UNLOADED)
    if found is _UNLOADED:
        app = current_app._get_current_object()  # type: ignore[attr-defined]
        return state.priority(app, endpoint, method, specs)
    return found  # type: ignore[return-value]


def _keep(decided: Decided) -> None:
    """Keep a request's decision before a denial is raised: its 429 gets the headers."""
    current().decided = decided


def after_hook(state: QuotaState) -> Callable[[Response], Response]:
    """The after-request hook of the app whose quota ``state`` is: headers, settlement
    and the leases of the response."""

    def after_request(response: Response) -> Response:
        found: RequestQuota | None = g._get_current_object().__dict__.get(G_ATTR)
        if found is None:
            return response
        settings = state.settings
        renamer = settings.renamer
        if found.denial is not None:
            _denied(renamer, response, found.denial)
        decided = found.decided
        if decided is None:
            return response
        mode, headers = settings.headers, response.headers
        route, reply, spec = decided.route, decided.reply, decided.spec
        if found.delayed_us:  # held by a reservation (delay=): for how long, in seconds
            add_headers(headers, [(DELAYED_HEADER, f"{found.delayed_us / US:.3f}")], renamer)
        if route.leases and mode is not _NO_HEADERS:
            add_headers(headers, route.lease_headers(reply), renamer)
        if route.credits:  # prepaid balances, as admitted
            if mode is not _NO_HEADERS:
                add_headers(headers, route.credit_headers(reply), renamer)
            if state.metrics is not None and reply.all_allowed:
                _count_spent(state, decided)
        decision = None
        after: dict[str, Any] | None = None  # the settlement asked for, if any
        settles_later = False
        if found.inner:
            # A quota.limited inside the view denied: the 429 is that limit's, and the
            # view's own headers would contradict its body. Its own limits charged.
            if found.caller is not None:
                _record_kept(state, found, decided, None)
                _note_alerts(state, found.caller, decided, None, None)
        elif spec is not None and reply.all_allowed and response.is_streamed:
            # The stream may still call quota.settle or quota.charge while it runs: they
            # are settled when it ends. Its headers left before, so they show admission.
            add_headers(headers, route.headers(reply, mode), renamer)
            response.call_on_close(_Settle(state, decided, found, response))
            settles_later = True
        # What the view asked for after the response: quota.charge's units, quota.settle's.
        # Asked only when there may be something (the usual request has nothing).
        elif (
            found.extra
            or found.actual is not None
            or (spec is not None and (spec.charge_when is not None or decided.more))
        ) and (after := _settlement(found, decided, response)) is not None:
            decision = state.enforcer.settle(decided, **after)
            add_headers(headers, route.settled_headers(decision, mode), renamer)
            if found.caller is not None:
                _record_kept(state, found, decided, after)
                _note_alerts(state, found.caller, decided, decision, after)
        else:
            add_headers(headers, route.headers(reply, mode), renamer)
            if found.caller is not None:
                _record_kept(state, found, decided, None)
                _note_alerts(state, found.caller, decided, None, None)
        if decided.near is not None and not settles_later:
            state.enforcer.done(decided)  # charged as admitted: its crossings are told now
        if state.usage is not None:
            decision = decision or decided.decision()
            # A resource's tier counts its units (tokens) on the charts: as kept when
            # admitted (a settlement's included), as asked when refused.
            units = None
            if decided.route.metered:
                kept = _kept_units(decided, after) if reply.all_allowed else None
                units = decision.usage_units(kept or decided.route.metered)
            state.usage.record(decided.tag, decision.plan, decision.usage_outcomes(), units)
        if (found.leased or found.ticket is not None) and response.is_streamed:
            # Last, so that a failure above leaves the lease to the teardown: a streamed
            # response holds its leases (and its slot in the worker) until it is closed.
            found.release = Release(state, found)
            response.call_on_close(found.release)
        return response

    return after_request


def add_headers(headers: Headers, pairs: list[tuple[str, str]], renamer: Renamer | None) -> None:
    """``apply_headers``, with a fast path for a response's own Werkzeug ``Headers`` that
    holds none of ours (the usual case): appended in one step to its pair list.

    The one place Werkzeug's private ``Headers._list`` is used: the public ``extend``
    checks every value again for a line break (ours are printable ASCII), a tenth of a
    request's added time here. ``tests/test_internals.py`` fails when Werkzeug changes
    it."""
    if not pairs:  # QUOTA_HEADERS=none, or a route without rates: nothing to look for
        return
    if renamer is None and type(headers) is Headers:
        listed: list[tuple[str, str]] = headers._list
        for name, _ in listed:
            if name.lower() in OURS:
                break
        else:
            listed.extend(pairs)
            return
    apply_headers(headers, pairs, renamer)


def _denied(renamer: Renamer | None, response: Response, denial: QuotaExceeded) -> None:
    """A denied request's response: its ``Retry-After``, under our header names."""
    # A 402 (prepaid credits spent) has no wait: its retry_after is 0.
    if denial.retry_after and Renamer.retry_after(renamer) not in response.headers:
        # The app's own @app.errorhandler(QuotaExceeded) answered: the wait still
        # holds (a block's rest, not the tier's, when this request was blocked).
        response.headers[Renamer.retry_after(renamer)] = str(denial.retry_after)
    if renamer is not None:  # e.g. the handler returned error.get_response()
        renamer.rename(response.headers)


def _judged(decided: Decided) -> bool:
    """True when a limit of the request has a ``charge_when`` to ask."""
    spec = decided.spec
    if spec is not None and spec.charge_when is not None:
        return True
    return any(limit.charge_when is not None for limit in decided.more)


def _settlement(found: RequestQuota, decided: Decided, response: Response) -> dict[str, Any] | None:
    """``Enforcer.settle``'s arguments for an admitted request whose view charged, settled
    or has a ``charge_when`` to ask; None when nothing changes its charge."""
    spec = decided.spec
    if spec is None or not decided.reply.all_allowed:
        return None
    extra, actual = found.extra, found.actual
    if not (extra or actual is not None or _judged(decided)):
        return None

    def counted(limit: LimitSpec) -> bool:
        return limit.charge_when is None or bool(limit.charge_when(response))

    return {"counted": counted, "extra": extra, "actual": actual}


class _Settle:
    """A streamed response's settlement when it is closed: what its stream charged or
    settled while it ran (``quota.charge``, ``quota.settle``) and its ``charge_when``."""

    __slots__ = ("decided", "found", "response", "state")

    def __init__(
        self, state: QuotaState, decided: Decided, found: RequestQuota, response: Response
    ) -> None:
        self.state, self.decided, self.found, self.response = state, decided, found, response

    def __call__(self) -> None:
        after = _settlement(self.found, self.decided, self.response)
        caller = self.found.caller
        if caller is not None:  # the ledger records what the stream kept
            _record_kept(self.state, self.found, self.decided, after)
        if after is None:
            self.state.enforcer.done(self.decided)
            if caller is not None:
                _note_alerts(self.state, caller, self.decided, None, None)
            return
        try:
            settled = self.state.enforcer.settle(self.decided, **after)
        except Exception:  # the response is gone: nothing to answer, so it is logged
            log.exception("flask-quota: settling a streamed response failed")
            return
        if caller is not None:
            _note_alerts(self.state, caller, self.decided, settled, after)


def _count_spent(state: QuotaState, decided: Decided) -> None:
    """``flask_quota_credits_spent_total``: the units an admitted request's prepaid
    balances were charged at admission (a settlement's correction is not counted)."""
    assert state.metrics is not None
    route, reply = decided.route, decided.reply
    for i in route.credits:  # check i is tier i - 1 (the block gate is check 0)
        cost = route.calls[i].cost
        if cost > 0 and reply.allowed(i):
            tier = route.tiers[i - 1]
            state.metrics.credits_spent_units(tier.resource or tier.name, route.plan.name, cost)


def _record_kept(
    state: QuotaState, found: RequestQuota, decided: Decided, after: dict[str, Any] | None
) -> None:
    """The ledger's count of an admitted request: each resource's units as finally
    charged (``kept_units``, the rule ``Enforcer.settle`` charges by)."""
    ledger, identity = state.ledger, found.caller
    if ledger is None or identity is None or not decided.reply.all_allowed:
        return
    metered = _kept_units(decided, after)
    ledger.record(decided.reply.now_us, identity.id, identity.tenant, metered, admitted=True)


def _kept_units(decided: Decided, after: dict[str, Any] | None) -> tuple[tuple[str, int], ...]:
    """(resource, units) an admitted request was finally charged on each resource: as
    admitted, or as its settlement says (``kept_units``, the rule ``Enforcer.settle``
    charges by)."""
    metered = decided.route.metered
    if after is not None and metered:
        counted, extra, actual = after["counted"], after["extra"], after["actual"]
        metered = tuple(
            (resource, kept_units(cost, kept=counted_by(counted, decided, resource), actual=actual,
                                  extra=extra))
            for resource, cost in metered
        )  # fmt: skip
    return metered


def _note_alerts(
    state: QuotaState,
    identity: Identity,
    decided: Decided,
    settled: Decision | None,
    after: dict[str, Any] | None,
) -> None:
    """Note each ``QUOTA_ALERTS`` share of a calendar quota this admitted request took
    its bucket across: what it left against what it finally cost (``core.near``'s rule);
    ``settled``: the decision after ``Enforcer.settle``, when it settled."""
    alerts, route, reply = state.alerts, decided.route, decided.reply
    if alerts is None or not route.alert_lines or not reply.all_allowed:
        return
    for i, line, cost, share in route.alert_lines:
        tier = route.tiers[i - 1]
        if settled is not None:
            left = settled.results[i - 1].outcome.remaining
            if after is not None and tier.tier is Tier.ENDPOINT and tier.resource is not None:
                kept = counted_by(after["counted"], decided, tier.resource)
                cost = kept_units(cost, kept=kept, actual=after["actual"], extra=after["extra"])
        else:
            left = reply.outcome(i, 0).remaining
        if left <= line < left + cost:
            alerts.note(_crossing(ALERT, decided, i, identity, share))


def _note_exceeded(state: QuotaState, identity: Identity, decided: Decided) -> None:
    """Note a denial by a calendar quota: the first in its period is told (``EXCEEDED``)."""
    alerts, route, reply = state.alerts, decided.route, decided.reply
    if alerts is None:
        return
    for i in range(1, len(route.calls)):
        check = route.calls[i]
        if check.calendar is not None and not check.shadow and not reply.outcome(i, 0).allowed:
            alerts.note(_crossing(EXCEEDED, decided, i, identity, 1.0))


def _crossing(kind: str, decided: Decided, i: int, identity: Identity, share: float) -> Crossing:
    route = decided.route
    check = route.calls[i]
    assert check.calendar is not None and check.rate.calendar is not None
    period = check.calendar.span(check.rate.calendar, decided.reply.now_us)
    return Crossing(
        kind, decided.keys[i], share, period, identity.id, identity.tenant,
        route.names[i - 1], route.limits[i - 1], route.plan.name,
    )  # fmt: skip


def _record_denied(state: QuotaState, identity: Identity, decided: Decided | None) -> None:
    """The ledger's count of a denied request (a block's too): under each resource it
    asked for, when its decision is known."""
    if state.ledger is None:
        return
    metered = decided.route.metered if decided is not None else ()
    now_us = decided.reply.now_us if decided is not None else time.time_ns() // 1000
    state.ledger.record(now_us, identity.id, identity.tenant, metered, admitted=False)


class Release:
    """Gives a request's leases back and ends its ticket (overload protection), once:
    a response's close may run more than once, and the teardown may run too."""

    __slots__ = ("found", "state")

    def __init__(self, state: QuotaState, found: RequestQuota) -> None:
        self.state, self.found = state, found

    def __call__(self) -> None:
        found = self.found
        ticket, found.ticket = found.ticket, None
        leased, found.leased = found.leased, False
        if leased and found.decided is not None:
            self.state.enforcer.release(found.decided)
        if ticket is not None and self.state.shedder is not None:
            self.state.shedder.done(ticket)


def teardown_hook(state: QuotaState) -> Callable[[BaseException | None], None]:
    """The teardown hook of the app whose quota ``state`` is: it gives back the leases of
    a request whose response is not streamed, or that got none (its view raised past the
    error handlers, an after-request hook failed, also after a streamed response's close
    hook was set: that response is never sent)."""

    def release_at_teardown(error: BaseException | None) -> None:
        found: RequestQuota | None = g._get_current_object().__dict__.get(G_ATTR)
        if found is None:
            return
        if found.release is None:
            if found.leased or found.ticket is not None:
                Release(state, found)()
        elif error is not None:
            found.release()  # gives back once, whichever of it and the close comes first

    return release_at_teardown


def lease_teardown(app: Flask, state: QuotaState) -> Callable[[], None]:
    """Called by ``init_app`` where it would register ``teardown_hook``; returns what the
    before-request hook calls when a request of ``app`` first holds a lease: that call
    adds the teardown hook where registering it at ``init_app`` would have put it
    (``insert_teardown``), and sets ``state.leasing``. Until then no request has a lease
    to give back, and none pays Flask's dispatch of the hook (its coroutine check runs
    per hook and request)."""
    position = len(app.teardown_request_funcs.get(None, ()))
    ref = weakref.ref(app)  # the state lives in app.extensions: no cycle through it
    hook = teardown_hook(state)
    lock = threading.Lock()

    def start_leasing() -> None:
        with lock:
            found = ref()
            if state.leasing or found is None:
                return
            insert_teardown(found, position, hook)
            state.leasing = True

    return start_leasing


def insert_teardown(
    app: Flask, position: int, hook: Callable[[BaseException | None], None]
) -> None:
    """Add ``hook`` to ``app``'s teardown functions at ``position``, as if registered when
    there were that many. The one place Flask's ``teardown_request_funcs`` (a dict of
    lists, run in reverse order) is written: ``tests/test_internals.py`` fails when
    Flask changes it."""
    funcs = list(app.teardown_request_funcs.get(None, ()))
    funcs.insert(position, hook)
    # A new list, not an insertion: a request tearing down meanwhile goes on through
    # the list it started with, none of its functions skipped or rerun.
    app.teardown_request_funcs[None] = funcs


def status_view(state: QuotaState, loaders: Loaders, budget: LimitSpec) -> Callable[[], Response]:
    """The ``QUOTA_STATUS_URL`` view: the caller's own quota, charging only the global
    tier and its own ``budget``. Exempt from the request hook: it makes its one
    storage call itself."""

    @exempt
    def flask_quota_status() -> Response:
        req: Request = request._get_current_object()  # type: ignore[attr-defined]
        app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        identity = identify(loaders, state.settings, req)
        facts = facts_of(req.method, req.endpoint, remote_ip_tag(req.remote_addr), identity)
        endpoints = limited_endpoints(app, state.views)
        found = caller_status(
            state.enforcer, facts, endpoints, charge=state.settings.enabled, budget=budget
        )
        body = found.as_json()
        if state.ledger is not None and identity is not None:
            body["usage"] = _own_usage(state, identity, facts)
        credits = state.credits
        # Prepaid balances, when some plan has one: an anonymous caller has none ([]).
        if credits is not None and credits.resources():
            plan = state.enforcer.caller(state.catalog(), facts)[1]  # overrides included
            declared = {resource: spec.unit for _, resource, spec in endpoints}
            body["credits"] = [] if identity is None else credits.status(
                identity.id, plan, declared
            )  # fmt: skip
        response = jsonify(body)
        response.headers["Cache-Control"] = "no-store"  # one caller's, and it changes
        return response

    return flask_quota_status


def _own_usage(state: QuotaState, identity: Identity, facts: Facts) -> dict[str, Any] | None:
    """The status's ``usage``: the caller's ledger totals in its current billing period
    (its own billing day, else ``QUOTA_BILLING_DAY``); None while the database fails."""
    calendar = state.settings.calendar
    day = state.enforcer.billing_day(state.catalog(), facts)
    if day is not None:
        calendar = calendar.on_day(day)
    try:
        return period_usage(state.sql.engine, identity.id, calendar, time.time_ns() // 1000)
    except SQLAlchemyError as exc:
        log.warning("flask-quota: the status endpoint could not read the ledger (%s)", exc)
        return None


def _warn_no_proxy_fix(state: QuotaState, req: Request) -> None:
    """Say once per app when requests come through a proxy the app does not trust.

    Werkzeug's ProxyFix leaves the original values in ``werkzeug.proxy_fix.orig``;
    without it ``remote_addr`` is the proxy's, so every caller behind it shares one
    global-tier bucket. (A spoofed header changes no key either way.)
    """
    state.proxy_warned = True
    if "werkzeug.proxy_fix.orig" in req.environ:
        return
    log.warning(
        "flask-quota: requests carry X-Forwarded-For, but the app does not apply Werkzeug's "
        "ProxyFix, so the global tier keys every caller behind the proxy by the proxy's "
        "address (%s): they share one bucket. If a proxy you trust sets the header, wrap "
        "the app: app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1) (from werkzeug.middleware"
        ".proxy_fix); with one proxy in front, x_for=1. This is said once.",
        req.remote_addr,
    )
