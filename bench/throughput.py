"""Measurement 3: requests per second under gunicorn (4 sync workers), loopback only.

All servers start first and stay up; then each round loads one server at a time
(in a shuffled order) for a fixed duration, so every app sees the same
stretches of machine noise. The load generator is ``wrk`` (rotating the
``X-User`` header over 10,000 users with ``bench/wrk_users.lua``) or, without
wrk, a bounded keep-alive-free Python client of ours.
"""

from __future__ import annotations

import http.client
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import redis

from .apps import PATH, USER_HEADER
from .env import cpu_seconds, gunicorn

WRK_SCRIPT = Path(__file__).with_name("wrk_users.lua")
USERS = 10_000  # distinct X-User values the load rotates over
APP_SPEC = "bench.apps:gunicorn_app()"

# name -> environment of its gunicorn (see apps.gunicorn_app)
SERVERS: dict[str, dict[str, str]] = {
    "bare": {"BENCH_APP": "bare"},
    "floor": {"BENCH_APP": "floor"},
    "flask-quota": {"BENCH_APP": "quota", "BENCH_ALGORITHM": "token_bucket"},
    "Flask-Limiter": {"BENCH_APP": "limiter", "BENCH_STRATEGY": "fixed-window"},
    "Flask-Limiter +headers": {
        "BENCH_APP": "limiter",
        "BENCH_STRATEGY": "fixed-window",
        "BENCH_HEADERS": "1",
    },
}


@dataclass
class Load:
    requests: int
    seconds: float
    errors: int  # non-2xx answers and socket errors
    cpu: dict[str, float] = field(default_factory=dict)  # CPU us per request, by process
    decides: float = 0.0  # decide calls Redis answered, per request

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


@dataclass
class Throughput:
    name: str
    runs: list[Load] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return statistics.median(r.rps for r in self.runs)

    @property
    def errors(self) -> int:
        return sum(r.errors for r in self.runs)

    def cpu(self, process: str) -> float:
        """Median over rounds of the CPU microseconds per request ``process`` used."""
        return statistics.median(r.cpu.get(process, 0.0) for r in self.runs)

    def ratio(self, other: Throughput) -> float:
        """Median over rounds of this server's req/s divided by ``other``'s in that round."""
        return statistics.median(a.rps / b.rps for a, b in zip(self.runs, other.runs, strict=True))


def _wrk(port: int, seconds: float, connections: int, users: int = USERS) -> Load:
    wrk = shutil.which("wrk")
    assert wrk is not None
    out = subprocess.run(
        [
            wrk, "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "5s",
            "-s", str(WRK_SCRIPT), f"http://127.0.0.1:{port}{PATH}",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
        env={**os.environ, "BENCH_USERS": str(users)},
    ).stdout  # fmt: skip
    match = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out)
    if match is None:
        raise RuntimeError(f"cannot read wrk output:\n{out}")
    duration = float(match.group(2)) / (1000 if match.group(3) == "ms" else 1)
    errors = 0
    for pattern in (r"Non-2xx or 3xx responses: (\d+)", r"Socket errors: (.*)"):
        found = re.search(pattern, out)
        if found:
            errors += sum(int(n) for n in re.findall(r"\d+", found.group(1)))
    return Load(int(match.group(1)), duration, errors)


def _python_load(port: int, seconds: float, connections: int, users: int = USERS) -> Load:
    """Fallback generator: ``connections`` threads, one request per connection (like
    gunicorn's sync workers want), stopped after ``seconds``."""
    deadline = time.monotonic() + seconds
    counts = [0] * connections
    errors = [0] * connections

    def worker(slot: int) -> None:
        rng = random.Random(slot)
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", PATH, headers={USER_HEADER: f"user{rng.randrange(users)}"})
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    counts[slot] += 1
                else:
                    errors[slot] += 1
            except OSError:
                errors[slot] += 1
            finally:
                conn.close()

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return Load(sum(counts) + sum(errors), time.monotonic() - start, sum(errors))


def measure(
    redis_url: str,
    rounds: int,
    seconds: float,
    connections: int = 16,
    seed: int = 3,
    *,
    servers: dict[str, dict[str, str]] | None = None,
    users: int = USERS,
    threads: int = 1,
) -> tuple[dict[str, Throughput], str]:
    load = _wrk if shutil.which("wrk") else _python_load
    generator = "wrk" if load is _wrk else "python threads (wrk not installed)"
    chosen = SERVERS if servers is None else servers
    results = {name: Throughput(name) for name in chosen}
    client = redis.Redis.from_url(redis_url)
    redis_pid = int(client.info("server")["process_id"])
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(
                gunicorn(
                    APP_SPEC, {**env, "BENCH_REDIS_URL": redis_url}, workers=4, threads=threads
                )
            )
            for name, env in chosen.items()
        }
        for server in servers.values():  # warm up: imports, connections, scripts
            load(server.port, 1.0, 4, users)
        rng = random.Random(seed)
        order = list(chosen)
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                server = servers[name]
                before, calls = _cpu(server.pid, redis_pid), _decides(client)
                run = load(server.port, seconds, connections, users)
                after = _cpu(server.pid, redis_pid)
                served = max(1, run.requests)  # a round that served nothing still counts
                run.cpu = {k: (after[k] - before[k]) * 1e6 / served for k in after}
                run.decides = (_decides(client) - calls) / max(1, run.requests)
                results[name].runs.append(run)
    client.close()
    return results, generator


def _decides(client: redis.Redis) -> int:
    """The decide calls (a function or a script) the server has answered so far."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))


def _cpu(gunicorn_pid: int, redis_pid: int) -> dict[str, float]:
    """CPU seconds so far of the app's gunicorn, the redis-server and our finished wrks."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "gunicorn": cpu_seconds([gunicorn_pid]),
        "redis-server": cpu_seconds([redis_pid]),
        "load generator": children.ru_utime + children.ru_stime,
    }
