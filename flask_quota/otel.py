"""OpenTelemetry: the decision as ``ratelimit.*`` attributes of the current span.

With ``opentelemetry-api`` installed (``pip install 'flask-quota[otel]'``) the
enforcer's observer sets, on the span that is current while a request is
decided, ``ratelimit.outcome`` (the metrics' outcomes: ``allowed``, ``denied``,
``shadow_denied``, ``blocked``, ``fail_open``, ``fail_closed``, ``local``),
``ratelimit.tier`` (the tier that denied, else the one closest to its limit),
``ratelimit.policy`` (its ``RateLimit-Policy`` name), ``ratelimit.remaining`` and
``ratelimit.plan``. Never an identity, an address or a key: spans are exported
to systems with other retention and access rules than the app's own.

Whether the package is installed is found out once (``span_observer``); per
request the only cost is asking whether the current span records. Without a
configured SDK no span records, and the decision is not even built for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .core.enforcer import DecisionObserver
from .core.policy import Decision, TierCheck, TierResult
from .core.priority import Priority

__all__ = ["OUTCOME", "PLAN", "POLICY", "REMAINING", "TIER", "SpanObserver", "span_observer"]

OUTCOME = "ratelimit.outcome"
TIER = "ratelimit.tier"
POLICY = "ratelimit.policy"
REMAINING = "ratelimit.remaining"
PLAN = "ratelimit.plan"
PRIORITY = "ratelimit.priority"  # a shed request's class


class SpanObserver:
    """The enforcer's observer that writes the decision onto the recording span."""

    def __init__(self, current_span: Any, current_context: Any = None) -> None:
        self.current_span = current_span  # opentelemetry.trace.get_current_span
        self.current_context = current_context  # opentelemetry.context.get_current

    def watching(self) -> bool:
        # An empty context holds no span, so none records (the usual case without an
        # SDK): two calls instead of the span lookup's five and its ABC isinstance.
        if self.current_context is not None and not self.current_context():
            return False
        return bool(self.current_span().is_recording())

    def stored(self, seconds: float) -> None:
        """Storage time is the metrics' business (a span has its own duration)."""

    def unavailable(self, tiers: Sequence[TierCheck], plan: str, outcome: str) -> None:
        span = self.current_span()
        if span.is_recording():
            attributes: dict[str, str] = {OUTCOME: outcome, PLAN: plan}
            if tiers:
                attributes[TIER] = tiers[0].tier.value
                attributes[POLICY] = tiers[0].name
            span.set_attributes(attributes)

    def decided(self, decision: Decision, *, local: bool, blocked: bool) -> None:
        span = self.current_span()
        if not span.is_recording():
            return
        attributes: dict[str, str | int] = {PLAN: decision.plan}
        if blocked:
            attributes[OUTCOME] = "blocked"
            attributes[TIER] = "blocked"
            span.set_attributes(attributes)
            return
        if not decision.allowed:
            attributes[OUTCOME] = "denied"
        elif local:
            attributes[OUTCOME] = "local"
        elif decision.shadow_denied:
            attributes[OUTCOME] = "shadow_denied"
        else:
            attributes[OUTCOME] = "allowed"
        shown = decision.shown or (decision.shadow_denied or (None,))[0]
        if shown is not None:
            attributes[TIER] = shown.tier.value
            attributes[POLICY] = shown.name
            attributes[REMAINING] = max(0, shown.outcome.remaining)
        span.set_attributes(attributes)

    def near_limit(self, decision: Decision, result: TierResult) -> None:
        """Counted by the metrics; the span already says what is left."""

    def shed(self, priority: Priority, reason: str, *, shadow: bool) -> None:
        """``ratelimit.outcome`` ``shed`` (``shadow_shed`` when only counted), the class and
        why: ``ratelimit.tier`` ``capacity`` or ``queue``."""
        span = self.current_span()
        if span.is_recording():
            span.set_attributes(
                {OUTCOME: "shadow_shed" if shadow else "shed", TIER: reason,
                 PRIORITY: priority.value}
            )  # fmt: skip


def span_observer() -> DecisionObserver | None:
    """A ``SpanObserver`` when ``opentelemetry-api`` is installed, else ``None``."""
    try:
        from opentelemetry import context, trace
    except ImportError:
        return None
    return SpanObserver(trace.get_current_span, context.get_current)
