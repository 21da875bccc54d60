"""Measurement 4: memory per tracked key, in Redis and in the memory backend.

Redis: each app (three tiers) serves one request to each of ``callers`` distinct
callers through WSGI; then every key it created is measured with
``MEMORY USAGE key SAMPLES 0`` (key, value, TTL and object overhead as Redis
reports them) and, as a cross-check, ``INFO memory`` ``used_memory`` growth
divided by the number of keys (includes the keyspace and expiry tables).

Memory backend: run in child processes (``python -m bench.footprint``) so the
numbers are not mixed with the benchmark's own objects. ``tracemalloc`` counts
the Python heap used by ``keys`` tracked keys of a ``MemoryStorage`` driven with
a frozen test clock, then after the clock jumps past every key's expiry and the
storage sweeps; a second child without tracemalloc reports RSS the same way.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

import redis

from .apps import LIMITER_STRATEGY, QUOTA_ALGORITHMS, limiter_app, quota_app
from .driver import WsgiDriver, caller_sequence, repeat
from .env import ROOT

# Slow enough that no key expires during the run (a token bucket key lives only
# until its bucket is full again: 6 minutes after one request at 10/hour).
RATE = "10/hour"


@dataclass(frozen=True)
class RedisFootprint:
    library: str
    algorithm: str
    keys: int
    memory_usage: float  # mean MEMORY USAGE per key, bytes
    used_memory: float  # used_memory growth per key, bytes
    keys_per_caller: float


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def redis_footprint(redis_url: str, callers: int) -> list[RedisFootprint]:
    client = redis.Redis.from_url(redis_url)
    rows = []
    candidates: list[tuple[str, str, Any]] = [
        ("flask-quota", a, lambda a=a: quota_app(redis_url, a, rate=RATE)) for a in QUOTA_ALGORITHMS
    ]
    candidates += [
        ("Flask-Limiter", s, lambda s=s: limiter_app(redis_url, s, rate=RATE))
        for s in dict.fromkeys(LIMITER_STRATEGY.values())
    ]
    for library, algorithm, factory in candidates:
        client.flushall()
        app = factory()
        warm = WsgiDriver(app, [("192.0.2.1", "warmup")])  # loads the scripts
        warm()
        client.flushall()
        before = _used_memory(client)
        driver = WsgiDriver(app, caller_sequence(callers, callers))
        repeat(driver, callers)
        driver.expect("200")
        after = _used_memory(client)
        keys = list(client.scan_iter(match=app.config["BENCH_KEYS"], count=1000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        sizes = pipe.execute()
        rows.append(
            RedisFootprint(
                library,
                algorithm,
                len(keys),
                sum(sizes) / len(keys),
                (after - before) / len(keys),
                len(keys) / callers,
            )
        )
    client.flushall()
    client.close()
    return rows


@dataclass(frozen=True)
class ProcessFootprint:
    algorithm: str
    keys: int
    traced_per_key: float  # tracemalloc bytes per tracked key
    traced_after_expiry: int  # bytes still held after every key expired and was swept
    keys_after_expiry: int
    rss_per_key: float  # from a second child run without tracemalloc
    rss_after_expiry: int
    seconds: float  # filling time without tracemalloc
    gc_seconds: float  # one full gc.collect() with the keys held, without tracemalloc


def process_footprint(algorithm: str, keys: int) -> ProcessFootprint:
    """Two child interpreters: one counts with tracemalloc, one reads RSS only."""
    traced = _child(algorithm, keys, trace=True)
    plain = _child(algorithm, keys, trace=False)
    return ProcessFootprint(
        algorithm,
        traced["keys"],
        traced["per_key"],
        traced["after_expiry"],
        traced["keys_after_expiry"],
        plain["per_key"],
        plain["after_expiry"],
        plain["seconds"],
        plain["gc_seconds"],
    )


def _child(algorithm: str, keys: int, *, trace: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.footprint", "--algorithm", algorithm]
    command += ["--keys", str(keys), "--trace" if trace else "--rss"]
    out = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=600
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _inproc(algorithm: str, keys: int, trace: bool) -> dict[str, Any]:
    """Fill a MemoryStorage with ``keys`` keys, then expire them all; bytes used."""
    from flask_quota.core.algorithms import Algorithm
    from flask_quota.core.keys import KeyBuilder
    from flask_quota.core.rates import parse_rate
    from flask_quota.storage import Check, MemoryStorage

    now = [1_700_000_000_000_000]
    storage = MemoryStorage(clock=lambda: now[0])
    algo = Algorithm(algorithm)
    rate = parse_rate(RATE)
    builder = KeyBuilder("quota")
    gc.collect()
    if trace:
        tracemalloc.start()

    def used() -> int:
        return tracemalloc.get_traced_memory()[0] if trace else _rss()

    base = used()
    started = time.perf_counter()
    for i in range(keys // 3):
        ip = KeyBuilder.ip_tag(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}")
        user = KeyBuilder.identity_tag(f"user{i}")
        checks = [
            Check(builder.global_key(ip, algo), algo, rate, 1),
            Check(builder.user_key(user, algo), algo, rate, 1),
            Check(builder.endpoint_key(user, "GET", "res", algo), algo, rate, 1),
        ]
        storage.decide(checks)
    seconds = time.perf_counter() - started
    gc.collect()  # the first full collection also untracks the stored tuples
    gc_started = time.perf_counter()
    gc.collect()  # what every later full collection costs with these keys held
    gc_seconds = time.perf_counter() - gc_started
    tracked = len(storage)
    filled = used() - base
    now[0] += 7200 * 1_000_000  # two hours later: every key has expired
    storage.sweep()
    gc.collect()
    after = used() - base
    return {
        "keys": tracked,
        "per_key": filled / tracked,
        "after_expiry": after,
        "keys_after_expiry": len(storage),
        "seconds": seconds,
        "gc_seconds": gc_seconds,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="memory backend footprint (child process)")
    parser.add_argument("--algorithm", default="token_bucket")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--trace", action="store_true", help="count with tracemalloc, not RSS")
    parser.add_argument("--rss", dest="trace", action="store_false")
    ns = parser.parse_args()
    print(json.dumps(_inproc(ns.algorithm, ns.keys, ns.trace)))
