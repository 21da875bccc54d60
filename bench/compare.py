"""Measurement 6: the side-by-side comparison issue 13 asks for, through the Flask test client.

One interleaved run (``timing.run``), three tiers/limits, the same callers for
every app, each request made with ``app.test_client().get(...)``:

* ``bare``: the bare app (the baseline every *added* figure is taken over);
* ``hook``: the bare app with an empty ``before_request`` hook (Flask's own
  hook dispatch, which any extension pays);
* ``floor``: the bare app whose ``before_request`` makes one ``EVALSHA`` of
  ``FLOOR_SCRIPT`` (a ``GET`` and a ``SET PX`` on each of the caller's three
  keys, nothing else) with flask-quota's client settings: the least a
  one-round-trip limiter with three tiers can add;
* flask-quota on Redis and on ``memory://`` (token_bucket);
* Flask-Limiter on Redis and on ``memory://`` (fixed-window), with and without
  its headers.

*added* is the median over rounds of (case - bare) within a round; the ratios
divide two *added* figures of this same run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flask import Flask

from .apps import PATH, RESOURCE, USER_HEADER, bare_app, limiter_app, quota_app
from .driver import caller_sequence
from .timing import Case, added, median, run, spread

# The floor's state work: per key one GET and one SET with a TTL, as a decision
# on three fresh-or-live keys needs at the least. No clock, no arithmetic.
FLOOR_SCRIPT = """
for _, key in ipairs(KEYS) do
  redis.call('GET', key)
  redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
"""
# The floor's ARGV: the value every key is set to and its TTL in milliseconds.
FLOOR_ARGS = ("1764480000000000", 3_600_000)

LABELS = {
    "bare": "bare Flask app (baseline)",
    "hook": "bare app + empty before_request hook",
    "floor": "floor: bare app + one EVALSHA (GET + SET PX on 3 keys) in before_request",
    "q/redis": "flask-quota, Redis, token_bucket, 3 tiers (headers on)",
    "fl/redis/h0": "Flask-Limiter, Redis, fixed-window, 3 limits, no headers",
    "fl/redis/h1": "Flask-Limiter, Redis, fixed-window, 3 limits, headers on",
    "q/mem": "flask-quota, memory://, token_bucket, 3 tiers (headers on)",
    "q/mem/h0": "flask-quota, memory://, token_bucket, 3 tiers, QUOTA_HEADERS=none",
    "fl/mem/h0": "Flask-Limiter, memory://, fixed-window, 3 limits, no headers",
    "fl/mem/h1": "Flask-Limiter, memory://, fixed-window, 3 limits, headers on",
}


class ClientDriver:
    """``driver()`` sends one ``GET /res`` through ``app.test_client()``, callers rotating."""

    def __init__(self, app: Flask, callers: Sequence[tuple[str, str]]) -> None:
        self.client = app.test_client()
        self.callers = list(callers)
        self.position = 0
        self.statuses: dict[int, int] = {}

    def __call__(self) -> None:
        ip, user = self.callers[self.position]
        self.position = (self.position + 1) % len(self.callers)
        response = self.client.get(
            PATH, headers={USER_HEADER: user}, environ_base={"REMOTE_ADDR": ip}
        )
        code = response.status_code
        self.statuses[code] = self.statuses.get(code, 0) + 1

    def expect_ok(self) -> None:
        """Raise unless every request so far answered 200; then reset the tally."""
        if set(self.statuses) - {200}:
            raise AssertionError(f"expected only 200, got {self.statuses}")
        self.statuses.clear()


def floor_keys(prefix: str, ip: str, user: str) -> list[str]:
    """The three keys flask-quota would use for this caller (global, user, endpoint)."""
    from flask_quota.core.algorithms import Algorithm
    from flask_quota.core.keys import KeyBuilder, remote_ip_tag

    keys = KeyBuilder(prefix)
    tb = Algorithm.TOKEN_BUCKET
    tag = KeyBuilder.identity_tag(user)
    return [
        keys.global_key(remote_ip_tag(ip), tb),
        keys.user_key(tag, tb),
        keys.endpoint_key(tag, "GET", RESOURCE, tb),
    ]


def floor_app(redis_url: str, callers: Sequence[tuple[str, str]]) -> Flask:
    """The bare app plus a hook making one floor EVALSHA on the next caller's keys.

    The keys are built ahead, in the callers' order (the drivers rotate through the
    same sequence), so the hook does nothing but the call.
    """
    from flask_quota.storage.redis import RedisStorage

    client = RedisStorage.from_url(redis_url, timeout=5.0).client
    sha = client.script_load(FLOOR_SCRIPT)
    calls = [(sha, 3, *floor_keys("floor", ip, user), *FLOOR_ARGS) for ip, user in callers]
    position = 0

    def hook() -> None:
        nonlocal position
        args = calls[position]
        position = (position + 1) % len(calls)
        client.evalsha(*args)

    app = bare_app()
    app.before_request(hook)
    return app


def floor_server_app(redis_url: str) -> Flask:
    """The floor as a server (section 3): the hook builds the caller's three keys from
    the request (``X-User`` and the address, as flask-quota's are built) and makes the
    floor ``EVALSHA`` with redis-py. The least a one-round-trip limiter can cost there."""
    from flask import request

    from flask_quota.storage.redis import RedisStorage

    client = RedisStorage.from_url(redis_url, timeout=5.0).client
    sha = client.script_load(FLOOR_SCRIPT)

    def hook() -> None:
        ip, user = request.remote_addr or "", request.headers.get(USER_HEADER, "")
        client.evalsha(sha, 3, *floor_keys("floor", ip, user), *FLOOR_ARGS)

    app = bare_app()
    app.before_request(hook)
    return app


def hook_app() -> Flask:
    """The bare app with an empty ``before_request`` hook."""
    app = bare_app()

    @app.before_request
    def nothing() -> None:
        return None

    return app


def build_cases(redis_url: str, callers: Sequence[tuple[str, str]]) -> list[Case]:
    apps: dict[str, Callable[[], Flask]] = {
        "bare": bare_app,
        "hook": hook_app,
        "floor": lambda: floor_app(redis_url, callers),
        "q/redis": lambda: quota_app(redis_url),
        "fl/redis/h0": lambda: limiter_app(redis_url),
        "fl/redis/h1": lambda: limiter_app(redis_url, headers=True),
        "q/mem": lambda: quota_app("memory://"),
        # Not a goal: shows what Werkzeug's handling of the six headers costs.
        "q/mem/h0": lambda: quota_app("memory://", headers="none"),
        "fl/mem/h0": lambda: limiter_app("memory://"),
        "fl/mem/h1": lambda: limiter_app("memory://", headers=True),
    }
    return client_cases(apps, callers)


def client_cases(
    apps: dict[str, Callable[[], Flask]], callers: Sequence[tuple[str, str]]
) -> list[Case]:
    """A ``Case`` per app (made now), each sent ``GET /res`` through its test client."""
    cases = []
    for key, make in apps.items():
        driver = ClientDriver(make(), callers)
        cases.append(Case(key, driver, driver.expect_ok))
    return cases


@dataclass(frozen=True)
class Comparison:
    median_us: dict[str, float]  # per request, absolute
    added_us: dict[str, float]  # over the bare app, same round
    quartiles: dict[str, tuple[float, float]]  # of the per-round added values

    def ratio(self, a: str, b: str) -> float | None:
        x, y = self.added_us.get(a), self.added_us.get(b)
        return None if x is None or y is None or y <= 0 else x / y


def measure(redis_url: str, rounds: int, batch: int, population: int = 1000) -> Comparison:
    callers = caller_sequence(population, population)
    cases = build_cases(redis_url, callers)
    run(cases, rounds, batch)
    bare = cases[0]
    return Comparison(
        {c.key: median(c) for c in cases},
        {c.key: added(c, bare) for c in cases},
        {c.key: spread(c, bare) for c in cases},
    )


def main_ratios(c: Comparison) -> list[tuple[str, float | None, str]]:
    """(what, ratio, goal) of the issue's table, the gunicorn one excepted."""
    return [
        ("flask-quota / floor (Redis)", c.ratio("q/redis", "floor"), "<= 1.25"),
        ("Flask-Limiter (headers on) / flask-quota (Redis)", c.ratio("fl/redis/h1", "q/redis"),
         ">= 3.5"),
        ("Flask-Limiter (no headers) / flask-quota (Redis)", c.ratio("fl/redis/h0", "q/redis"),
         "-"),
        ("memory: Flask-Limiter (no headers) / flask-quota", c.ratio("fl/mem/h0", "q/mem"),
         ">= 4"),
        ("memory: Flask-Limiter (headers on) / flask-quota", c.ratio("fl/mem/h1", "q/mem"),
         ">= 4"),
    ]  # fmt: skip


def summary(c: Comparison) -> dict[str, Any]:
    """The ratios and the memory backend's added microseconds, for logs and tests."""
    out: dict[str, Any] = {what: ratio for what, ratio, _ in main_ratios(c)}
    out["memory: flask-quota added (us)"] = c.added_us.get("q/mem")
    return out
