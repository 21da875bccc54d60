"""The backends' per-shape caches are bounded, and keep what is in use: a request shape
seen on every request stays encoded however many others come and go."""

from __future__ import annotations

import redis

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check, MemoryStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

RATE = parse_rate("5/minute")
OTHERS = 10_000  # more than any bound the caches had or have


def shapes(n: int) -> list[tuple[Check, ...]]:
    """``n`` distinct request shapes, held so that no id is reused."""
    return [(Check(f"k{i}", Algorithm.FIXED_WINDOW, RATE, 1),) for i in range(n)]


def test_memory_keeps_a_hot_shape_among_many_others() -> None:
    """The step lookup of a shape in use is made once, not again after every 4,096 others,
    and the cache never holds more than its bound."""
    storage = MemoryStorage(FrozenClock())
    hot = (Check("hot", Algorithm.TOKEN_BUCKET, RATE, 1),)
    storage.decide_flat(hot, ["hot"])
    first = storage._shapes.current[id(hot)][1]
    for other in shapes(OTHERS):
        storage.decide_flat(other, ["k"])
        storage.decide_flat(hot, ["hot"])
    cached = storage._shapes
    assert (cached.current.get(id(hot)) or cached.retired[id(hot)])[1] is first
    assert len(cached.current) + len(cached.retired) <= 2 * cached.size


def test_redis_keeps_a_hot_shape_and_its_arguments_encoded() -> None:
    """The EVALSHA packer encodes a shape in use, and a check's arguments, once; both
    caches stay bounded. (Packing needs no server.)"""
    storage = RedisStorage(redis.Redis(port=1))
    call = storage._decide
    hot = (Check("hot", Algorithm.TOKEN_BUCKET, RATE, 1),)
    packed = call.pack("decide", b"", hot)
    first = call._shapes.current[id(hot)][1]
    costs = [Check("c", Algorithm.FIXED_WINDOW, RATE, cost) for cost in range(OTHERS)]
    for other, by_cost in zip(shapes(OTHERS), costs, strict=True):
        call.pack("decide", b"", other)
        call.pack("decide", b"", [by_cost])  # a list: a per-request shape, costs vary
        assert call.pack("decide", b"", hot) == packed
    for cached in (call._shapes, call._args):
        assert len(cached.current) + len(cached.retired) <= 2 * cached.size
    found = call._shapes.current.get(id(hot)) or call._shapes.retired[id(hot)]
    assert found[1] is first
    storage.close()
