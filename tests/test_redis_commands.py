"""What one decision asks of redis-server: its commands, counted by ``INFO commandstats``
(commands a script or function runs are counted there too)."""

from __future__ import annotations

import pytest
import redis

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.policy import gate_check
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check, StorageError
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

pytestmark = pytest.mark.also_valkey

STRING_STATES = [
    Algorithm.TOKEN_BUCKET,
    Algorithm.FIXED_WINDOW,
    Algorithm.SLIDING_WINDOW_COUNTER,
]


def calls(client: redis.Redis) -> dict[str, int]:
    """Calls of each command since the last ``CONFIG RESETSTAT``, by lower-case name."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def request_checks(algorithm: Algorithm, cost: int = 1) -> list[Check]:
    """A request's gate and three tiers."""
    rate = parse_rate("100/minute")
    gate = gate_check(KeyBuilder("t"), "id=u")
    return [gate, *(Check(f"t:{tier}", algorithm, rate, cost) for tier in ("g", "u", "e"))]


@pytest.mark.parametrize("algorithm", STRING_STATES)
def test_one_mget_reads_the_gate_and_every_state(
    redis_client: redis.Redis, algorithm: Algorithm
) -> None:
    """The gate and three tiers are read in one MGET: no PTTL, no GET."""
    storage = RedisStorage(redis_client, clock=FrozenClock())
    checks = request_checks(algorithm)
    storage.decide(checks)  # the states exist: the second decision reads them
    redis_client.config_resetstat()
    assert storage.decide(checks).allowed
    used = calls(redis_client)
    assert used.get("mget") == 1
    assert "pttl" not in used and "get" not in used
    assert used.get("set") == 3  # the three tiers' new states; the gate writes nothing


def test_a_blocked_caller_still_gets_the_rest_of_the_block(redis_client: redis.Redis) -> None:
    """Only a block that is there costs a PTTL, and the denial says how long it lasts."""
    storage = RedisStorage(redis_client, clock=FrozenClock())
    checks = request_checks(Algorithm.TOKEN_BUCKET)
    storage.block(checks[0].key, 30, "abuse")
    redis_client.config_resetstat()
    verdict = storage.decide(checks)
    assert not verdict.allowed
    assert 29_000_000 < verdict.outcomes[0].retry_after_us <= 30_000_000
    assert calls(redis_client).get("pttl") == 1
    assert storage.block_info(checks[0].key) == "abuse"  # the block's value is unchanged


@pytest.mark.parametrize("algorithm", STRING_STATES)
def test_a_decision_that_changes_nothing_writes_nothing(
    redis_client: redis.Redis, algorithm: Algorithm
) -> None:
    """A cost of 0 leaves every state as it was: no SET, no DEL (only what changed is written)."""
    storage = RedisStorage(redis_client, clock=FrozenClock())
    storage.decide(request_checks(algorithm))
    before = {key: redis_client.get(key) for key in redis_client.keys("*")}
    redis_client.config_resetstat()
    assert storage.decide(request_checks(algorithm, cost=0)).allowed  # states there
    redis_client.flushall()
    assert storage.decide(request_checks(algorithm, cost=0)).allowed  # no state at all
    used = calls(redis_client)
    assert "set" not in used and "del" not in used
    assert redis_client.keys("*") == []
    assert before  # the first decision did store states (so there was something to keep)


@pytest.mark.parametrize("algorithm", STRING_STATES)
def test_a_key_of_another_type_fails_and_is_left_alone(
    redis_client: redis.Redis, algorithm: Algorithm
) -> None:
    """MGET reads a list as nil, like a missing key; the decision still fails as a GET
    did, and nothing is written over the foreign key or the request's other keys."""
    storage = RedisStorage(redis_client, clock=FrozenClock())
    checks = request_checks(algorithm)
    storage.decide([checks[3]])  # a state that exists: written without NX
    redis_client.rpush(checks[2].key, "x")
    before = redis_client.get(checks[3].key)
    with pytest.raises(StorageError, match="WRONGTYPE"):
        storage.decide(checks)
    assert redis_client.lrange(checks[2].key, 0, -1) == [b"x"]
    assert redis_client.get(checks[3].key) == before
    assert sorted(redis_client.keys("*")) == sorted(c.key.encode() for c in checks[2:])


def test_a_decision_is_one_fcall_and_survives_a_function_flush(
    redis_client: redis.Redis,
) -> None:
    """Where the server has functions, a decision is an FCALL of the library loaded
    once; a server that lost it (a restart, FUNCTION FLUSH) gets it again, and the
    decision is answered as before."""
    storage = RedisStorage(redis_client, clock=FrozenClock())
    checks = request_checks(Algorithm.TOKEN_BUCKET)
    storage.decide(checks)
    redis_client.config_resetstat()
    assert storage.decide(checks).outcomes[1].remaining == 98
    assert calls(redis_client).keys() & {"fcall", "evalsha", "function|load"} == {"fcall"}
    redis_client.function_flush()
    redis_client.config_resetstat()
    assert storage.decide(checks).outcomes[1].remaining == 97
    used = calls(redis_client)
    assert (used.get("fcall"), used.get("function|load"), used.get("evalsha")) == (2, 1, None)
    redis_client.config_resetstat()
    storage.decide(checks)
    assert calls(redis_client).get("fcall") == 1 and "function|load" not in calls(redis_client)


def test_a_server_that_refuses_functions_runs_the_script(redis_client: redis.Redis) -> None:
    """An ACL without FUNCTION and FCALL (as a Redis 6 or a proxy without them): the
    storage falls back to EVALSHA, once, and decides the same."""
    redis_client.function_flush()  # FLUSHALL keeps functions: none from other tests
    redis_client.acl_setuser(
        "nofunctions", enabled=True, nopass=True, keys=["*"], channels=["*"],
        categories=["+@all"], commands=["-function", "-fcall", "-fcall_ro"],
    )  # fmt: skip
    port = redis_client.connection_pool.connection_kwargs["port"]
    limited = redis.Redis(port=port, username="nofunctions")
    try:
        storage = RedisStorage(limited, clock=FrozenClock())
        checks = request_checks(Algorithm.TOKEN_BUCKET)
        assert storage.decide(checks).outcomes[1].remaining == 99  # FCALL refused, EVALSHA
        redis_client.config_resetstat()
        assert storage.decide(checks).outcomes[1].remaining == 98
        used = calls(redis_client)
        assert used.get("evalsha") == 1 and "fcall" not in used  # not asked again
        assert redis_client.function_list() == []
        storage.close()
    finally:
        limited.close()
        redis_client.acl_deluser("nofunctions")
