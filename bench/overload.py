"""``python -m bench.overload``: a flash crowd at a multiple of the service's capacity,
without overload protection, with a fixed ``QUOTA_CAPACITY`` and with
``QUOTA_ADAPTIVE`` (issue 39's collapse and rescue).

Real parts: gunicorn with threaded workers serving ``bench.overload_app`` (each request
holds a connection of a small SQLAlchemy pool to PostgreSQL for ``pg_sleep``: the pool
is the bottleneck, not the CPU), flask-quota on our own redis-server with a per-caller
limit every caller stays inside, and an open-loop load generator (asyncio, one
connection per request, Poisson arrivals, a client that gives up after
``--client-timeout``) with hundreds of callers and a mix of classes.

1. **Capacity**: a closed loop of ``--closed`` clients against the unprotected app;
   its successful requests per second are the capacity every ratio is against.
2. **Baseline**: open loop at half the capacity. Unprotected, every class is served
   alike, so all requests' p99 is each class's (with more samples): critical
   requests must stay within three times of it under overload.
3. **Each protection** (none, fixed, adaptive) on a fresh gunicorn: ``--warm`` seconds
   at half the capacity (the service's normal day), then ``--seconds`` at
   ``--overload`` times the capacity; ``adaptive-cold`` is the overload alone, the
   fresh workers' first requests. Printed per class, over the overload: success
   rate, sheds, other 5xx, the client's timeouts, p50/p99 of the successful
   requests; the goodput (successes per second) against the capacity; the seconds in
   which a class was shed more than a lower one; the settling time (from the start of
   the overload, the first quarter second after which critical requests succeed >= 99%
   with a p99 within three times the baseline's); the machine's CPU use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time
import urllib.request
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .env import WORKDIR, cpu_seconds, gunicorn, machine, redis_server

CLASSES = ("critical", "default", "sheddable")
DATABASE_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Result:
    at: float  # seconds from the start of its phase when it was sent
    cls: str
    outcome: str  # "ok", "shed", "5xx", "timeout" (the client gave up), "error", "other"
    seconds: float  # until the answer (or the client gave up)


async def _get(port: int, path: str, headers: str, timeout: float) -> bytes:
    """``GET path`` on a connection of its own; the whole answer (the server closes)."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: bench\r\n{headers}Connection: close\r\n\r\n".encode()
            )
            return await reader.read()
    finally:
        if writer is not None:
            writer.close()


async def _one(port: int, cls: str, user: str, timeout: float) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        headers = f"X-User: {user}\r\nX-Priority: {cls}\r\n"
        outcome = _outcome(await _get(port, "/work", headers, timeout))
    except TimeoutError:
        outcome = "timeout"
    except OSError:
        outcome = "error"
    return outcome, time.perf_counter() - start


async def sample_limits(port: int, after: float, seconds: float) -> list[tuple[float, int, int]]:
    """``(seconds from the start of the overload, worker pid, its adaptive limit)``,
    asked ten times a second (of a worker at random) from ``after`` seconds on."""
    start = time.perf_counter() + after
    found = []
    while (now := time.perf_counter()) < start + seconds:
        if now >= start:
            try:
                body = (await _get(port, "/adaptive", "", 1.0)).split(b"\r\n\r\n", 1)[1]
                answer = json.loads(body)
                if answer["limit"] is not None:
                    found.append((now - start, int(answer["pid"]), int(answer["limit"])))
            except (OSError, TimeoutError, ValueError, IndexError):
                pass
        await asyncio.sleep(0.1)
    return found


def limit_table(samples: Sequence[tuple[float, int, int]], seconds: float) -> list[str]:
    """Each worker's adaptive limit over the overload, and when it settled: from then on
    within one of its median over the run's last third."""
    lines = ["| worker | " + " | ".join(f"{t:g} s" for t in _MARKS) + " | settled after |",
             "|---|" + "---:|" * (len(_MARKS) + 1)]  # fmt: skip
    for n, pid in enumerate(sorted({pid for _, pid, _ in samples}), 1):
        mine = [(t, limit) for t, p, limit in samples if p == pid]
        tail = [limit for t, limit in mine if t >= seconds * 2 / 3]
        if not tail:
            continue
        final = statistics.median(tail)
        at = [str(_nearest(mine, mark)) for mark in _MARKS]
        settled = next(
            (t for i, (t, _) in enumerate(mine) if all(abs(x - final) <= 1 for _, x in mine[i:])),
            None,
        )
        when = "never" if settled is None else f"{settled:.1f} s"
        lines.append(f"| {n} | " + " | ".join(at) + f" | {when} |")
    return lines


_MARKS = (0, 0.5, 1, 2, 5, 10, 20)


def _nearest(samples: Sequence[tuple[float, int]], mark: float) -> int:
    return min(samples, key=lambda sample: abs(sample[0] - mark))[1]


def _outcome(answer: bytes) -> str:
    try:
        status = int(answer.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return "error"
    if status == 200:
        return "ok"
    if status == 503 and (b'"tier": "capacity"' in answer or b'"tier": "queue"' in answer):
        return "shed"
    return "5xx" if status >= 500 else "other"


async def open_loop(
    port: int,
    phases: Sequence[tuple[str, float, float]],
    mix: Sequence[float],
    callers: int,
    timeout: float,
    rng: random.Random,
) -> dict[str, list[Result]]:
    """Poisson arrivals, ``(name, requests per second, seconds)`` phase after phase,
    each request's class drawn by ``mix`` and its caller among ``callers``."""
    tasks: dict[str, list[asyncio.Task[Result]]] = {name: [] for name, _, _ in phases}

    async def timed(at: float, cls: str, user: str) -> Result:
        outcome, seconds = await _one(port, cls, user, timeout)
        return Result(at, cls, outcome, seconds)

    start = time.perf_counter()
    for name, rate, seconds in phases:
        at = 0.0
        while True:
            at += rng.expovariate(rate)
            if at >= seconds:
                break
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            cls = rng.choices(CLASSES, mix)[0]
            user = f"c{rng.randrange(callers)}"
            tasks[name].append(asyncio.create_task(timed(at, cls, user)))
        start += seconds
    return {name: list(await asyncio.gather(*found)) for name, found in tasks.items()}


async def closed_loop(port: int, clients: int, seconds: float, timeout: float) -> float:
    """Successful requests per second of ``clients`` each sending its next request when
    the last one ends: those that ended within ``seconds``, after a second of warm-up."""
    done = 0
    stop = time.perf_counter() + 1 + seconds
    counting = time.perf_counter() + 1

    async def client(i: int) -> None:
        nonlocal done
        sent = 0
        while time.perf_counter() < stop:
            # A caller per request (of a thousand): the per-caller limit never answers.
            sent += 1
            outcome, _ = await _one(port, "default", f"closed{i}-{sent % 1000}", timeout)
            if outcome == "ok" and counting <= time.perf_counter() < stop:  # ended inside
                done += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return done / seconds


async def _with_limits(
    port: int, loop: Coroutine[Any, Any, dict[str, list[Result]]], warm: float, seconds: float
) -> tuple[dict[str, list[Result]], list[tuple[float, int, int]]]:
    """The open loop's results, and the workers' adaptive limits sampled meanwhile."""
    runs, limits = await asyncio.gather(loop, sample_limits(port, warm, seconds))
    return runs, limits


def ready(port: int) -> None:
    """Wait until the workers answer (gunicorn listens before they have imported the
    app): a run measures the service, not its boot."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    time.sleep(1)  # the other workers boot alongside
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the app never answered: see {WORKDIR}'s gunicorn log")


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``, NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class ClassStats:
    sent: int
    ok: int
    shed: int
    errors: int  # 5xx other than sheds, and connection errors
    timeouts: int
    p50: float
    p99: float

    @classmethod
    def of(cls, results: Sequence[Result]) -> ClassStats:
        times = [r.seconds for r in results if r.outcome == "ok"]
        count = {o: sum(1 for r in results if r.outcome == o) for o in
                 ("ok", "shed", "5xx", "error", "other", "timeout")}  # fmt: skip
        return cls(
            len(results), count["ok"], count["shed"], count["5xx"] + count["error"] +
            count["other"], count["timeout"], pct(times, 0.5), pct(times, 0.99),
        )  # fmt: skip

    @property
    def success(self) -> float:
        return self.ok / self.sent if self.sent else math.nan


def by_class(results: Sequence[Result]) -> dict[str, ClassStats]:
    return {c: ClassStats.of([r for r in results if r.cls == c]) for c in CLASSES}


def inversions(results: Sequence[Result], seconds: float) -> int:
    """Seconds of the run in which a class was shed more (as a share of its requests)
    than a lower class."""
    found = 0
    for second in range(int(seconds)):
        shares = []
        for c in CLASSES:
            sent = [r for r in results if r.cls == c and second <= r.at < second + 1]
            shares.append(sum(r.outcome == "shed" for r in sent) / len(sent) if sent else None)
        known = [s for s in shares if s is not None]
        if any(a > b for i, a in enumerate(known) for b in known[i + 1 :]):
            found += 1
    return found


def settling(results: Sequence[Result], seconds: float, bound: float) -> float | None:
    """The first quarter second after which critical requests succeed >= 99% with a p99
    within ``bound`` (None: never, in the run)."""
    critical = [r for r in results if r.cls == "critical"]
    for quarter in range(int(seconds * 4)):
        after = ClassStats.of([r for r in critical if r.at >= quarter / 4])
        if after.sent >= 20 and after.success >= 0.99 and after.p99 <= bound:
            return quarter / 4
    return None


def _cpu_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _env(args: argparse.Namespace, redis_url: str, name: str) -> dict[str, str]:
    return {
        "BENCH_DATABASE_URL": args.database_url,
        "BENCH_POOL": str(args.pool),
        "BENCH_POOL_TIMEOUT": str(args.pool_timeout),
        "BENCH_SLEEP_MS": str(args.sleep_ms),
        "BENCH_USER_RATE": args.user_rate,
        "QUOTA_STORAGE_URL": redis_url,
        "QUOTA_KEY_PREFIX": f"ov{name}{os.getpid()}",
    }


def _protections(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    reserve = json.dumps(args.reserve)
    return {
        "none": {},
        "fixed": {"QUOTA_CAPACITY": str(args.capacity), "QUOTA_RESERVE": reserve},
        "adaptive": {"QUOTA_ADAPTIVE": "true", "QUOTA_RESERVE": reserve},
        # The same, but the overload is the fresh workers' first traffic (no warm-up).
        "adaptive-cold": {"QUOTA_ADAPTIVE": "true", "QUOTA_RESERVE": reserve},
    }


def _row(name: str, stats: ClassStats) -> str:
    return (
        f"| {name} | {stats.sent} | {stats.success:.1%} | {stats.shed} | {stats.errors} | "
        f"{stats.timeouts} | {stats.p50 * 1000:.0f} | {stats.p99 * 1000:.0f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL",
                        DATABASE_URL))  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--pool", type=int, default=3, help="connections per worker")
    parser.add_argument("--pool-timeout", type=float, default=5.0)
    parser.add_argument("--sleep-ms", type=float, default=100.0)
    parser.add_argument("--callers", type=int, default=300)
    parser.add_argument("--user-rate", default="120/minute")
    parser.add_argument("--mix", default="10,40,50", help="critical,default,sheddable")
    parser.add_argument("--overload", type=float, default=3.0)
    parser.add_argument("--warm", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--closed", type=int, default=64)
    parser.add_argument("--client-timeout", type=float, default=5.0)
    parser.add_argument("--capacity", type=int, default=16)
    parser.add_argument("--reserve", type=json.loads, default={"critical": 0.4, "default": 0.15})
    parser.add_argument("--only", nargs="*", default=["none", "fixed", "adaptive", "adaptive-cold"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    mix = [float(x) for x in args.mix.split(",")]
    rng = random.Random(args.seed)
    protections = _protections(args)
    spec = "bench.overload_app:app"

    print(f"# Overload: collapse and rescue ({machine()['date']})\n")
    print(
        f"gunicorn {args.workers} workers x {args.threads} threads (gthread); "
        f"PostgreSQL pg_sleep({args.sleep_ms / 1000:g}) on a pool of {args.pool} per worker "
        f"(timeout {args.pool_timeout:g} s); {args.callers} callers, each limited to "
        f"{args.user_rate}; mix critical/default/sheddable {args.mix}; clients give up "
        f"after {args.client_timeout:g} s.\n"
    )
    with redis_server() as redis_url:
        with gunicorn(spec, _env(args, redis_url, "cap"), args.workers, args.threads) as srv:
            ready(srv.port)
            capacity = asyncio.run(closed_loop(srv.port, args.closed, 15.0,
                                               args.client_timeout))  # fmt: skip
            if capacity <= 0:
                raise SystemExit(f"the app served nothing: see {WORKDIR}'s gunicorn log")
            normal = capacity / 2
            phase = [("base", normal, 20.0)]
            loop = open_loop(srv.port, phase, mix, args.callers, args.client_timeout, rng)
            base = asyncio.run(loop)["base"]
        baseline = by_class(base)
        # Without protection every class is served alike: the p99 of all of them is the
        # p99 of each (and the estimate with five to ten times the samples).
        normal_p99 = ClassStats.of(base).p99
        bound = 3 * normal_p99
        print(f"Capacity (closed loop, {args.closed} clients): {capacity:.1f} requests/s.\n")
        print(f"Baseline at {normal:.1f} requests/s (half the capacity), ms:\n")
        print("| class | sent | success | shed | 5xx | timeouts | p50 | p99 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for c in CLASSES:
            print(_row(c, baseline[c]))
        print(_row("all", ClassStats.of(base)))
        rate = capacity * args.overload
        bound_rate = args.workers * args.pool / (args.sleep_ms / 1000)  # no wait, no overhead
        print(
            f"\nOverload: {rate:.1f} requests/s ({args.overload:g}x) for {args.seconds:g} s "
            f"after {args.warm:g} s at {normal:.1f}. Critical p99 bound: {bound * 1000:.0f} ms.\n"
        )
        for name in args.only:
            env = {**_env(args, redis_url, name), **protections[name]}
            with gunicorn(spec, env, args.workers, args.threads) as srv:
                ready(srv.port)
                busy0, total0 = _cpu_ticks()
                app0, own0 = cpu_seconds([srv.pid]), _own_cpu()
                warm = 0.0 if name.endswith("-cold") else args.warm
                phases = [("warm", normal, warm), ("over", rate, args.seconds)]
                loop = open_loop(srv.port, phases, mix, args.callers, args.client_timeout, rng)
                runs, limits = asyncio.run(_with_limits(srv.port, loop, warm, args.seconds))
                busy1, total1 = _cpu_ticks()
                app_cpu, own_cpu = cpu_seconds([srv.pid]) - app0, _own_cpu() - own0
            over = runs["over"]
            stats = by_class(over)
            ok = sum(s.ok for s in stats.values())
            goodput = ok / args.seconds
            settled = settling(over, args.seconds, bound)
            knobs = " ".join(f"{k}={v}" for k, v in protections[name].items()) or "no knob"
            print(f"## {name} ({knobs})\n")
            print("| class | sent | success | shed | 5xx | timeouts | p50 ms | p99 ms |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for c in CLASSES:
                print(_row(c, stats[c]))
            crit = stats["critical"]
            print(
                f"\ngoodput {goodput:.1f}/s = {goodput / capacity:.1%} of the capacity "
                f"({goodput / bound_rate:.1%} of the pool's bound, {bound_rate:g}/s); "
                f"critical p99 / baseline p99 = {crit.p99 / normal_p99:.2f}; "
                f"seconds with a class shed more than a lower one: "
                f"{inversions(over, args.seconds)}; settled after: "
                f"{'never' if settled is None else f'{settled:g} s'}; "
                f"CPU busy {(busy1 - busy0) / (total1 - total0):.0%} of {os.cpu_count()} cores "
                f"(warm and overload: gunicorn {app_cpu:.1f} s, the load generator "
                f"{own_cpu:.1f} s of {warm + args.seconds:g} s).\n"
            )
            if limits:
                print(
                    "Each worker's adaptive limit (requests in flight) from the overload's start:\n"
                )
                print("\n".join(limit_table(limits, args.seconds)) + "\n")
            if settled:
                after = by_class([r for r in over if r.at >= settled])["critical"]
                print(
                    f"critical after settling: {after.success:.1%} success, p99 "
                    f"{after.p99 * 1000:.0f} ms\n"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
