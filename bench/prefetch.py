"""``python -m bench.prefetch``: what ``QUOTA_PREFETCH`` costs in admissions and saves
in storage calls, on simulated traffic through the real code.

Four workers (each the production stack: a deny cache over a ``Prefetch``) share one
``MemoryStorage``; one virtual clock drives them all, so the numbers are the same
on every machine and every run. Callers send Poisson traffic at a multiple of their
limit, spread at random over the workers, for ``--seconds`` of virtual time. The
same arrivals are decided once more by the exact storage alone. Printed per case:
requests admitted with prefetch as a share of those the exact limiter admitted
(never above 100%: the model test proves it, this reports it), and storage calls
per request with and without.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flask_quota.core.algorithms import Algorithm, Gate
from flask_quota.core.checks import Check
from flask_quota.core.rates import Rate, parse_rate
from flask_quota.storage.denycache import DenyCache
from flask_quota.storage.memory import MemoryStorage
from flask_quota.storage.prefetch import Prefetch

if TYPE_CHECKING:
    from .throughput import Throughput

WORKERS = 4


@dataclass
class Case:
    name: str
    rate: str  # the caller's limit
    algorithm: Algorithm
    load: float  # offered traffic as a multiple of the limit
    callers: int = 20
    bursts: bool = False  # a burst every second (within 50 ms), instead of Poisson


CASES = [
    Case(f"{algo.value} {rate}, traffic {load:g}x the limit", rate, algo, load)
    for algo in (Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW)
    for rate in ("6000/minute", "600/minute")
    for load in (0.2, 0.8, 1.0, 1.5, 3.0)
] + [
    Case(
        f"{algo.value} {rate}, bursts each second, {load:g}x the limit",
        rate,
        algo,
        load,
        bursts=True,
    )
    for algo in (Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW)
    for rate in ("6000/minute", "600/minute")
    for load in (0.8, 1.5)
]


class Clock:
    def __init__(self) -> None:
        self.us = 1_800_000_000_000_000

    def storage(self) -> int:
        return self.us

    def local(self) -> float:
        return self.us / 1e6


def arrivals(case: Case, seconds: float, rng: random.Random) -> list[tuple[int, int, int]]:
    """(time in us from the start, caller, worker) of every request, in time order."""
    rate = parse_rate(case.rate)
    per_second = rate.limit / rate.window * case.load
    found = []
    if case.bursts:  # a second's worth of traffic at once, then a pause
        size = max(1, round(per_second))
        for caller in range(case.callers):
            start = rng.random()
            while start < seconds:
                for _ in range(size):
                    found.append((round((start + rng.random() * 0.05) * 1e6), caller,
                                  rng.randrange(WORKERS)))  # fmt: skip
                start += 1.0
        found.sort()
        return found
    for caller in range(case.callers):
        t = 0.0
        while True:
            t += rng.expovariate(per_second)
            if t >= seconds:
                break
            found.append((round(t * 1e6), caller, rng.randrange(WORKERS)))
    found.sort()
    return found


def run(case: Case, seconds: float, fraction: float | None, seed: int) -> tuple[int, int, int]:
    """(admitted, storage calls, requests) for ``case``'s traffic, prefetching ``fraction``."""
    clock = Clock()
    storage = MemoryStorage(clock=clock.storage)
    calls = [0]
    real = storage.decide_flat

    def counted(checks: object, keys: object) -> object:
        calls[0] += 1
        return real(checks, keys)  # type: ignore[arg-type]

    storage.decide_flat = counted  # type: ignore[method-assign,assignment]
    workers = []
    for _ in range(WORKERS):
        below = (
            Prefetch(storage, fraction=fraction, horizon=0.5, clock=clock.local)
            if fraction is not None
            else storage
        )
        workers.append(DenyCache(below, clock=clock.local))  # type: ignore[arg-type]
    rate = parse_rate(case.rate)
    start = clock.us
    admitted = 0
    traffic = arrivals(case, seconds, random.Random(seed))
    for t, caller, worker in traffic:
        clock.us = start + t
        checks = (
            Check(f"q:blk:{caller}", Gate.BLOCK, Rate(1, 1), 0),
            Check(f"q:u:{caller}", case.algorithm, rate, 1),
        )
        reply = workers[worker].decide_flat(checks, [c.key for c in checks])
        admitted += reply.all_allowed
    return admitted, calls[0], len(traffic)


GUNICORN = {
    "bare": {"BENCH_APP": "bare"},
    # The bare app sending flask-quota's six headers: what any limiter speaking SPEC's
    # headers costs at least (bench.bounds), whatever it decides with.
    "headers": {"BENCH_APP": "headers"},
    "floor": {"BENCH_APP": "floor"},
    "flask-quota": {"BENCH_APP": "quota"},
    "flask-quota, prefetch": {"BENCH_APP": "quota", "BENCH_PREFETCH": "0.05"},
    # Each worker's own counters, no storage call at all: what a local decision costs.
    "flask-quota, memory": {"BENCH_APP": "quota", "BENCH_STORAGE_URL": "memory://"},
}


def gunicorn_table(rounds: int, seconds: float, threads: tuple[int, ...] = (1, 4)) -> None:
    """Throughput of 4 gunicorn workers under wrk (bench/throughput.py), sync and with
    ``threads`` threads each (gthread), three tiers on one redis-server, limits that
    never deny: with 4 callers (every bucket busy) and with 10,000 (each user's buckets
    cold; only the per-IP tier is busy). The ratios are medians of per-round ratios;
    each round also counts the requests prefetch answered from shares."""
    from . import throughput
    from .env import redis_server

    with redis_server() as url:
        print()
        print(f"gunicorn, 4 workers, wrk, median of {rounds} interleaved {seconds:g} s rounds:")
        print()
        print(
            "| workers | callers | bare | headers | floor | flask-quota | prefetch "
            "| memory, per worker | prefetch / bare | prefetch / headers "
            "| prefetch / headers, each round | headers / bare, each round "
            "| prefetch decides per request, each round | errors | memory / bare |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|")
        for count in threads:
            kind = "sync" if count == 1 else f"gthread x{count}"
            for users in (4, 10_000):
                results, _ = throughput.measure(
                    url, rounds, seconds, servers=GUNICORN, users=users, threads=count
                )
                rps = {name: r.rps for name, r in results.items()}
                ratio = {name: _median_ratio(r, results["bare"]) for name, r in results.items()}
                prefetch = results["flask-quota, prefetch"]
                per_round = [
                    a.requests / max(1, b.requests)
                    for a, b in zip(prefetch.runs, results["headers"].runs, strict=True)
                ]
                noise = [
                    a.requests / max(1, b.requests)
                    for a, b in zip(results["headers"].runs, results["bare"].runs, strict=True)
                ]
                errors = {name: r.errors for name, r in results.items() if r.errors}
                print(
                    f"| {kind} | {users:,} | {rps['bare']:.0f} | {rps['headers']:.0f} | "
                    f"{rps['floor']:.0f} | {rps['flask-quota']:.0f} | "
                    f"{rps['flask-quota, prefetch']:.0f} | {rps['flask-quota, memory']:.0f} | "
                    f"{ratio['flask-quota, prefetch']:.2f} | "
                    f"{_median_ratio(prefetch, results['headers']):.2f} | "
                    f"{' '.join(f'{r:.2f}' for r in per_round)} | "
                    f"{' '.join(f'{r:.2f}' for r in noise)} | "
                    f"{' '.join(f'{r.decides:.3f}' for r in prefetch.runs)} | "
                    f"{errors or '-'} | "
                    f"{ratio['flask-quota, memory']:.2f} |"
                )


def _median_ratio(runs: Throughput, bare: Throughput) -> float:
    """The median of per-round ratios to the bare app (rounds are interleaved, so a slow
    moment slows both sides of a ratio alike)."""
    pairs = zip(runs.runs, bare.runs, strict=True)
    ratios = sorted(a.requests / max(1, b.requests) for a, b in pairs)
    return ratios[len(ratios) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefetch", description=__doc__)
    parser.add_argument("--fraction", type=float, default=0.05, help="QUOTA_PREFETCH")
    parser.add_argument("--seconds", type=float, default=120.0, help="virtual seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--gunicorn",
        type=int,
        metavar="ROUNDS",
        default=0,
        help="also measure throughput under gunicorn and wrk, median of ROUNDS rounds",
    )
    args = parser.parse_args(argv)
    print(f"QUOTA_PREFETCH={args.fraction}, {WORKERS} workers, {args.seconds:g} s of traffic")
    print()
    print("| case | admitted vs exact | storage calls per request: exact → prefetch |")
    print("|---|---:|---:|")
    for case in CASES:
        exact, exact_calls, n = run(case, args.seconds, None, args.seed)
        got, calls, _ = run(case, args.seconds, args.fraction, args.seed)
        print(
            f"| {case.name} | {got:,} / {exact:,} = {got / exact:.1%} "
            f"| {exact_calls / n:.3f} → {calls / n:.3f} |"
        )
    if args.gunicorn:
        gunicorn_table(args.gunicorn, 5.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
