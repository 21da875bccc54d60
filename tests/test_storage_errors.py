"""One error wrapper: whatever a backend's client raises when it cannot answer surfaces
as ``StorageError``, from every public method of every backend and usage sink."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.rates import parse_rate
from flask_quota.recorder import usage_sink
from flask_quota.storage import Check, MemoryStorage, StorageError
from flask_quota.storage.cluster import ClusterStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.storage.redis_errors import REDIS_ERRORS
from flask_quota.storage.redis_usage import RedisUsageSink
from flask_quota.storage.sentinel import SentinelStorage
from flask_quota.storage.usage import MemoryUsageSink

DEAD = "127.0.0.1:1"  # nothing listens there: every connection is refused at once


def _public_methods(cls: type) -> list[tuple[str, Any]]:
    return [
        (name, value)
        for name, value in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    ]


@pytest.mark.parametrize(
    "cls", [RedisStorage, SentinelStorage, ClusterStorage, RedisUsageSink], ids=lambda c: c.__name__
)
def test_every_public_method_of_a_redis_backend_translates_redis_errors(cls: type) -> None:
    """Each public method (inherited ones too) goes through the one wrapper, declared
    once on the class with every error redis-py and the socket raise."""
    assert cls.storage_errors == REDIS_ERRORS  # type: ignore[attr-defined]
    methods = _public_methods(cls)
    assert methods
    for name, method in methods:
        assert getattr(method, "storage_errors", None) == REDIS_ERRORS, name


@pytest.mark.parametrize("cls", [MemoryStorage, MemoryUsageSink], ids=lambda c: c.__name__)
def test_in_process_backends_declare_no_client_errors(cls: type) -> None:
    """The memory backend and sink have no client: they declare so, and their methods
    stay unwrapped (nothing to translate on the request path)."""
    assert cls.storage_errors == ()  # type: ignore[attr-defined]
    assert all(not hasattr(m, "storage_errors") for _, m in _public_methods(cls))


def _calls(storage: Any) -> dict[str, Callable[[], object]]:
    check = Check("quota:{id=a}:u", Algorithm.FIXED_WINDOW, parse_rate("5/minute"), 1)
    return {
        "decide": lambda: storage.decide([check]),
        "peek": lambda: storage.peek([check]),
        "refund": lambda: storage.refund([check], 0),
        "charge": lambda: storage.charge([check]),
        "clear": lambda: storage.clear([check.key]),
        "block": lambda: storage.block("quota:block:{id=a}", 60, "{}"),
        "blocks": lambda: storage.blocks("quota:block:*"),
        "block_info": lambda: storage.block_info("quota:block:{id=a}"),
        "keys": lambda: storage.keys("quota:*"),
        "ping": storage.ping,
    }


def _escaped(calls: dict[str, Callable[[], object]], name: str) -> list[str]:
    """The calls that did not raise ``StorageError`` starting with ``name``, and what they did."""
    wrong = []
    for what, call in calls.items():
        try:
            call()
        except StorageError as exc:
            if not str(exc).startswith(f"{name}: "):
                wrong.append(f"{what}: {exc}")
        except Exception as exc:
            wrong.append(f"{what}: {type(exc).__name__}")
        else:
            wrong.append(f"{what}: no error")
    return wrong


@pytest.mark.parametrize("url", [f"redis://{DEAD}", f"redis+cluster://{DEAD}"])
def test_a_dead_redis_raises_storage_error_from_every_method(url: str) -> None:
    """Single node and cluster alike: no redis-py exception escapes a backend, not even
    the cluster client's ``RedisClusterException`` (which is no ``RedisError``)."""
    timeout = 0.2
    if url.startswith("redis+cluster"):
        storage: Any = ClusterStorage.from_url(url, timeout=timeout)
    else:
        storage = RedisStorage.from_url(url, timeout=timeout)
    try:
        assert _escaped(_calls(storage), storage.name) == []
    finally:
        storage.close()


@pytest.mark.parametrize("url", [f"redis://{DEAD}", f"redis+cluster://{DEAD}"])
def test_the_redis_usage_sink_raises_storage_error_when_redis_is_down(url: str) -> None:
    """The dashboard's usage reads fail as storage reads do, so it needs no redis import."""
    if url.startswith("redis+cluster"):
        storage: Any = ClusterStorage.from_url(url, timeout=0.2)
    else:
        storage = RedisStorage.from_url(url, timeout=0.2)
    sink = usage_sink(storage, "quota")
    assert isinstance(sink, RedisUsageSink)
    reads: dict[str, Callable[[], object]] = {
        "minutes": lambda: sink.minutes(5, 100),
        "identity_minutes": lambda: sink.identity_minutes("id=a", 5, 100),
        "plan_of": lambda: sink.plan_of(["id=a"], 100),
        "add": lambda: sink.add({(100, "id=a", "user", True): 1}, {}),
    }
    try:
        assert _escaped(reads, "redis usage") == []
    finally:
        storage.close()
