"""Measurement 5b: per-request cost against the number of active identities.

For each population (1k ... 1M callers) an app of its own gets state for every
caller first (so all of them are "active": their keys exist), then requests
pick callers uniformly at random from the population. Populations are timed
interleaved, like every other latency measurement. (Growth with the number of
tiers comes from the 1/2/3-tier rows of the latency measurement.)

Pre-populating goes around Flask for speed: the memory backend gets
``storage.decide(checks)`` directly, Redis gets the decide script pipelined,
with the checks the app itself builds (``latency.quota_checks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flask import Flask

from .apps import bare_app, quota_app
from .driver import WsgiDriver, caller_sequence, identity
from .latency import quota_checks, script_call
from .timing import Case, added, run

CHUNK = 5000
SAMPLE = 4096  # distinct request slots per case: callers drawn from the population


def _populate(app: Flask, population: int) -> None:
    from flask_quota.state import get_state
    from flask_quota.storage.redis import SCRIPT, RedisStorage

    storage = get_state(app).storage
    sha = storage.client.script_load(SCRIPT) if isinstance(storage, RedisStorage) else ""
    for start in range(0, population, CHUNK):
        callers = [identity(i) for i in range(start, min(population, start + CHUNK))]
        checks = quota_checks(app, callers)
        if isinstance(storage, RedisStorage):
            pipe = storage.client.pipeline(transaction=False)
            for c in checks:
                keys, args = script_call(c)
                pipe.evalsha(sha, len(keys), *keys, *args)
            pipe.execute()
        else:
            for c in checks:
                storage.decide(c)


@dataclass(frozen=True)
class GrowthRow:
    backend: str
    population: int
    added_us: float


def measure(redis_url: str, populations: Sequence[int], rounds: int, batch: int) -> list[GrowthRow]:
    # A slow rate keeps every key alive for the whole measurement (a token bucket
    # key expires once its bucket is full again: 14 minutes after one request at 100/day).
    rate = "100/day"
    cases = [Case("bare", WsgiDriver(bare_app(), caller_sequence(SAMPLE, SAMPLE)))]
    labels: dict[str, tuple[str, int]] = {}
    for population in populations:
        callers = caller_sequence(population, SAMPLE, seed=population)
        for backend, url in (("memory", "memory://"), ("redis", redis_url)):
            app = quota_app(url, rate=rate)
            _populate(app, population)
            driver = WsgiDriver(app, callers)
            key = f"{backend}/{population}"
            labels[key] = (backend, population)
            cases.append(Case(key, driver, lambda d=driver: d.expect("200")))  # type: ignore[misc]
    run(cases, rounds, batch)
    bare = cases[0]
    return [GrowthRow(*labels[c.key], added(c, bare)) for c in cases[1:]]
