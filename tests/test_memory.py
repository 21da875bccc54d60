"""The memory backend: exact under threads, bounded by expiry."""

from __future__ import annotations

import threading

import pytest

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check, MemoryStorage
from flask_quota.testing import FrozenClock


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_exact_under_many_threads(algorithm: Algorithm) -> None:
    """32 threads racing on one key admit exactly the limit, across two tiers."""
    storage = MemoryStorage(FrozenClock())
    user, endpoint = parse_rate("500/hour"), parse_rate("300/hour")
    admitted: list[int] = []
    start = threading.Barrier(32)

    def worker() -> None:
        start.wait()
        count = 0
        for _ in range(40):
            checks = [Check("u", algorithm, user, 1), Check("e", algorithm, endpoint, 1)]
            count += storage.decide(checks).allowed
        admitted.append(count)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 300
    # All-or-nothing: the user tier was charged only for admitted requests.
    assert storage.peek([Check("u", algorithm, user, 0)]).outcomes[0].remaining == 200


def test_idle_keys_expire_and_the_store_shrinks() -> None:
    """200k identities tracked, the clock moves past their TTL, the store empties."""
    clock = FrozenClock()
    storage = MemoryStorage(clock)
    rate = parse_rate("10/minute")
    for i in range(200_000):
        storage.decide([Check(f"id{i}", Algorithm.TOKEN_BUCKET, rate, 1)])
    assert len(storage) == 200_000
    clock.advance(5)  # a token is 6 s: nothing has expired yet
    storage.sweep()
    assert len(storage) == 200_000
    clock.advance(2)
    storage.decide([Check("fresh", Algorithm.TOKEN_BUCKET, rate, 1)])
    assert len(storage) == 1
    assert storage._slots.keys() == {next(iter(storage._slots))}  # one slot left, for "fresh"


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_state_expires_when_it_stops_mattering(algorithm: Algorithm) -> None:
    """Every algorithm gives its state a TTL: an idle key is dropped, not kept forever."""
    clock = FrozenClock(1_699_999_200.0)
    storage = MemoryStorage(clock)
    storage.decide([Check("k", algorithm, parse_rate("5/minute"), 1)])
    assert len(storage) == 1
    clock.advance(121)
    storage.sweep()
    assert len(storage) == 0


def test_clear_forgets_state() -> None:
    """clear() resets a key to a full bucket."""
    storage = MemoryStorage(FrozenClock())
    rate = parse_rate("1/hour")
    storage.decide([Check("k", Algorithm.TOKEN_BUCKET, rate, 1)])
    assert not storage.decide([Check("k", Algorithm.TOKEN_BUCKET, rate, 1)]).allowed
    storage.clear(["k"])
    assert storage.decide([Check("k", Algorithm.TOKEN_BUCKET, rate, 1)]).allowed
