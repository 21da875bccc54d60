"""Exact semantics of the four algorithms, on memory and on a real Redis, same clock."""

from __future__ import annotations

import pytest

from flask_quota.core.algorithms import Algorithm, Outcome
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check, Storage
from flask_quota.testing import FrozenClock
from tests.backends import backend

__all__ = ["backend"]

S = 1_000_000
Backend = tuple[Storage, FrozenClock]


def hit(
    storage: Storage, algorithm: Algorithm, rate: str, cost: int = 1, key: str = "k"
) -> Outcome:
    return storage.decide([Check(key, algorithm, parse_rate(rate), cost)]).outcomes[0]


def test_token_bucket_drains_and_refills(backend: Backend) -> None:
    """5/second: five pass at once, the sixth waits exactly one token (200 ms)."""
    storage, clock = backend
    t0 = clock.now_us
    remaining = [hit(storage, Algorithm.TOKEN_BUCKET, "5/second").remaining for _ in range(5)]
    assert remaining == [4, 3, 2, 1, 0]
    denied = hit(storage, Algorithm.TOKEN_BUCKET, "5/second")
    assert denied == Outcome(False, 5, 0, t0 + S, 200_000)
    clock.advance(0.2)
    assert hit(storage, Algorithm.TOKEN_BUCKET, "5/second") == Outcome(
        True, 5, 0, t0 + 1_200_000, 0
    )
    assert not hit(storage, Algorithm.TOKEN_BUCKET, "5/second").allowed
    clock.advance(1.2)
    assert hit(storage, Algorithm.TOKEN_BUCKET, "5/second").remaining == 4


def test_token_bucket_burst_and_cost(backend: Backend) -> None:
    """'1/second; burst=3' holds three tokens; a cost-2 request needs two."""
    storage, clock = backend
    rate = "1/second; burst=3"
    assert hit(storage, Algorithm.TOKEN_BUCKET, rate, cost=2).remaining == 1
    denied = hit(storage, Algorithm.TOKEN_BUCKET, rate, cost=2)
    assert (denied.allowed, denied.remaining, denied.retry_after_us) == (False, 1, S)
    clock.advance(1)
    assert hit(storage, Algorithm.TOKEN_BUCKET, rate, cost=2).remaining == 0
    assert hit(storage, Algorithm.TOKEN_BUCKET, rate, cost=0).allowed  # a free request passes


def test_token_bucket_denial_consumes_nothing(backend: Backend) -> None:
    """After a denial, waiting exactly Retry-After is enough."""
    storage, clock = backend
    for _ in range(3):
        hit(storage, Algorithm.TOKEN_BUCKET, "3/minute")
    retry = hit(storage, Algorithm.TOKEN_BUCKET, "3/minute").retry_after_us
    for _ in range(5):
        assert not hit(storage, Algorithm.TOKEN_BUCKET, "3/minute").allowed
    clock.advance(retry / S)
    assert hit(storage, Algorithm.TOKEN_BUCKET, "3/minute").allowed


def test_fixed_window(backend: Backend) -> None:
    """3/minute per epoch-aligned minute; the window end is both reset and retry."""
    storage, clock = backend
    clock.advance(10)
    start = clock.now_us - 10 * S
    assert [hit(storage, Algorithm.FIXED_WINDOW, "3/minute").remaining for _ in range(3)] == [
        2,
        1,
        0,
    ]
    assert hit(storage, Algorithm.FIXED_WINDOW, "3/minute") == Outcome(
        False, 3, 0, start + 60 * S, 50 * S
    )
    clock.advance(49.999999)
    assert not hit(storage, Algorithm.FIXED_WINDOW, "3/minute").allowed
    clock.advance(0.000001)
    assert hit(storage, Algorithm.FIXED_WINDOW, "3/minute") == Outcome(
        True, 3, 2, start + 120 * S, 0
    )


def test_sliding_window_log(backend: Backend) -> None:
    """3/minute over the last 60 s: the oldest entry's expiry frees the next slot."""
    storage, clock = backend
    t0 = clock.now_us
    for _ in range(3):
        assert hit(storage, Algorithm.SLIDING_WINDOW_LOG, "3/minute").allowed
        clock.advance(10)
    assert hit(storage, Algorithm.SLIDING_WINDOW_LOG, "3/minute") == Outcome(
        False, 3, 0, t0 + 80 * S, 30 * S
    )
    clock.advance(29.999999)
    assert not hit(storage, Algorithm.SLIDING_WINDOW_LOG, "3/minute").allowed
    clock.advance(0.000001)
    assert hit(storage, Algorithm.SLIDING_WINDOW_LOG, "3/minute").remaining == 0
    denied = hit(storage, Algorithm.SLIDING_WINDOW_LOG, "3/minute", cost=2)
    assert denied.retry_after_us == 20 * S  # two entries (t0+10, t0+20) must expire


def test_sliding_window_counter(backend: Backend) -> None:
    """10/minute: a full previous window weighs 50% halfway through the next one."""
    storage, clock = backend
    for _ in range(10):
        assert hit(storage, Algorithm.SLIDING_WINDOW_COUNTER, "10/minute").allowed
    assert not hit(storage, Algorithm.SLIDING_WINDOW_COUNTER, "10/minute").allowed
    clock.advance(90)  # 30 s into the next minute: estimate = 10 * 0.5 = 5
    results = [hit(storage, Algorithm.SLIDING_WINDOW_COUNTER, "10/minute") for _ in range(6)]
    assert [r.allowed for r in results] == [True] * 5 + [False]
    assert [r.remaining for r in results[:5]] == [4, 3, 2, 1, 0]
    # Next pass when 10 * (60 - e) / 60 + 5 + 1 <= 10, i.e. e >= 36 s: 6 s from now.
    assert results[5].retry_after_us == 6 * S
    clock.advance(6)
    assert hit(storage, Algorithm.SLIDING_WINDOW_COUNTER, "10/minute").allowed


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_all_or_nothing_across_keys(backend: Backend, algorithm: Algorithm) -> None:
    """When one check denies, no check is charged."""
    storage, _ = backend
    loose, tight = parse_rate("100/minute"), parse_rate("1/minute")
    storage.decide([Check("tight", algorithm, tight, 1)])
    verdict = storage.decide(
        [Check("loose", algorithm, loose, 1), Check("tight", algorithm, tight, 1)]
    )
    assert [o.allowed for o in verdict.outcomes] == [True, False]
    assert not verdict.allowed
    assert storage.peek([Check("loose", algorithm, loose, 0)]).outcomes[0].remaining == 100


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_peek_changes_nothing(backend: Backend, algorithm: Algorithm) -> None:
    """Peeking reports the state and charges no unit, however often."""
    storage, _ = backend
    rate = parse_rate("5/minute")
    storage.decide([Check("p", algorithm, rate, 2)])
    for _ in range(10):
        assert storage.peek([Check("p", algorithm, rate, 0)]).outcomes[0].remaining == 3


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_cost_above_limit_never_passes(backend: Backend, algorithm: Algorithm) -> None:
    """A request costing more than the limit is denied with a finite Retry-After."""
    storage, _ = backend
    outcome = hit(storage, algorithm, "3/minute", cost=4)
    assert not outcome.allowed
    assert 0 < outcome.retry_after_us <= 120 * S


def test_a_storage_clock_stepping_back_costs_a_token_bucket_at_most_a_refill(
    backend: Backend,
) -> None:
    """Found in review: the storage's clock stepping back an hour locked token-bucket
    callers out for the hour (0 of the next 8 admitted, ``Retry-After`` 3588), the
    bucket's time being an hour ahead. A bucket's time is at most one refill (its
    capacity's worth) ahead of the clock it was written by: one further ahead can only
    mean the clock went back, and reads as an empty bucket. So a step back costs at
    most one refill (here 60 s of a 10/minute bucket), however long the step."""
    storage, clock = backend
    rate = "10/minute"
    assert [hit(storage, Algorithm.TOKEN_BUCKET, rate).allowed for _ in range(3)] == [True] * 3
    clock.now_us -= 3600 * S  # the storage's clock steps back an hour
    denied = hit(storage, Algorithm.TOKEN_BUCKET, rate)
    assert not denied.allowed and denied.retry_after_us <= 6 * S  # one token: 6 s
    clock.advance(6)
    assert hit(storage, Algorithm.TOKEN_BUCKET, rate).allowed
    clock.advance(60)
    assert [hit(storage, Algorithm.TOKEN_BUCKET, rate).allowed for _ in range(10)] == [True] * 10


def test_a_debt_survives_the_clock_stepping_back(backend: Backend) -> None:
    """A charge may put a bucket further ahead than a refill (``quota.charge``, into
    debt): that debt is kept as it stood when charged if the clock then steps back,
    neither lost nor made an hour longer."""
    storage, clock = backend
    check = Check("k", Algorithm.TOKEN_BUCKET, parse_rate("10/minute"), 40)
    storage.charge([check])  # 40 units on a 10-unit bucket: 30 in debt, 240 s to wait
    clock.now_us -= 3600 * S
    denied = hit(storage, Algorithm.TOKEN_BUCKET, "10/minute")
    assert not denied.allowed and 180 * S < denied.retry_after_us <= 186 * S
    clock.advance(186)
    assert hit(storage, Algorithm.TOKEN_BUCKET, "10/minute").allowed
