"""Rate-limit headers: the tier shown and every value, for any mix of outcomes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from werkzeug.datastructures import Headers

from flask_quota.core.algorithms import Outcome
from flask_quota.core.clock import ceil_seconds
from flask_quota.core.headers import apply_headers, rate_limit_headers, sf_string
from flask_quota.core.policy import Decision, TierResult
from flask_quota.core.rates import Rate
from flask_quota.core.tiers import Tier
from flask_quota.settings import HeaderMode

NOW = 1_700_000_000_000_000

outcomes = st.builds(
    Outcome,
    st.booleans(),
    st.integers(1, 100),
    st.integers(-3, 100),
    st.integers(NOW - 10**6, NOW + 10**8),
    st.integers(0, 10**8),
)


@st.composite
def decisions(draw: st.DrawFn) -> Decision:
    tiers = draw(st.lists(outcomes, min_size=1, max_size=4))
    names = ["global", "user", "res", "res@86400"]
    return Decision(
        "p",
        tuple(
            TierResult(Tier.ENDPOINT, names[i], Rate(o.limit, 60 * (i + 1)), o)
            for i, o in enumerate(tiers)
        ),
        NOW,
    )


@given(decisions())
def test_headers_show_the_denying_tier_else_the_closest(decision: Decision) -> None:
    """The six headers describe ``decision.denied or decision.closest``, every tier
    in RateLimit-Policy, in that order and format."""
    shown = decision.denied or decision.closest
    assert shown is not None
    o = shown.outcome
    policy = ", ".join(
        f"{sf_string(r.name)};q={r.outcome.limit};w={r.rate.policy_window}"
        for r in decision.results
    )
    expected = [
        ("X-RateLimit-Limit", str(o.limit)),
        ("X-RateLimit-Remaining", str(max(0, o.remaining))),
        ("X-RateLimit-Reset", str(ceil_seconds(o.reset_us))),
        ("X-RateLimit-Resource", shown.name),
        ("RateLimit-Policy", policy),
        (
            "RateLimit",
            f"{sf_string(shown.name)};r={max(0, o.remaining)};"
            f"t={decision.seconds_until(o.reset_us)}",
        ),
    ]
    assert rate_limit_headers(decision, HeaderMode.BOTH) == expected
    assert rate_limit_headers(decision, HeaderMode.LEGACY) == expected[:4]
    assert rate_limit_headers(decision, HeaderMode.IETF) == expected[4:]
    assert rate_limit_headers(decision, HeaderMode.NONE) == []


def test_apply_headers_replaces_ours_and_keeps_the_rest() -> None:
    """Headers already on the response with one of our names are replaced, in place;
    without any, ours are appended after the response's own."""
    pairs = [("X-RateLimit-Limit", "5"), ("RateLimit", '"user";r=4;t=60')]
    fresh = Headers([("Content-Type", "text/plain")])
    apply_headers(fresh, pairs)
    assert list(fresh.items()) == [("Content-Type", "text/plain"), *pairs]
    taken = Headers([("ratelimit", "old"), ("Content-Type", "text/plain")])
    apply_headers(taken, pairs)
    assert list(taken.items()) == [
        ("RateLimit", '"user";r=4;t=60'),
        ("Content-Type", "text/plain"),
        ("X-RateLimit-Limit", "5"),
    ]
