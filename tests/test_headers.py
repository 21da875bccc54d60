"""Rate-limit headers on a response: ours replace any of the same name, and renames
(``QUOTA_HEADER_NAMES``) have one home. Which tier the values describe, for any mix of
outcomes, is ``tests/test_route.py``'s."""

from __future__ import annotations

from hypothesis import strategies as st
from werkzeug.datastructures import Headers

from flask_quota.core.algorithms import Outcome
from flask_quota.core.headers import Renamer, apply_headers

NOW = 1_700_000_000_000_000

outcomes = st.builds(
    Outcome,
    st.booleans(),
    st.integers(1, 100),
    st.integers(-3, 100),
    st.integers(NOW - 10**6, NOW + 10**8),
    st.integers(0, 10**8),
)


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


def test_a_renamer_renames_every_way_ours_are_sent() -> None:
    """One home for renames: the pairs we write, the headers of a response an app built
    from our error (moved to their names), and ``Retry-After``."""
    renamer = Renamer({"X-RateLimit-Limit": "X-Quota-Limit", "Retry-After": "X-Wait"})
    assert renamer.pairs([("X-RateLimit-Limit", "5"), ("RateLimit", "x")]) == [
        ("X-Quota-Limit", "5"),
        ("RateLimit", "x"),
    ]
    built = Headers([("X-RateLimit-Limit", "5"), ("Retry-After", "3")])
    renamer.rename(built)
    assert sorted(built.items()) == [("X-Quota-Limit", "5"), ("X-Wait", "3")]
    assert Renamer.retry_after(renamer) == "X-Wait"
    assert Renamer.retry_after(None) == "Retry-After"
    renamed = Headers([("Content-Type", "text/plain")])
    apply_headers(renamed, [("X-RateLimit-Limit", "5")], renamer)
    assert renamed["X-Quota-Limit"] == "5" and "X-RateLimit-Limit" not in renamed
