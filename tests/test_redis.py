"""The Redis backend against a real redis-server: one call (FCALL or EVALSHA), TTLs."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from flask import Flask, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_quota import Identity, Quota
from flask_quota.core.algorithms import Algorithm, Gate
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check, MemoryStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock
from tests.redis_probes import CountingConnection, counting_client
from tests.servers import RedisServer

pytestmark = pytest.mark.also_valkey  # each test with a server runs on Redis and on Valkey


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_every_key_has_a_ttl(redis_client: redis.Redis, algorithm: Algorithm) -> None:
    """No key lives forever: each algorithm's state carries a PTTL. (On a frozen clock:
    on Redis time a fixed window decided in a second's last millisecond is rightly gone
    before it is looked at.)"""
    storage = RedisStorage(redis_client, clock=FrozenClock())
    rates = ["5/second", "100/minute", "10/second; burst=50", "1000/day"]
    storage.decide([Check(f"k{i}", algorithm, parse_rate(r), 1) for i, r in enumerate(rates)])
    keys = redis_client.keys("*")
    assert len(keys) == len(rates)
    for key in keys:
        assert redis_client.pttl(key) > 0


def test_script_uses_the_redis_server_clock(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision's time is Redis TIME even when the web server's clock is wrong."""
    storage = RedisStorage(redis_client)
    monkeypatch.setattr(time, "time", lambda: 946_684_800.0)  # web server thinks it is 2000
    monkeypatch.setattr(time, "time_ns", lambda: 946_684_800 * 10**9)
    verdict = storage.decide([Check("k", Algorithm.TOKEN_BUCKET, parse_rate("1/second"), 1)])
    monkeypatch.undo()
    seconds, micros = redis_client.time()
    assert abs(verdict.now_us - (seconds * 1_000_000 + micros)) < 2_000_000


def test_reloads_the_script_after_script_flush(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """NOSCRIPT (e.g. after a Redis restart) reloads the script transparently."""
    client = counting_client(redis_server)
    storage = RedisStorage(client)
    check = Check("k", Algorithm.TOKEN_BUCKET, parse_rate("5/minute"), 1)
    storage.decide([check])
    client.script_flush()
    assert storage.decide([check]).outcomes[0].remaining == 3
    before = CountingConnection.sent
    storage.decide([check])
    assert CountingConnection.sent - before == 1  # back to a single call


def test_three_tiers_cost_one_round_trip(redis_server: RedisServer, tmp_path: Any) -> None:
    """A request checked against global, user and endpoint tiers costs exactly one
    round trip to Redis, allowed or denied, for every algorithm."""
    client = counting_client(redis_server)
    for algorithm in Algorithm:
        client.flushall()
        app = Flask(__name__, instance_path=str(tmp_path / algorithm.value))
        app.config.update(
            QUOTA_ALGORITHM=algorithm.value,
            QUOTA_PLANS={
                "free": {
                    "global": "50/second",
                    "user": "100/minute",
                    "resources": {"ai": "2/minute"},
                }
            },
        )
        # A frozen clock: on Redis time a minute could turn between the requests and
        # refill the fixed window. The clock travels in the call: no round trip more.
        quota = Quota(app, storage=RedisStorage(client, clock=FrozenClock()))

        @app.post("/infer")
        @quota.limit(resource="ai")
        def infer() -> str:
            return "ok"

        http = app.test_client()
        http.post("/infer")  # warm the connection and the script cache
        statuses = []
        for _ in range(3):
            before = CountingConnection.sent
            statuses.append(http.post("/infer").status_code)
            assert CountingConnection.sent - before == 1, algorithm
        assert statuses == [200, 429, 429], algorithm


def test_a_tenant_tier_costs_no_round_trip_more(redis_server: RedisServer, tmp_path: Any) -> None:
    """With the tenant tier and a calendar quota in play (global, tenant, user and a
    N/month endpoint tier), a request still costs exactly one round trip, allowed or
    denied, and the tenant denies."""
    client = counting_client(redis_server)
    client.flushall()
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config.update(
        QUOTA_PLANS={
            "free": {
                "global": "50/second",
                "tenant": "3/minute",
                "user": "100/minute",
                "resources": {"ai": "1000/month"},
            }
        },
        QUOTA_TIMEZONE="Europe/Berlin",
    )
    quota = Quota(app, storage=RedisStorage(client, clock=FrozenClock()))

    @quota.identity_loader
    def member() -> Identity:
        return Identity(request.headers["X-Client"], tenant="acme")

    @app.post("/infer")
    @quota.limit(resource="ai")
    def infer() -> str:
        return "ok"

    http = app.test_client()
    http.post("/infer", headers={"X-Client": "warm"})  # the connection and script cache
    statuses = []
    for who in ("alice", "bob", "carol"):
        before = CountingConnection.sent
        response = http.post("/infer", headers={"X-Client": who})
        statuses.append(response.status_code)
        assert CountingConnection.sent - before == 1, who
    assert statuses == [200, 200, 429]
    assert response.get_json()["tier"] == "tenant"
    policy = http.post("/infer", headers={"X-Client": "dave"}).headers["RateLimit-Policy"]
    assert '"ai";q=1000;w=2678400' in policy  # the calendar month was one of the checks


def test_client_input_cannot_choose_the_cluster_slot() -> None:
    """Braces in an identity are escaped: the hash tag is always the whole escaped id."""
    from redis.crc import key_slot

    from flask_quota.core.keys import KeyBuilder

    keys = KeyBuilder("quota")
    hostile = keys.identity_tag("}{victim}")
    key = keys.user_key(hostile, Algorithm.TOKEN_BUCKET)
    assert key.count("{") == 1 and key.count("}") == 1
    assert key_slot(key.encode()) == key_slot(b"{" + hostile.encode() + b"}")
    victim = keys.user_key(keys.identity_tag("victim"), Algorithm.TOKEN_BUCKET)
    assert key_slot(key.encode()) != key_slot(victim.encode()) or key != victim
    endpoint = keys.endpoint_key(hostile, "GET", "x:y", Algorithm.TOKEN_BUCKET)
    assert endpoint.split("}")[0] == key.split("}")[0]  # same slot as the user tier


# -- memory and Redis agree decision for decision ---------------------------------

RATES = [
    "3/second", "5/minute", "2/second; burst=6", "7/10 seconds", "1/hour",
    # The caps of rates.py (a token unit of seconds or more: Redis expires keys on its
    # own clock, which the frozen clock of this test does not move).
    "1000000/366 days", "1/second; burst=31622400",
]  # fmt: skip
steps = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 999, 50_000, 333_333, 1_000_000, 4_000_000, 61_000_000]),
        st.one_of(st.integers(min_value=0, max_value=4), st.just(10**20)),  # 10^20 never fits
        st.integers(min_value=0, max_value=2),  # which pair of keys
    ),
    min_size=1,
    max_size=60,
)


@pytest.mark.parametrize("algorithm", list(Algorithm))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rate_text=st.sampled_from(RATES), timeline=steps)
def test_memory_and_redis_agree(
    redis_client: redis.Redis,
    algorithm: Algorithm,
    rate_text: str,
    timeline: list[tuple[int, int, int]],
) -> None:
    """Random timings and costs: both backends return identical verdicts, step by step."""
    redis_client.flushall()
    clock = FrozenClock(1_700_000_123.456789)
    memory, remote = MemoryStorage(clock), RedisStorage(redis_client, clock=clock)
    rate, other = parse_rate(rate_text), parse_rate("4/second")
    for delta_us, cost, pair in timeline:
        clock.now_us += delta_us
        checks = [
            Check(f"a{pair}", algorithm, rate, cost),
            Check(f"b{pair % 2}", algorithm, other, 1),
        ]
        assert memory.decide(checks) == remote.decide(checks)


# -- the decide script's short reply reads as the long one ----------------------------

tiers = st.lists(
    st.tuples(
        st.sampled_from(["2/minute", "1/second; burst=3", "3/hour"]),
        st.sampled_from(list(Algorithm)),
        st.integers(min_value=0, max_value=3),  # cost
        st.booleans(),  # shadow
        st.sampled_from([0, 0, 1_500_000]),  # how long the caller may wait (a reservation)
    ),
    max_size=4,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(gated=st.booleans(), blocked=st.booleans(), plan=tiers, rounds=st.integers(1, 5))
def test_the_short_reply_reads_as_the_long_one(
    redis_client: redis.Redis,
    gated: bool,
    blocked: bool,
    plan: list[tuple[str, Algorithm, int, bool, int]],
    rounds: int,
) -> None:
    """Redis answers a request whose checks all allowed with a short reply (no allowed
    flags or retries, a first gate letting by left out), which ``Reply.read`` makes long:
    flat reply for flat reply, memory's long one, whichever check denies first (a
    blocked gate, a tier, a shadow tier) or reserves (its wait is told, so the reply is
    long), and however many checks there are."""
    redis_client.flushall()
    clock = FrozenClock(1_700_000_123.456789)
    memory, remote = MemoryStorage(clock), RedisStorage(redis_client, clock=clock)
    checks = [Check("gate", Gate.BLOCK, parse_rate("1/second"), 0)] if gated else []
    checks += [
        Check(f"t{i}", algorithm, parse_rate(rate), cost, shadow, wait_us=wait)
        for i, (rate, algorithm, cost, shadow, wait) in enumerate(plan)
    ]
    if blocked:
        memory.block("gate", 60, "test")
        remote.block("gate", 60, "test")
    keys = [c.key for c in checks]
    for _ in range(rounds):
        ours, theirs = remote.decide_flat(checks, keys), memory.decide_flat(checks, keys)
        if gated and blocked:  # Redis's block lives on its own clock: its times differ
            assert ours[2:4] == theirs[2:4] == [0, 0]
            ours[4:6] = theirs[4:6]
        assert list(ours) == list(theirs)
        clock.now_us += 200_000
