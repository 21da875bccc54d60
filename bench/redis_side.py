"""The Redis side of one decision: ``python -m bench.redis_side``.

Not part of a run. On a redis-server of its own:

* the decide script alone, against variants: the same commands without our
  logic (``TIME``, ``PTTL``, a ``GET`` and a ``SET PX`` per tier, an 18-integer
  reply), the floor script (``compare.FLOOR_SCRIPT``) and an empty script given
  our keys and arguments. Each is called 10,000 times per pass (1,000 callers'
  keys in turn), ``INFO commandstats`` gives the server's ``usec_per_call``;
  passes alternate, and the best of 4 is printed;
* the client's CPU and wall time of one round trip: raw redis-py ``PING`` and
  ``EVALSHA`` of ``return 1`` in a loop;
* with ``--instructions``, instead: the redis-server's instructions per call of
  each variant, counted by callgrind (a server of its own per count, run with
  200 and with 2,200 calls; the difference over 2,000). Unlike a time, the count
  repeats exactly from run to run on a noisy machine, so it shows what a change
  to the script saves. It counts reading and running the call and writing its
  reply, not the server's timer (``COLLECT``);
* with ``--decisions``, instead: the same count for whole decisions made through
  the public API (``RedisStorage.decide_flat``, whatever command it sends: an
  ``FCALL`` or an ``EVALSHA``), for each algorithm with 1, 2 and 3 tiers and for
  three tiers plus a tenant tier, a concurrency lease or a calendar window, and
  three tiers of callers seen for the first time and of one busy caller
  (``DECISIONS``); 1,000 decisions counted after 1,000 that leave every caller's
  state in place (counted with 1,000 and with 2,000 calls, the difference over 1,000);
  ``--decisions tb-3 floor`` counts some of them; ``floor+time`` is the floor script
  with a ``TIME`` first (``FLOOR_TIME_SCRIPT``), as a limiter on the server's clock
  must read it;
* with ``--requests``, instead: the same count per whole request of
  ``bench.profile``'s Redis cases (``redis`` and the newer tiers': ``TIER_CASES``),
  made through ``app.wsgi_app`` as ``bench.profile`` makes them, so every call a
  request sends is counted (a lease's give-back after the response included);
  1,000 requests after the 1,000 of ``bench.profile.driver_for``'s warm-up
  (counted with 0 and with 1,000, the difference over 1,000);
  ``--requests redis redis-lease`` counts some of them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.plans import Plan
from flask_quota.core.policy import LimitSpec, Policy
from flask_quota.core.route import build_route
from flask_quota.storage.redis import SCRIPT, RedisStorage, decide_args

from .compare import FLOOR_SCRIPT
from .driver import repeat
from .env import free_port, redis_server, wait_for_port
from .profile import TIER_CASES, driver_for

COMMANDS_ONLY = """
redis.call('TIME')
redis.call('PTTL', KEYS[1])
for i = 2, #KEYS do
  redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], '1764480000000000', 'PX', 4)
end
return {1, 1, 1, 0, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0}
"""
# The floor with the server's clock read first, as the decide script reads it.
FLOOR_TIME_SCRIPT = "redis.call('TIME')\n" + FLOOR_SCRIPT
VARIANTS = {
    "flask-quota's decide script": SCRIPT,
    "its commands and reply, no logic": COMMANDS_ONLY,
    "floor (3 GET + 3 SET PX)": FLOOR_SCRIPT,
    "empty, our keys and arguments": "return 1",
}
CALLS, PASSES = 10_000, 4


def _calls() -> list[tuple[list[str], list[Any]]]:
    """The keys and arguments of 1,000 callers' decide calls (three tiers and the gate)."""
    plan = Plan("b", global_rate="1000000/hour", user_rate="1000000/hour",
                resources={"res": "1000000/hour"})  # fmt: skip
    policy = Policy(KeyBuilder("rs"), Algorithm.TOKEN_BUCKET)
    route = build_route(policy, plan, method="GET", spec=LimitSpec(None, "res", 1),
                        resource="res", cost=1)  # fmt: skip
    calls = []
    for i in range(1000):
        checks = route.checks(route.keys(f"ip=10.0.{i // 250}.{i % 250}", f"id=u{i}", f"id=u{i}"))
        calls.append(([c.key for c in checks], decide_args(checks, "decide", "")))
    return calls


RATE = "1000000/hour"
LOG_RATE = "1000/hour"  # the most a sliding log may hold (a larger one is run as a counter)
# name -> (algorithm, tiers, extra): extra is "tenant", "lease", "calendar" (the
# endpoint tier a "1000000/month" window), "fresh" (no state yet: every call a new
# caller), "busy" (one caller at every call: its buckets are never full again, so each
# state's TTL is printed anew, where a full bucket's is printed once) or "" for none.
DECISIONS: dict[str, tuple[Algorithm, int, str]] = {
    f"{a.code}-{n}": (a, n, "") for a in Algorithm for n in (1, 2, 3)
} | {
    "tb-3+tenant": (Algorithm.TOKEN_BUCKET, 3, "tenant"),
    "tb-3+lease": (Algorithm.TOKEN_BUCKET, 3, "lease"),
    "tb-3+calendar": (Algorithm.TOKEN_BUCKET, 3, "calendar"),
    "tb-3+fresh": (Algorithm.TOKEN_BUCKET, 3, "fresh"),
    "tb-3+busy": (Algorithm.TOKEN_BUCKET, 3, "busy"),
}
CALLERS = 1000  # a case's callers, in turn; "fresh" has a new caller at every call
WARM = 1000  # decisions before the count: every caller's state exists


def decision_calls(name: str) -> list[tuple[Any, list[str]]]:
    """(checks, keys) of 1,000 callers' decisions of the case ``name`` (``DECISIONS``)."""
    algorithm, tiers, extra = DECISIONS[name]
    rate = LOG_RATE if algorithm is Algorithm.SLIDING_WINDOW_LOG else RATE
    resources = {"res": "1000000/month" if extra == "calendar" else rate} if tiers > 2 else {}
    plan = Plan("b", global_rate=rate, user_rate=rate if tiers > 1 else None,
                resources=resources, tenant_rate=rate if extra == "tenant" else None,
                concurrent=100_000 if extra == "lease" else None)  # fmt: skip
    policy = Policy(KeyBuilder("rs"), algorithm)
    route = build_route(policy, plan, method="GET", spec=LimitSpec(None, "res", 1),
                        resource="res", cost=1, tenant=extra == "tenant")  # fmt: skip
    calls = []
    for i in range({"fresh": 10 * CALLERS, "busy": 1}.get(extra, CALLERS)):
        ip = f"ip=10.{i // 62500}.{i // 250 % 250}.{i % 250}"
        calls.append((route.calls, route.keys(ip, f"id=u{i}", f"id=u{i}", f"t=t{i % 10}")))
    return calls


def _counted_decisions(name: str, calls: int) -> int:
    """Instructions of a fresh redis-server under callgrind answering ``calls``
    decisions of ``name`` through ``RedisStorage.decide_flat`` (its loading included;
    "floor": ``compare.FLOOR_SCRIPT`` on the same three keys; "floor+time": with a
    ``TIME`` first)."""
    every = decision_calls("tb-3" if name.startswith("floor") else name)

    def run(client: redis.Redis) -> None:
        floor = client.register_script(FLOOR_TIME_SCRIPT if name == "floor+time" else FLOOR_SCRIPT)
        storage = RedisStorage(client)
        for i in range(calls):
            checks, keys = every[i % len(every)]
            if name.startswith("floor"):
                floor(keys=keys[1:], args=[1, 5])
                continue
            reply = storage.decide_flat(checks, keys)
            if reply[1] != 1:
                raise RuntimeError(f"{name}: a decision was denied: {list(reply)}")
        storage.close()

    return _under_callgrind(run)


def decision_instructions(names: list[str], calls: int = 1000) -> Iterator[tuple[str, float]]:
    """redis-server instructions per decision of each case (see the module doc), as
    each is counted: ``calls`` decisions after ``WARM``."""
    for name in names:
        total = _counted_decisions(name, WARM + calls) - _counted_decisions(name, WARM)
        yield name, total / calls


REQUEST_CASES = ("redis", *TIER_CASES)


def _counted_requests(case: str, requests: int) -> int:
    """Instructions of a fresh redis-server under callgrind while ``bench.profile``'s
    app of ``case`` answers its warm-up and then ``requests`` more requests."""

    def run(client: redis.Redis) -> None:
        port = client.connection_pool.connection_kwargs["port"]
        driver = driver_for(case, f"redis://127.0.0.1:{port}/0")
        repeat(driver, requests)
        driver.expect("200")

    return _under_callgrind(run)


def request_instructions(cases: list[str], requests: int = 1000) -> Iterator[tuple[str, float]]:
    """redis-server instructions per request of each of ``bench.profile``'s ``cases``."""
    for case in cases:
        total = _counted_requests(case, requests) - _counted_requests(case, 0)
        yield case, total / requests


def _call(script: Any, name: str, keys: list[str], args: list[Any]) -> None:
    if name.startswith("floor"):  # the floor's three keys, no gate
        script(keys=keys[1:], args=[1, 5])
    else:
        script(keys=keys, args=args)


def script_costs(url: str) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    calls = _calls()
    scripts = {name: client.register_script(source) for name, source in VARIANTS.items()}
    best: dict[str, float] = {}
    for _ in range(PASSES):
        for name, script in scripts.items():
            client.config_resetstat()
            for i in range(CALLS):
                _call(script, name, *calls[i % len(calls)])
            stats = client.info("commandstats")["cmdstat_evalsha"]
            best[name] = min(best.get(name, float("inf")), float(stats["usec_per_call"]))
    return best


def round_trip(url: str) -> dict[str, tuple[float, float]]:
    """(CPU us, wall us) per call of the client, for a PING and an EVALSHA of ``return 1``."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    one = client.register_script("return 1")
    calls: dict[str, Callable[[], object]] = {"PING": client.ping, "EVALSHA return 1": one}
    out = {}
    for name, call in calls.items():
        for _ in range(1000):
            call()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(20_000):
            call()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        out[name] = (cpu / 20_000 * 1e6, wall / 20_000 * 1e6)
    return out


def _counted(source: str, name: str, calls: int) -> int:
    """Instructions a fresh redis-server under callgrind runs, from start to
    shutdown, answering ``calls`` calls of ``source``."""
    every = _calls()

    def run(client: redis.Redis) -> None:
        script = client.register_script(source)
        for i in range(calls):
            _call(script, name, *every[i % len(every)])

    return _under_callgrind(run)


# Only what a call costs: reading and running it (readQueryFromClient) and writing its
# reply (writeToClient). The server's timer (serverCron) is left out: it runs per
# tick of the wall clock, so a slower client would make the server look busier.
COLLECT = ("--collect-atstart=no", "--toggle-collect=readQueryFromClient",
           "--toggle-collect=writeToClient")  # fmt: skip


def _under_callgrind(run: Callable[[redis.Redis], None]) -> int:
    """Instructions a fresh redis-server under callgrind runs, from start to
    shutdown, while ``run`` uses it."""
    port = free_port()
    binary = shutil.which("redis-server") or "redis-server"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *COLLECT, binary,
             "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_for_port(port, timeout=60)
            client = redis.Redis(port=port, socket_timeout=60)
            run(client)
            with contextlib.suppress(redis.ConnectionError):  # it closes as it goes
                client.shutdown(nosave=True)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    found = re.search(rb"Collected : (\d+)", err)
    if found is None:
        raise RuntimeError(f"callgrind printed no total: {err[-500:]!r}")
    return int(found.group(1))


def script_instructions(calls: int = 2000) -> dict[str, float]:
    """The redis-server's instructions per call of each variant (see the module doc)."""
    return {
        name: (_counted(source, name, 200 + calls) - _counted(source, name, 200)) / calls
        for name, source in VARIANTS.items()
    }


def main() -> None:
    if "--decisions" in sys.argv[1:]:
        names = [a for a in sys.argv[1:] if not a.startswith("--")]
        names = names or ["floor", "floor+time", *DECISIONS]
        for name, count in decision_instructions(names):
            print(f"{name}: {count:,.0f} instructions per decision in redis-server", flush=True)
        return
    if "--requests" in sys.argv[1:]:
        cases = [a for a in sys.argv[1:] if not a.startswith("--")] or list(REQUEST_CASES)
        for case, count in request_instructions(cases):
            print(f"{case}: {count:,.0f} instructions per request in redis-server", flush=True)
        return
    if "--instructions" in sys.argv[1:]:
        for name, count in script_instructions().items():
            print(f"{name}: {count:,.0f} instructions per call in redis-server")
        return
    with redis_server() as url:
        for name, usec in script_costs(url).items():
            print(f"{name}: {usec:.2f} us per call on the server")
        for name, (cpu, wall) in round_trip(url).items():
            print(f"client, {name}: {cpu:.1f} us CPU, {wall:.1f} us wall per call")


if __name__ == "__main__":
    main()
