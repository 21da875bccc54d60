"""Measurements 2 and 5a: added latency per request, in-process, over a bare Flask app.

Every case is a direct WSGI call (see ``driver.WsgiDriver``) of a different app
serving the same view to the same callers, or a raw Redis call made with the
same client settings flask-quota uses. All cases are interleaved round by round
(``timing.run``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from flask import Flask

from .apps import (
    LIMITER_STRATEGY,
    QUOTA_ALGORITHMS,
    RESOURCE,
    bare_app,
    limiter_app,
    quota_app,
)
from .compare import floor_app
from .driver import WsgiDriver, caller_sequence
from .timing import Case, added, median, run, spread

SHORT = {
    "token_bucket": "tb",
    "fixed_window": "fw",
    "sliding_window_log": "swl",
    "sliding_window_counter": "swc",
}


def quota_checks(app: Flask, callers: Sequence[tuple[str, str]]) -> list[list[Any]]:
    """The storage checks flask-quota makes for each caller of ``GET /res`` on ``app``."""
    from flask_quota.core.identity import client_ip
    from flask_quota.core.keys import KeyBuilder
    from flask_quota.state import get_state

    state = get_state(app)
    plan = state.catalog()["b"]
    view: Any = app.view_functions["res"]
    (spec,) = view.__quota_limit__  # what @quota.limit recorded (one limit: not stacked)
    return [
        [
            c.check
            for c in state.policy.checks(
                plan,
                ip_tag=KeyBuilder.ip_tag(client_ip(ip)),
                identity_tag=KeyBuilder.identity_tag(user),
                method="GET",
                spec=spec,
                resource=RESOURCE,
                cost=1,
            )
        ]
        for ip, user in callers
    ]


def script_call(checks: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one "decide" EVALSHA (mirrors ``RedisStorage._call``)."""
    from flask_quota.storage.redis import decide_args

    return [c.key for c in checks], decide_args(checks, "decide", "")


def _wsgi_case(key: str, app: Flask, callers: Sequence[tuple[str, str]]) -> Case:
    driver = WsgiDriver(app, callers)
    return Case(key, driver, lambda: driver.expect("200"))


def _rotating(calls: list[Any]) -> Any:
    """A zero-argument callable that makes the next of ``calls`` (each a (fn, args) pair)."""
    position = 0

    def call() -> None:
        nonlocal position
        fn, args = calls[position]
        position = (position + 1) % len(calls)
        fn(*args)

    return call


def build_cases(redis_url: str, callers: Sequence[tuple[str, str]]) -> list[Case]:
    from flask_quota.storage.redis import SCRIPT, RedisStorage

    cases = [_wsgi_case("bare", bare_app(), callers)]
    # In-process memory backends.
    for tiers in (1, 2, 3):
        cases.append(_wsgi_case(f"q/mem/tb/{tiers}", quota_app("memory://", tiers=tiers), callers))
    for algorithm in QUOTA_ALGORITHMS[1:]:
        app = quota_app("memory://", algorithm)
        cases.append(_wsgi_case(f"q/mem/{SHORT[algorithm]}/3", app, callers))
    for strategy in dict.fromkeys(LIMITER_STRATEGY.values()):
        for headers in (False, True):
            app = limiter_app("memory://", strategy, headers=headers)
            cases.append(_wsgi_case(f"fl/mem/{strategy}/3/h{int(headers)}", app, callers))
    # Redis.
    for tiers in (1, 2, 3):
        app = quota_app(redis_url, tiers=tiers)
        cases.append(_wsgi_case(f"q/redis/tb/{tiers}", app, callers))
    for algorithm in QUOTA_ALGORITHMS[1:]:
        app = quota_app(redis_url, algorithm)
        cases.append(_wsgi_case(f"q/redis/{SHORT[algorithm]}/3", app, callers))
    app = quota_app(redis_url, headers="none")
    cases.append(_wsgi_case("q/redis/tb/3/noheaders", app, callers))
    for strategy in dict.fromkeys(LIMITER_STRATEGY.values()):
        for headers in (False, True):
            app = limiter_app(redis_url, strategy, headers=headers)
            cases.append(_wsgi_case(f"fl/redis/{strategy}/3/h{int(headers)}", app, callers))
    for tiers in (1, 2):
        app = limiter_app(redis_url, "fixed-window", tiers)
        cases.append(_wsgi_case(f"fl/redis/fixed-window/{tiers}/h0", app, callers))
    # The Redis floor, with flask-quota's own client settings.
    storage = RedisStorage.from_url(redis_url, timeout=5.0)
    client: redis.Redis = storage.client
    trivial = client.script_load("return 1")
    cases.append(Case("raw/evalsha-return1", lambda: client.evalsha(trivial, 0)))
    decide_sha = client.script_load(SCRIPT)
    checks = quota_checks(quota_app(redis_url), callers)
    raw_calls: list[Any] = []
    for keys, args in (script_call(c) for c in checks):
        raw_calls.append((client.evalsha, (decide_sha, len(keys), *keys, *args)))
    cases.append(Case("raw/evalsha-decide3", _rotating(raw_calls)))
    checks = quota_checks(quota_app(redis_url), callers)
    cases.append(Case("q/storage/tb/3", _rotating([(storage.decide, (c,)) for c in checks])))
    # The floor inside a request: a bare app whose before_request hook makes one
    # EVALSHA doing a GET and a SET PX on each of the caller's three keys (what any
    # one-round-trip limiter pays, with no logic at all; see compare.FLOOR_SCRIPT).
    cases.append(_wsgi_case("floor/in-request/decide3", floor_app(redis_url, callers), callers))
    return cases


@dataclass(frozen=True)
class Latency:
    key: str
    median_us: float  # per request, absolute
    added_us: float | None  # over the bare app (None for raw Redis calls)
    q1_us: float  # quartiles of the per-round values behind added_us (or median_us)
    q3_us: float


def measure(redis_url: str, rounds: int, batch: int, population: int = 1000) -> dict[str, Latency]:
    callers = caller_sequence(population, population)
    cases = build_cases(redis_url, callers)
    run(cases, rounds, batch)
    bare = cases[0]
    results = {}
    for case in cases:
        on_flask = not case.key.startswith(("raw/", "q/storage/"))
        baseline = bare if on_flask else None
        q1, q3 = spread(case, baseline)
        results[case.key] = Latency(
            case.key,
            median(case),
            added(case, bare) if on_flask else None,
            q1,
            q3,
        )
    return results
