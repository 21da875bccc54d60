"""Reservations (``Check.wait_us``, behind ``wait=`` and ``delay=``): a cost that fits
within the caller's wait is admitted now, at a later time the reply names, and counted
from now, so no later caller takes its units and no span admits more than the rate.
Decided alike by the memory storage and the Lua script, for every algorithm."""

from __future__ import annotations

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.checks import Check
from flask_quota.core.rates import Rate, parse_rate
from flask_quota.storage.memory import MemoryStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

pytestmark = pytest.mark.also_valkey

RATES = ["3/second", "5/minute", "2/second; burst=6", "7/10 seconds"]

# (microseconds to advance, cost, wait in microseconds, what to do)
actions = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 999, 50_000, 333_333, 1_000_000, 4_000_000]),
        st.integers(min_value=0, max_value=4),
        st.sampled_from([0, 0, 100_000, 400_000, 1_500_000, 12_000_000]),
        st.sampled_from(["decide", "decide", "decide", "charge", "refund"]),
    ),
    min_size=1,
    max_size=50,
)


@pytest.mark.parametrize("algorithm", list(Algorithm))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rate_text=st.sampled_from(RATES), timeline=actions)
def test_memory_and_redis_agree_on_reservations(
    redis_client: redis.Redis,
    algorithm: Algorithm,
    rate_text: str,
    timeline: list[tuple[int, int, int, str]],
) -> None:
    """Random waits, costs, charges and refunds of reservations: both backends answer
    the same, step by step, and a later plain check sees the same state."""
    redis_client.flushall()
    clock = FrozenClock(1_700_000_123.456789)
    memory, remote = MemoryStorage(clock), RedisStorage(redis_client, clock=clock)
    rate = parse_rate(rate_text)
    last: tuple[int, int] | None = None  # (cost, admitted at) of the last reservation
    for delta_us, cost, wait, action in timeline:
        clock.now_us += delta_us
        check = Check("k", algorithm, rate, cost, wait_us=wait)
        if action == "charge":
            memory.charge([check])
            remote.charge([check])
        elif action == "refund" and last is not None:
            undo = Check("k", algorithm, rate, last[0])
            memory.refund([undo], last[1])
            remote.refund([undo], last[1])
        else:
            ours, theirs = memory.decide([check]), remote.decide([check])
            assert ours == theirs
            outcome = ours.outcomes[0]
            if outcome.allowed and cost:
                last = (cost, ours.now_us + outcome.retry_after_us)
        look = [Check("k", algorithm, rate, 0)]
        assert memory.peek(look) == remote.peek(look)


def _span_bound(algorithm: Algorithm, rate: Rate, span_us: int) -> int:
    """The most units ``algorithm`` may admit within any ``span_us``-long span of
    admission times (the closed interval)."""
    if algorithm is Algorithm.TOKEN_BUCKET:
        return rate.capacity + span_us // rate.interval_us
    windows = span_us // rate.window_us + 2  # a span meets at most this many windows
    if algorithm is Algorithm.SLIDING_WINDOW_LOG:
        return rate.limit * (span_us // rate.window_us + 1)
    if algorithm is Algorithm.SLIDING_WINDOW_COUNTER:
        return 2 * rate.limit * windows  # an estimate: only bounded, not exact
    return rate.limit * windows


@pytest.mark.parametrize("algorithm", list(Algorithm))
@settings(max_examples=200, deadline=None)
@given(
    rate_text=st.sampled_from(RATES),
    timeline=st.lists(
        st.tuples(
            st.sampled_from([0, 1, 50_000, 333_333, 1_000_000]),
            st.integers(min_value=1, max_value=3),
            st.sampled_from([0, 300_000, 2_000_000]),
            st.booleans(),  # a reservation made here is cancelled (given back) at once
        ),
        min_size=1,
        max_size=80,
    ),
)
def test_reservations_never_admit_more_than_the_rate(
    algorithm: Algorithm, rate_text: str, timeline: list[tuple[int, int, int, bool]]
) -> None:
    """Whatever callers ask with whatever waits, and whichever waiters are cancelled, the
    units admitted, placed at the times they are admitted (decision time plus wait),
    never exceed the rate over any span; a fixed window is held to its exact bound per
    window."""
    clock = FrozenClock(1_700_000_123.456789)
    storage = MemoryStorage(clock)
    rate = parse_rate(rate_text)
    admitted: list[tuple[int, int]] = []  # (admitted at, cost)
    for delta_us, cost, wait, cancel in timeline:
        clock.now_us += delta_us
        verdict = storage.decide([Check("k", algorithm, rate, cost, wait_us=wait)])
        outcome = verdict.outcomes[0]
        if outcome.allowed and cancel and outcome.retry_after_us:
            at = verdict.now_us + outcome.retry_after_us
            storage.refund([Check("k", algorithm, rate, cost)], at)  # the waiter gave up
        elif outcome.allowed:
            assert outcome.retry_after_us <= wait
            admitted.append((verdict.now_us + outcome.retry_after_us, cost))
        else:
            # refused only when it could not fit within the wait, or never fits
            assert outcome.retry_after_us > wait or cost > outcome.limit
    times = sorted(admitted)
    for i, (start, _) in enumerate(times):
        for span in (rate.window_us - 1, 3 * rate.window_us):
            units = sum(c for t, c in times[i:] if t <= start + span)
            assert units <= _span_bound(algorithm, rate, span), (start, span, times)
    if algorithm is Algorithm.FIXED_WINDOW:
        per: dict[int, int] = {}
        for t, c in times:
            per[t // rate.window_us] = per.get(t // rate.window_us, 0) + c
        assert max(per.values(), default=0) <= rate.limit


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_waiters_are_admitted_in_the_order_they_asked(algorithm: Algorithm) -> None:
    """Three callers who find the bucket empty each reserve the next room: the first to
    ask is the first admitted, and none is admitted before the rate has room for it."""
    clock = FrozenClock(1_700_000_000.0)
    storage = MemoryStorage(clock)
    rate = parse_rate("2/second")
    check = Check("k", algorithm, rate, 1, wait_us=5_000_000)
    assert storage.decide([Check("k", algorithm, rate, 2)]).allowed  # empties it
    times = []
    for _ in range(3):
        clock.now_us += 10_000
        verdict = storage.decide([check])
        assert verdict.allowed, verdict
        wait = verdict.outcomes[0].retry_after_us
        assert wait > 0  # no room now: each had to wait
        times.append(verdict.now_us + wait)
    assert times == sorted(times)
    plain = storage.decide([Check("k", algorithm, rate, 1)])
    assert not plain.allowed  # a caller who may not wait does not jump the queue
    assert plain.outcomes[0].retry_after_us > 0
