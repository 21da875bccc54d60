"""Rate-limit response headers: legacy ``X-RateLimit-*`` and IETF draft-11."""

from __future__ import annotations

from .policy import Decision, TierResult
from .settings import HeaderMode

__all__ = ["rate_limit_headers", "sf_string"]


def sf_string(value: str) -> str:
    """An RFC 8941 sf-string: printable ASCII, quotes and backslashes escaped."""
    text = "".join(c if " " <= c <= "~" else "?" for c in value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rate_limit_headers(decision: Decision, mode: HeaderMode) -> list[tuple[str, str]]:
    """Headers for the tier that matters: the denying one, else the closest to its limit."""
    shown: TierResult | None = decision.denied or decision.closest
    if shown is None or mode is HeaderMode.NONE:
        return []
    outcome = shown.outcome
    headers: list[tuple[str, str]] = []
    if mode in (HeaderMode.LEGACY, HeaderMode.BOTH):
        headers += [
            ("X-RateLimit-Limit", str(outcome.limit)),
            ("X-RateLimit-Remaining", str(outcome.remaining)),
            ("X-RateLimit-Reset", str(-(-outcome.reset_us // 1_000_000))),
            ("X-RateLimit-Resource", shown.name),
        ]
    if mode in (HeaderMode.IETF, HeaderMode.BOTH):
        policies = ", ".join(
            f"{sf_string(r.name)};q={r.outcome.limit};w={r.rate.policy_window}"
            for r in decision.results
        )
        reset_in = decision.seconds_until(outcome.reset_us)
        headers += [
            ("RateLimit-Policy", policies),
            ("RateLimit", f"{sf_string(shown.name)};r={outcome.remaining};t={reset_in}"),
        ]
    return headers
