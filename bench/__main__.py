"""``python -m bench [--quick] [--only SECTION ...]``: run the benchmarks, write results.md."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import redis

from . import compare, footprint, growth, latency, report, roundtrips, throughput
from .env import WORKDIR, machine, redis_server

SECTIONS = ("roundtrips", "latency", "throughput", "footprint", "growth", "compare")


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run of about 1-2 minutes")
    parser.add_argument(
        "--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="markdown file to write (default: bench/results.md for a full run of every "
        "section, bench/.work/results-partial.md for --quick or --only)",
    )
    ns = parser.parse_args(argv)
    quick: bool = ns.quick
    if ns.output is None:  # a smoke or partial run must not replace the full results
        full = not quick and set(ns.only) == set(SECTIONS)
        partial = WORKDIR / "results-partial.md"
        ns.output = Path(__file__).with_name("results.md") if full else partial
        ns.output.parent.mkdir(exist_ok=True)
    results = report.Results(machine=machine(), quick=quick, command=_command(argv))
    started = time.monotonic()
    with redis_server() as url:
        # FLUSHALL after a million identities can take longer than redis-py 8's
        # default 5 s read timeout on a loaded machine.
        client = redis.Redis.from_url(url, socket_timeout=300)
        _log(f"redis-server at {url}; sections: {' '.join(ns.only)}")
        if "roundtrips" in ns.only:
            _log("1/6 round trips per request")
            results.roundtrips = roundtrips.measure(url, requests=10 if quick else 20)
            client.flushall()
        if "latency" in ns.only:
            rounds, batch = (10, 50) if quick else (40, 100)
            _log(f"2/6 in-process latency ({rounds} interleaved rounds of {batch} requests)")
            results.latency = latency.measure(url, rounds, batch)
            results.latency_rounds = (rounds, batch)
            client.flushall()
        if "throughput" in ns.only:
            rounds, seconds = (1, 3.0) if quick else (5, 5.0)
            _log(f"3/6 gunicorn throughput ({rounds} rounds of {seconds:.0f} s per server)")
            results.throughput, results.load_generator = throughput.measure(url, rounds, seconds)
            results.throughput_rounds = (rounds, seconds)
            client.flushall()
        if "footprint" in ns.only:
            callers = 1000 if quick else 5000
            _log(f"4/6 memory per key: Redis ({callers} callers per algorithm)")
            results.redis_footprint = footprint.redis_footprint(url, callers)
            big, small = (100_000, 30_000) if quick else (1_000_000, 100_000)
            for algorithm in latency.SHORT:
                keys = big if algorithm == "token_bucket" else small
                _log(f"4/6 memory per key: memory backend, {algorithm}, {keys} keys")
                results.process_footprint.append(footprint.process_footprint(algorithm, keys))
            client.flushall()
        if "growth" in ns.only:
            populations = (1000, 10_000, 100_000) if quick else (1000, 10_000, 100_000, 1_000_000)
            rounds, batch = (8, 50) if quick else (20, 100)
            _log(f"5/6 growth with active identities {populations}")
            results.growth = growth.measure(url, populations, rounds, batch)
            results.growth_rounds = (rounds, batch)
            client.flushall()
        if "compare" in ns.only:
            rounds, batch = (60, 50) if quick else (200, 100)
            _log(f"6/6 side by side through the test client ({rounds} rounds of {batch})")
            results.compare = compare.measure(url, rounds, batch)
            results.compare_rounds = (rounds, batch)
            _log(f"6/6 {compare.summary(results.compare)}")
            client.flushall()
        client.close()
    results.seconds = time.monotonic() - started
    text = report.render(results)
    ns.output.write_text(text)
    print(text)
    _log(f"done in {results.seconds:.0f} s; wrote {ns.output}")
    return 0


def _command(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join([".venv/bin/python -m bench", *args])


if __name__ == "__main__":
    sys.exit(main())
