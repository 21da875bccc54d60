"""The Redis side of one decision: ``python -m bench.redis_side``.

Not part of a run. On a redis-server of its own:

* the decide script alone, against variants: the same commands without our
  logic (``TIME``, ``PTTL``, a ``GET`` and a ``SET PX`` per tier, an 18-integer
  reply), the floor script (``compare.FLOOR_SCRIPT``) and an empty script given
  our keys and arguments. Each is called 10,000 times per pass (1,000 callers'
  keys in turn), ``INFO commandstats`` gives the server's ``usec_per_call``;
  passes alternate, and the best of 4 is printed;
* the client's CPU and wall time of one round trip: raw redis-py ``PING`` and
  ``EVALSHA`` of ``return 1`` in a loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from flask_quota.algorithms import Algorithm
from flask_quota.keys import KeyBuilder
from flask_quota.plans import Plan
from flask_quota.policy import LimitSpec, Policy
from flask_quota.route import build_route
from flask_quota.storage.redis import SCRIPT, decide_args

from .compare import FLOOR_SCRIPT
from .env import redis_server

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


def script_costs(url: str) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    plan = Plan("b", global_rate="1000000/hour", user_rate="1000000/hour",
                resources={"res": "1000000/hour"})  # fmt: skip
    policy = Policy(KeyBuilder("rs"), Algorithm.TOKEN_BUCKET)
    route = build_route(policy, plan, method="GET", spec=LimitSpec(None, "res", 1),
                        resource="res", cost=1)  # fmt: skip
    calls = []
    for i in range(1000):
        checks = route.checks(route.keys(f"ip=10.0.{i // 250}.{i % 250}", f"id=u{i}", f"id=u{i}"))
        calls.append(([c.key for c in checks], decide_args(checks, "decide", "")))
    scripts = {name: client.register_script(source) for name, source in VARIANTS.items()}
    best: dict[str, float] = {}
    for _ in range(PASSES):
        for name, script in scripts.items():
            floor = name.startswith("floor")
            client.config_resetstat()
            for i in range(CALLS):
                keys, args = calls[i % len(calls)]
                if floor:  # the floor's three keys, no gate
                    script(keys=keys[1:], args=[1, 5])
                else:
                    script(keys=keys, args=args)
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


def main() -> None:
    with redis_server() as url:
        for name, usec in script_costs(url).items():
            print(f"{name}: {usec:.2f} us per call on the server")
        for name, (cpu, wall) in round_trip(url).items():
            print(f"client, {name}: {cpu:.1f} us CPU, {wall:.1f} us wall per call")


if __name__ == "__main__":
    main()
