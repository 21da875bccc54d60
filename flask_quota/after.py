"""A request's end: its rate-limit headers, its settlement and its leases' give-back.

After the view, the decided request's headers are set and what the view changed
of its charge is settled (``quota.charge``, ``quota.settle``, ``charge_when``):
at once, or when a streamed response ends (the stream may still settle while it
runs). A request's leases go back when its streamed response closes, else at
teardown, which also catches what a failing hook left behind.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask, Response, g
from werkzeug.datastructures import Headers

from .core.enforcer import Decided, Enforcer
from .core.errors import QuotaExceeded
from .core.headers import OURS, RETRY_AFTER, HeaderMode, apply_headers, rate_limit_headers
from .core.policy import LimitSpec
from .state import QuotaState

__all__ = ["NOTHING_AFTER", "after_hook", "lease_teardown", "teardown_hook"]

log = logging.getLogger("flask_quota")

# ``g._quota_after`` until a view calls quota.charge or quota.settle: (units, actual).
NOTHING_AFTER: tuple[int, int | None] = (0, None)
_NO_HEADERS = HeaderMode.NONE  # a module constant: see ``core.route``'s


def after_hook(state: QuotaState) -> Callable[[Response], Response]:
    """The after-request hook of the app whose quota ``state`` is: headers, settlement
    and the leases of the response."""

    def after_request(response: Response) -> Response:
        scope = g._get_current_object()
        found = scope.__dict__  # read once: the hook pops several of our entries
        if "_quota_denial" in found:
            _denied(state, response, found.pop("_quota_denial"))
        decided: Decided | None = found.pop("_quota", None)
        if decided is None:
            return response
        settings = state.settings
        mode, names, headers = settings.headers, settings.header_names, response.headers
        route, reply, spec = decided.route, decided.reply, decided.spec
        if route.leases and mode is not _NO_HEADERS:
            _add(headers, route.lease_headers(reply), names)
        decision = None
        settles_later = False
        if found.pop("_quota_inner", False):
            # A quota.limited inside the view denied: the 429 is that limit's, and the
            # view's own headers would contradict its body.
            pass
        elif spec is not None and reply.all_allowed and response.is_streamed:
            # The stream may still call quota.settle or quota.charge while it runs: they
            # are settled when it ends. Its headers left before, so they show admission.
            _add(headers, route.headers(reply, mode), names)
            response.call_on_close(_Settle(state, decided, scope, response))
            settles_later = True
        # What the view asked for after the response: quota.charge's units, quota.settle's.
        # Asked only when there may be something (the usual request has nothing).
        elif (
            "_quota_after" in found or (spec is not None and (spec.charge_when or decided.more))
        ) and (after := _settlement(found, decided, response)) is not None:
            decision = state.enforcer.settle(decided, **after)
            _add(headers, rate_limit_headers(decision, mode), names)
        else:
            _add(headers, route.headers(reply, mode), names)
        if decided.near is not None and not settles_later:
            state.enforcer.done(decided)  # charged as admitted: its crossings are told now
        if state.usage is not None:
            decision = decision or decided.decision()
            state.usage.record(decided.tag, decision.plan, decision.usage_outcomes())
        if route.leases and response.is_streamed:
            # Last, so that a failure above leaves the lease to the teardown: a streamed
            # response holds its leases until it is closed (its stream ended).
            leased: Decided | None = found.pop("_quota_leased", None)
            if leased is not None:
                release = _Release(state.enforcer, leased)
                scope._quota_release = release  # for the teardown, if a later hook raises
                response.call_on_close(release)
        return response

    return after_request


def _add(headers: Headers, pairs: list[tuple[str, str]], names: Mapping[str, str] | None) -> None:
    """``apply_headers``, with a fast path for a response's own Werkzeug ``Headers`` that
    holds none of ours (the usual case): its pair list is extended directly, skipping
    ``add``'s search of each value for a line break (ours are printable ASCII)."""
    if not pairs:  # QUOTA_HEADERS=none, or a route without rates: nothing to look for
        return
    if not names and type(headers) is Headers:
        listed = headers._list
        for name, _ in listed:
            if name.lower() in OURS:
                break
        else:
            listed.extend(pairs)
            return
    apply_headers(headers, pairs, names)


def _denied(state: QuotaState, response: Response, denial: QuotaExceeded) -> None:
    """A denied request's response: its ``Retry-After``, under our header names."""
    names = state.settings.header_names
    wait = names.get(RETRY_AFTER, RETRY_AFTER) if names else RETRY_AFTER
    if wait not in response.headers:
        # The app's own @app.errorhandler(QuotaExceeded) answered: the wait still
        # holds (a block's rest, not the tier's, when this request was blocked).
        response.headers[wait] = str(denial.retry_after)
    if names:  # e.g. the handler returned error.get_response(): our usual names
        _rename(response, names)


def _settlement(
    found: dict[str, Any], decided: Decided, response: Response
) -> dict[str, Any] | None:
    """``Enforcer.settle``'s arguments for an admitted request whose view charged, settled
    or has a ``charge_when`` to ask; None when nothing changes its charge. ``found`` is
    the request's ``g.__dict__``."""
    extra, actual = found.pop("_quota_after", NOTHING_AFTER)
    spec = decided.spec
    if spec is None or not decided.reply.all_allowed:
        return None
    more = decided.more
    if not (spec.charge_when or extra or actual is not None or (more and _judged(more))):
        return None

    def counted(limit: LimitSpec) -> bool:
        return limit.charge_when is None or bool(limit.charge_when(response))

    return {"counted": counted, "extra": extra, "actual": actual}


class _Settle:
    """A streamed response's settlement when it is closed: what its stream charged or
    settled while it ran (``quota.charge``, ``quota.settle``) and its ``charge_when``."""

    __slots__ = ("decided", "response", "scope", "state")

    def __init__(self, state: QuotaState, decided: Decided, scope: Any, response: Response):
        self.state, self.decided, self.scope, self.response = state, decided, scope, response

    def __call__(self) -> None:
        after = _settlement(self.scope.__dict__, self.decided, self.response)
        if after is None:
            self.state.enforcer.done(self.decided)
            return
        try:
            self.state.enforcer.settle(self.decided, **after)
        except Exception:  # the response is gone: nothing to answer, so it is logged
            log.exception("flask-quota: settling a streamed response failed")


def _rename(response: Response, names: Mapping[str, str]) -> None:
    """Our headers sent under their usual names (a response the app built from our
    error) move to their ``QUOTA_HEADER_NAMES`` names."""
    headers = response.headers
    for ours, theirs in names.items():
        value = headers.get(ours)
        if value is not None and theirs != ours:
            del headers[ours]
            headers[theirs] = value


class _Release:
    """Gives a request's leases back once: the response's close may run more than once."""

    __slots__ = ("decided", "enforcer")

    def __init__(self, enforcer: Enforcer, decided: Decided | None) -> None:
        self.enforcer, self.decided = enforcer, decided

    def __call__(self) -> None:
        decided, self.decided = self.decided, None
        if decided is not None:
            self.enforcer.release(decided)


def teardown_hook(state: QuotaState) -> Callable[[BaseException | None], None]:
    """The teardown hook of the app whose quota ``state`` is: it gives back the leases of
    a request whose response is not streamed, or that got none (its view raised past the
    error handlers, an after-request hook failed, also after a streamed response's close
    hook was set: that response is never sent)."""

    def release_at_teardown(error: BaseException | None) -> None:
        found = g._get_current_object().__dict__
        leased: Decided | None = found.pop("_quota_leased", None)
        if leased is not None:
            _Release(state.enforcer, leased)()
        release: _Release | None = found.pop("_quota_release", None)
        if release is not None and error is not None:
            release()  # gives back once, whichever of it and the close comes first

    return release_at_teardown


def lease_teardown(app: Flask, state: QuotaState) -> Callable[[], None]:
    """Called by ``init_app`` where it would register ``teardown_hook``; returns what the
    before-request hook calls when a request of ``app`` first holds a lease. That call
    adds the teardown hook to the app's teardown functions, at the place registering it
    at ``init_app`` gave it (Flask runs them in reverse order of registration), and sets
    ``state.leasing``. Until then no request has a lease to give back, and none pays
    Flask's dispatch of the hook (its coroutine check runs per hook and request)."""
    position = len(app.teardown_request_funcs.get(None, ()))
    ref = weakref.ref(app)  # the state lives in app.extensions: no cycle through it
    hook = teardown_hook(state)
    lock = threading.Lock()

    def start_leasing() -> None:
        with lock:
            found = ref()
            if state.leasing or found is None:
                return
            funcs = list(found.teardown_request_funcs.get(None, ()))
            funcs.insert(position, hook)
            # A new list, not an insertion: a request tearing down meanwhile goes on
            # through the list it started with, none of its functions skipped or rerun.
            found.teardown_request_funcs[None] = funcs
            state.leasing = True

    return start_leasing


def _judged(more: tuple[LimitSpec, ...]) -> bool:
    """True when a stacked view's further limit has a ``charge_when`` to ask."""
    return any(spec.charge_when is not None for spec in more)
