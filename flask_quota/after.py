"""A request's end: its rate-limit headers, its settlement and its leases' give-back.

After the view, the decided request's headers are set and what the view changed
of its charge is settled (``quota.charge``, ``quota.settle``, ``charge_when``):
at once, or when a streamed response ends (the stream may still settle while it
runs). A request's leases go back when its streamed response closes, else at
teardown, which also catches what a failing hook left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Response, current_app, g

from .core.enforcer import Decided, Enforcer
from .core.errors import QuotaExceeded
from .core.headers import RETRY_AFTER, HeaderMode, apply_headers, rate_limit_headers
from .core.policy import LimitSpec
from .state import QuotaState

__all__ = ["NOTHING_AFTER", "after_request", "release_at_teardown"]

log = logging.getLogger("flask_quota")

# ``g._quota_after`` until a view calls quota.charge or quota.settle: (units, actual).
NOTHING_AFTER: tuple[int, int | None] = (0, None)


def after_request(response: Response) -> Response:
    """The after-request hook: headers, settlement and the leases of ``response``."""
    scope = g._get_current_object()
    denial: QuotaExceeded | None = scope.__dict__.pop("_quota_denial", None)
    if denial is not None:
        names = current_app.extensions["quota"].settings.header_names
        wait = names.get(RETRY_AFTER, RETRY_AFTER) if names else RETRY_AFTER
        if wait not in response.headers:
            # The app's own @app.errorhandler(QuotaExceeded) answered: the wait still
            # holds (a block's rest, not the tier's, when this request was blocked).
            response.headers[wait] = str(denial.retry_after)
        if names:  # e.g. the handler returned error.get_response(): our usual names
            _rename(response, names)
    decided: Decided | None = scope.__dict__.pop("_quota", None)
    if decided is None:
        return response
    state: QuotaState = current_app.extensions["quota"]
    mode, headers, spec = state.settings.headers, response.headers, decided.spec
    names = state.settings.header_names
    if decided.route.leases and mode is not HeaderMode.NONE:
        apply_headers(headers, decided.route.lease_headers(decided.reply), names)
    decision = None
    if scope.__dict__.pop("_quota_inner", False):
        # A quota.limited inside the view denied: the 429 is that limit's, and the
        # view's own headers would contradict its body.
        pass
    elif response.is_streamed and spec is not None and decided.reply.all_allowed:
        # The stream may still call quota.settle or quota.charge while it runs: they
        # are settled when it ends. Its headers left before, so they show admission.
        apply_headers(headers, decided.route.headers(decided.reply, mode), names)
        response.call_on_close(_Settle(state, decided, scope, response))
    # What the view asked for after the response: quota.charge's units, quota.settle's.
    elif (after := _settlement(scope, decided, response)) is not None:
        decision = state.enforcer.settle(decided, **after)
        apply_headers(headers, rate_limit_headers(decision, mode), names)
    else:
        apply_headers(headers, decided.route.headers(decided.reply, mode), names)
    if state.usage is not None:
        decision = decision or decided.decision()
        state.usage.record(decided.tag, decision.plan, decision.usage_outcomes())
    if decided.route.leases and response.is_streamed:
        # Last, so that a failure above leaves the lease to the teardown: a streamed
        # response holds its leases until it is closed (its stream ended).
        leased: Decided | None = scope.__dict__.pop("_quota_leased", None)
        if leased is not None:
            release = _Release(state.enforcer, leased)
            scope._quota_release = release  # for the teardown, if a later hook raises
            response.call_on_close(release)
    return response


def _settlement(scope: Any, decided: Decided, response: Response) -> dict[str, Any] | None:
    """``Enforcer.settle``'s arguments for an admitted request whose view charged, settled
    or has a ``charge_when`` to ask; None when nothing changes its charge."""
    extra, actual = scope.__dict__.pop("_quota_after", NOTHING_AFTER)
    spec = decided.spec
    if spec is None or not decided.reply.all_allowed:
        return None
    if not (spec.charge_when or extra or actual is not None or _judged(decided.more)):
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
        after = _settlement(self.scope, self.decided, self.response)
        if after is None:
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


def release_at_teardown(error: BaseException | None) -> None:
    """Give back the leases of a request whose response is not streamed, or that got
    none (its view raised past the error handlers, an after-request hook failed, also
    after a streamed response's close hook was set: that response is never sent)."""
    scope = g._get_current_object()
    leased: Decided | None = scope.__dict__.pop("_quota_leased", None)
    if leased is not None:
        state: QuotaState = current_app.extensions["quota"]
        _Release(state.enforcer, leased)()
    release: _Release | None = scope.__dict__.pop("_quota_release", None)
    if release is not None and error is not None:
        release()  # gives back once, whichever of it and the close comes first


def _judged(more: tuple[LimitSpec, ...]) -> bool:
    """True when a stacked view's further limit has a ``charge_when`` to ask."""
    return any(spec.charge_when is not None for spec in more)
