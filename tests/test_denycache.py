"""The local deny cache: denials answered in-process until their retry time, never an
admission Redis would refuse, and a flood from one key kept off Redis."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from flask import Flask
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_quota import Quota
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.rates import parse_rate
from flask_quota.settings import Settings
from flask_quota.state import get_state
from flask_quota.storage import Check, MemoryStorage, Verdict
from flask_quota.storage.denycache import DenyCache
from flask_quota.testing import FrozenClock
from tests.load import hammer, serve_many
from tests.servers import RedisServer


class Counting:
    """A real ``MemoryStorage`` that counts the decisions it is asked for."""

    def __init__(self, clock: FrozenClock) -> None:
        self.inner = MemoryStorage(clock)
        self.name = "counting"
        self.calls = 0

    def decide(self, checks: Sequence[Check]) -> Verdict:
        self.calls += 1
        return self.inner.decide(checks)

    def peek(self, checks: Sequence[Check]) -> Verdict:
        return self.inner.peek(checks)

    def clear(self, keys: Sequence[str]) -> None:
        self.inner.clear(keys)

    def ping(self) -> float:
        return 0.0

    def close(self) -> None:
        self.inner.close()


def cached(clock: FrozenClock) -> tuple[DenyCache, Counting]:
    inner = Counting(clock)
    return DenyCache(inner, clock=lambda: clock.seconds), inner


def check(key: str = "k", rate: str = "2/minute", cost: int = 1, algorithm: str = "tb") -> Check:
    return Check(key, Algorithm(_ALGOS[algorithm]), parse_rate(rate), cost)


_ALGOS = {a.code: a.value for a in Algorithm}


def test_a_denial_is_answered_locally_until_its_retry_time() -> None:
    """After one denial, requests for the key never reach the storage until retry-after."""
    clock = FrozenClock()
    cache, inner = cached(clock)
    assert [cache.decide([check()]).allowed for _ in range(3)] == [True, True, False]
    assert inner.calls == 3
    retries = []
    for _ in range(29):
        clock.advance(1)
        verdict = cache.decide([check()])
        assert not verdict.allowed
        retries.append(verdict.outcomes[0].retry_after_us)
    assert inner.calls == 3  # 29 denials, no storage call
    assert retries == sorted(retries, reverse=True) and retries[-1] == 1_000_000
    clock.advance(1)  # 30 s: one token is back
    assert cache.decide([check()]).allowed
    assert inner.calls == 4


def test_a_denial_covers_larger_costs_only() -> None:
    """A denial for cost 2 answers cost 3 locally; cost 1 still asks the storage."""
    clock = FrozenClock()
    cache, inner = cached(clock)
    assert cache.decide([check(rate="3/minute", cost=2)]).allowed
    assert not cache.decide([check(rate="3/minute", cost=2)]).allowed
    calls = inner.calls
    assert not cache.decide([check(rate="3/minute", cost=3)]).allowed
    assert inner.calls == calls
    assert cache.decide([check(rate="3/minute", cost=1)]).allowed
    assert inner.calls == calls + 1


def test_a_quota_change_is_never_answered_from_a_stale_denial() -> None:
    """A new rate for the key, or ``clear()``, sends the next request to the storage."""
    clock = FrozenClock()
    cache, inner = cached(clock)
    for _ in range(3):
        cache.decide([check(rate="2/minute", algorithm="fw")])
    assert cache.decide([check(rate="5/minute", algorithm="fw")]).allowed  # the plan grew
    assert inner.calls == 4
    assert not cache.decide([check(rate="2/minute", algorithm="fw")]).allowed
    calls = inner.calls
    cache.clear()
    assert len(cache) == 0
    cache.decide([check(rate="2/minute", algorithm="fw")])
    assert inner.calls == calls + 1


def test_a_cached_denial_names_the_tier_and_keeps_the_others() -> None:
    """The answer from the cache has the denying tier's numbers and the other tiers'
    last known ones; the other tiers are charged nothing."""
    clock = FrozenClock()
    cache, inner = cached(clock)
    glob, user = check("g", "100/minute"), check("u", "1/minute")
    first = cache.decide([glob, user])
    denied = cache.decide([glob, user])
    assert first.allowed and not denied.allowed and inner.calls == 2
    again = cache.decide([glob, user])
    assert inner.calls == 2
    assert [o.allowed for o in again.outcomes] == [True, False]
    assert again.outcomes[0].remaining == denied.outcomes[0].remaining
    assert inner.inner.peek([glob]).outcomes[0].remaining == 98  # only the first request


def test_the_cache_is_bounded() -> None:
    """A flood of distinct denied keys cannot grow the cache past ``max_keys``."""
    clock = FrozenClock()
    cache = DenyCache(MemoryStorage(clock), clock=lambda: clock.seconds, max_keys=100)
    for i in range(1000):
        cache.decide([check(f"k{i}", "1/hour", cost=2)])  # cost above the limit: denied
    assert 0 < len(cache) <= 100


STEP = st.tuples(
    st.sampled_from([0, 1, 7_000, 250_000, 1_000_000, 3_000_000, 31_000_000]),
    st.integers(min_value=0, max_value=3),  # cost of the first tier
    st.sampled_from(["a", "b"]),  # which caller
)


@pytest.mark.parametrize("algorithm", ["tb", "fw", "swl", "swc"])
@settings(max_examples=60, deadline=None)
@given(rate=st.sampled_from(["2/second", "3/minute", "2/second; burst=5", "4/10 seconds"]),
       steps=st.lists(STEP, min_size=1, max_size=80))  # fmt: skip
def test_the_cache_decides_exactly_as_the_storage(
    algorithm: str, rate: str, steps: list[tuple[int, int, str]]
) -> None:
    """Same requests, same times: with and without the cache every request gets the same
    answer, and every tier the cache calls denied is denied by the storage too (the cache
    neither admits nor refuses anything extra; it may not know every other tier's state)."""
    clock = FrozenClock(1_700_000_000.5)
    plain = MemoryStorage(clock)
    cache = DenyCache(MemoryStorage(clock), clock=lambda: clock.seconds)
    for delta, cost, who in steps:
        clock.now_us += delta
        checks = [check(f"e:{who}", rate, cost, algorithm), check("g", "5/second", 1, algorithm)]
        want, got = plain.decide(checks), cache.decide(checks)
        assert got.allowed == want.allowed
        for mine, truth in zip(got.outcomes, want.outcomes, strict=True):
            assert mine.allowed or not truth.allowed


def test_the_wiring_follows_quota_deny_cache(app: Flask, redis_server: RedisServer) -> None:
    """Redis backends get the cache by default; ``QUOTA_DENY_CACHE=false`` and memory:// don't."""
    app.config.update(
        QUOTA_STORAGE_URL=redis_server.url,
        QUOTA_DATABASE_URL=f"sqlite:///{app.instance_path}/quota.sqlite3",
    )
    Quota(app)
    assert isinstance(get_state(app).storage, DenyCache)
    other = Flask(__name__, instance_path=app.instance_path)
    other.config.update(
        QUOTA_STORAGE_URL=redis_server.url,
        QUOTA_DENY_CACHE="false",
        QUOTA_DATABASE_URL=f"sqlite:///{app.instance_path}/quota.sqlite3",
    )
    Quota(other)
    assert not isinstance(get_state(other).storage, DenyCache)
    with pytest.raises(ValueError, match="QUOTA_DENY_CACHE"):
        Settings.from_config({"QUOTA_DENY_CACHE": "sometimes"})


def evalsha_calls(server: RedisServer) -> int:
    with server.client() as client:
        stats = client.info("commandstats")  # the decide call: a function or a script
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))


def total_commands(server: RedisServer) -> int:
    with server.client() as client:
        return int(client.info("stats")["total_commands_processed"])


@pytest.mark.redis
@pytest.mark.slow
def test_a_single_key_flood_stays_off_redis(own_redis: RedisServer, tmp_path: Path) -> None:
    """2000 requests from one caller through 4 gunicorn workers, 32 at a time: exactly 20
    pass either way, and Redis runs at least 10x fewer commands with the cache."""
    plans = {"p": {"global": "100000/second", "user": "20/hour"}}
    results = {}
    for enabled in ("false", "true"):
        with own_redis.client() as client:
            client.flushall()
        # A 2 s storage timeout: on a loaded machine the default 0.1 s lets a slow call
        # fail open, and an admission that was never counted is not this test's subject.
        server = serve_many(
            tmp_path / enabled, plans, QUOTA_STORAGE_URL=own_redis.url,
            QUOTA_DENY_CACHE=enabled, QUOTA_STORAGE_TIMEOUT="2",
        )  # fmt: skip
        try:
            hammer(server.port, [("/healthz", {}, "")] * 8)  # connections and scripts warm
            before, calls = total_commands(own_redis), evalsha_calls(own_redis)
            flood = [("/ping", {"X-Client": "flooder"}, "flooder")] * 2000
            statuses = Counter(r.status for r in hammer(server.port, flood, clients=32))
            commands = total_commands(own_redis) - before - 1  # minus our INFO
            results[enabled] = (statuses, commands, evalsha_calls(own_redis) - calls)
        finally:
            server.stop()
    for statuses, _, _ in results.values():
        assert statuses == Counter({200: 20, 429: 1980}), statuses
    without, with_cache = results["false"][1], results["true"][1]
    assert without >= 10 * with_cache, results
    print(f"deny cache: {without} Redis commands without, {with_cache} with ({results})")
