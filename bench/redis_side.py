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
  to the script saves. It includes reading the call and writing its reply.
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
from collections.abc import Callable
from typing import Any

import redis

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.plans import Plan
from flask_quota.core.policy import LimitSpec, Policy
from flask_quota.core.route import build_route
from flask_quota.storage.redis import SCRIPT, decide_args

from .compare import FLOOR_SCRIPT
from .env import free_port, redis_server, wait_for_port

COMMANDS_ONLY = """
redis.call('TIME')
redis.call('PTTL', KEYS[1])
for i = 2, #KEYS do
  redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], '1764480000000000', 'PX', 4)
end
return {1, 1, 1, 0, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0}
"""
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
    port = free_port()
    binary = shutil.which("redis-server") or "redis-server"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary,
             "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_for_port(port, timeout=60)
            client = redis.Redis(port=port, socket_timeout=60)
            script = client.register_script(source)
            every = _calls()
            for i in range(calls):
                _call(script, name, *every[i % len(every)])
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
