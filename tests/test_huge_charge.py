"""Charges far past a limit (``quota.charge(10**14)``): the debt is kept, bounded, and
memory and Redis agree on it.

Lua's numbers are doubles and its ``%d`` formatting wraps past 2^63, so an unbounded
debt (``units x interval``) once came back from Redis as a negative time: the debt was
forgiven. A charge now leaves at most ``MAX_DEBT_US`` of debt on a token bucket and
``MAX_LIMIT`` units past the limit on a counter; a log keeps at most ``limit + 1``
entries (more would change no decision). See ``algorithms.bound_debt``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from flask import Flask
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from flask_quota import Quota
from flask_quota.core.algorithms import MAX_DEBT_US, MAX_LOG_LIMIT, Algorithm
from flask_quota.core.rates import MAX_LIMIT, MAX_WINDOW, Rate, parse_rate
from flask_quota.storage import Check, MemoryStorage, Storage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

S = 1_000_000
HUGE = 10**14
# The longest wait a charge can cause: the debt, plus a full bucket's refill or two windows.
LONGEST_WAIT_US = MAX_DEBT_US + 2 * MAX_WINDOW * S


def fits(algorithm: Algorithm, rate: Rate) -> bool:
    return algorithm is not Algorithm.SLIDING_WINDOW_LOG or rate.limit <= MAX_LOG_LIMIT


def chat_app(app: Flask, storage: Storage, units: int = HUGE) -> Flask:
    """A view that charges ``units`` on a 100/minute token bucket after each response."""
    app.config.update(QUOTA_PLANS={"free": {"user": "1000/minute"}})
    quota = Quota(app, storage=storage)

    @app.post("/chat")
    @quota.limit("100/minute", resource="ai_tokens")
    def chat() -> str:
        quota.charge(units)
        return "reply"

    return app


@pytest.fixture(params=["memory", "redis"])
def server_clock_storage(request: pytest.FixtureRequest) -> Iterator[Storage]:
    """Each backend on its own clock: the wall clock, or the Redis server's TIME."""
    if request.param == "memory":
        yield MemoryStorage()
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    client.flushall()
    yield RedisStorage(client)


def test_a_huge_charge_keeps_the_debt_with_a_sane_retry_after(
    app: Flask, server_clock_storage: Storage
) -> None:
    """quota.charge(10**14) on a 100/minute bucket: the next request is denied (the debt
    is not forgiven) with a whole-second Retry-After of about 366 days, not millions of
    years; the charging response's reset says the same; on Redis the stored time is a
    positive integer with a TTL of the same order."""
    http = chat_app(app, server_clock_storage).test_client()
    charged = http.post("/chat")
    assert charged.status_code == 200
    # The charging response's own headers show the bounded debt, not 1.9 million years.
    assert int(charged.headers["X-RateLimit-Reset"]) <= time.time() + MAX_DEBT_US // S + 61
    denied = http.post("/chat")
    assert denied.status_code == 429
    retry = int(denied.headers["Retry-After"])
    assert MAX_DEBT_US // S <= retry <= MAX_DEBT_US // S + 61
    assert denied.get_json()["retry_after"] == retry
    if isinstance(server_clock_storage, RedisStorage):
        client = server_clock_storage.client
        names = [k.decode() if isinstance(k, bytes) else str(k) for k in client.keys("*")]
        (key,) = [k for k in names if k.endswith(":tb") and "ai_tokens" in k]
        # A debt is stored as "tat:written" (core.algorithms.bucket_state).
        stored = client.get(key) or b"0:0"
        text = stored.decode() if isinstance(stored, bytes) else stored
        tat, written = (int(part) for part in text.split(":"))
        assert tat - written > MAX_DEBT_US and written > 0
        assert 0 < client.pttl(key) <= (MAX_DEBT_US + 60 * S) // 1000


def test_memory_and_redis_answer_a_huge_charge_alike(
    tmp_path: object, redis_client: redis.Redis
) -> None:
    """On one frozen clock, both backends answer the request after quota.charge(10**14)
    with the same 429: same Retry-After, same body."""
    redis_client.flushall()
    answers = []
    for name in ("memory", "redis"):
        clock = FrozenClock()
        storage: Storage = (
            MemoryStorage(clock) if name == "memory" else RedisStorage(redis_client, clock=clock)
        )
        app = Flask(name, instance_path=f"{tmp_path}/{name}")
        http = chat_app(app, storage).test_client()
        first = http.post("/chat")
        clock.advance(1)
        second = http.post("/chat")
        answers.append((first.status_code, second.status_code, second.headers["Retry-After"],
                        second.get_json()))  # fmt: skip
    assert answers[0][:2] == (200, 429)
    assert answers[0] == answers[1]


# -- the storage layer: every algorithm, charge.lua and decide.lua ---------------------

# Each unit worth a second or more: Redis expires keys on its own clock, which the frozen
# clock of these tests does not move, so a shorter TTL could lapse mid-test on Redis only.
RATES = ["5/minute", "2/minute; burst=6", "1000/hour", "7/10 seconds", "1/366 days",
         "1000000/366 days"]  # fmt: skip
huge = st.one_of(
    st.sampled_from([HUGE, 2**53 - 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 + 7, 291_000, 10**30]),
    st.integers(min_value=0, max_value=10**40),
)
steps = st.lists(
    st.tuples(
        st.sampled_from(["decide", "charge", "peek"]),
        st.sampled_from([0, 1, 999, 1_000_000, 61_000_000, 3600 * S]),
        st.one_of(st.integers(min_value=0, max_value=3), huge),
    ),
    min_size=1,
    max_size=12,
)


@pytest.fixture
def remote(redis_client: redis.Redis) -> Iterator[tuple[RedisStorage, FrozenClock]]:
    """One Redis storage on a frozen clock for all of a test's examples (each storage
    holds connections of its own)."""
    clock = FrozenClock()
    yield RedisStorage(redis_client, clock=clock), clock


@pytest.mark.redis
@pytest.mark.parametrize("algorithm", list(Algorithm))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rate_text=st.sampled_from(RATES), timeline=steps)
def test_huge_charges_and_costs_agree_and_stay_bounded(
    redis_client: redis.Redis,
    remote: tuple[RedisStorage, FrozenClock],
    algorithm: Algorithm,
    rate_text: str,
    timeline: list[tuple[str, int, int]],
) -> None:
    """Charges and costs up to 10^40 (past 2^53 and 2^63), mixed with decisions and peeks:
    the Python algorithm and the Lua script answer identically at every step, and no
    answer ever waits longer than the bounded debt allows."""
    redis_client.flushall()
    backend, clock = remote
    clock.now_us = 1_700_000_123_456_789
    memory = MemoryStorage(clock)
    rate = parse_rate(rate_text)
    assume(fits(algorithm, rate))  # a log of 10^12 entries is refused when configured
    for action, delta_us, cost in timeline:
        clock.now_us += delta_us
        checks = [Check("k", algorithm, rate, cost)]
        if action == "charge":
            memory.charge(checks)
            backend.charge(checks)
            checks = [Check("k", algorithm, rate, 1)]
        if action == "decide":
            mine, theirs = memory.decide(checks), backend.decide(checks)
        else:
            mine, theirs = memory.peek(checks), backend.peek(checks)
        assert mine == theirs
        outcome = mine.outcomes[0]
        assert 0 <= outcome.retry_after_us <= LONGEST_WAIT_US
        assert outcome.reset_us <= clock.now_us + LONGEST_WAIT_US
        assert outcome.remaining >= -(MAX_LIMIT + MAX_DEBT_US)
    if algorithm is Algorithm.SLIDING_WINDOW_LOG:
        assert redis_client.llen("k") <= rate.limit + 1  # what cost can push is bounded
