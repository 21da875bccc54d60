"""How many decisions one Redis core sustains: ``python -m bench.capacity``.

Not part of a run. On a redis-server of its own (``env.redis_server``):

* **measured**: ``--processes`` client processes (default 8) each send the real
  decide call of a three-tier token-bucket request (``redis_side.decision_calls
  ("tb-3")``: 1,000 callers' checks and keys, encoded by ``RedisStorage``'s own
  ``pack``, so the bytes are what the request path sends: an ``FCALL``), pipelined
  ``--pipeline`` calls at a time, for ``--seconds`` (default 10): by default 50 (the
  script's cost, the server's per-read work shared by 50 calls) and 1 (one call per
  round trip, as a request sends it: each call pays its own read, write and wake-up). The
  server's CPU is ``INFO cpu`` (``used_cpu_sys`` + ``used_cpu_user``) read before the
  clients start and after the last has finished; every reply is checked (a denied
  or failed decision is counted and reported). Printed: decisions per second, redis
  CPU microseconds per decision and decisions per redis CPU second (= per fully
  used core: the server runs commands on one thread). The floor script
  (``compare.FLOOR_SCRIPT``, 3 ``GET`` + 3 ``SET PX`` on the same keys, an
  ``EVALSHA``) is driven the same way. Rounds alternate every setup (``--rounds``,
  default 3; medians printed); the database is flushed between runs (the floor writes
  the keys the decide call reads);
* **cross-check** (skipped with ``--no-instructions``): ``redis_side``'s
  instructions per decision of both (callgrind, ``decision_instructions``). The
  floor's count over its measured CPU per call gives the instructions one core of
  this machine runs per second in redis-server (as callgrind counts them: reading,
  running and answering calls; the kernel's side of a call is not counted but takes
  CPU, so the rate is per pipeline size); at that rate the decide call's count
  predicts its decisions per core. Then the two together: the decide call's
  instructions over the floor's, for its CPU over the floor's, give the rate of the
  instructions alone and what a call costs besides them (per pipeline size);
* **prefetch**: with ``QUOTA_PREFETCH`` the storage sees fewer calls.
  ``bench.prefetch``'s simulation (60 s, seed 1, ``QUOTA_PREFETCH=0.05``) gives the
  storage calls per request of busy callers at their limit (token bucket
  ``6000/minute`` and ``600/minute``, traffic 1x); callers whose buckets are cold make one call per
  request, prefetch or not. Requests per core = decisions per core / calls per request.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import socket
import statistics
import sys
import time
from multiprocessing.synchronize import Event
from typing import Any

import redis

from flask_quota.storage.redis import RedisStorage

from .compare import FLOOR_SCRIPT
from .env import machine, redis_server
from .prefetch import CASES as PREFETCH_CASES
from .prefetch import run as prefetch_run
from .redis_side import decision_calls, decision_instructions

CALLS = ("decide", "floor")
# gunicorn (4 sync workers) serving flask-quota, three tiers, Redis, on this machine:
# README's Benchmarks table (bench/results.md, 2026-12-02 02:19 UTC).
APP_SERVER_RPS = 2305
# Busy callers at their limit, bench.prefetch's cases (a limit well above a share, and
# one where a share is a few units).
BUSY_CASES = (
    "token_bucket 6000/minute, traffic 1x the limit",
    "token_bucket 600/minute, traffic 1x the limit",
)


def packed_calls(kind: str, url: str) -> list[bytes]:
    """The RESP bytes of 1,000 callers' calls of ``kind`` (see the module doc)."""
    client = redis.Redis.from_url(url)
    calls = decision_calls("tb-3")
    if kind == "floor":
        sha = client.script_load(FLOOR_SCRIPT)
        conn = client.connection_pool.make_connection()
        pack: Any = conn.pack_command  # redis-py leaves it untyped
        return [b"".join(pack("EVALSHA", sha, 3, *keys[1:], 1, 5)) for _, keys in calls]
    storage = RedisStorage(client)
    storage.decide_flat(*calls[0])  # loads the library: the calls below are FCALLs
    packed = [storage._decide.pack("decide", b"", checks, keys) for checks, keys in calls]
    storage.close()
    return packed


def drive(kind: str, url: str, pipeline: int, offset: int, ready: Any, go: Event,
          stop: Event, out: Any) -> None:  # fmt: skip
    """One client process: pipelines of ``pipeline`` calls until ``stop``; puts
    (calls answered, calls not allowed or failed) on ``out``. A raw socket and
    hiredis's reader, so that the clients, sharing the machine with the server, spend
    as little CPU as they can per call."""
    import hiredis  # flask-quota[hiredis], which bench/run.sh installs

    packed = packed_calls(kind, url)
    packed = packed[offset:] + packed[:offset]  # each process starts at other callers
    batches = [
        (b"".join(packed[i : i + pipeline]), len(packed[i : i + pipeline]))
        for i in range(0, len(packed), pipeline)
    ]
    address = redis.Redis.from_url(url).connection_pool.connection_kwargs
    sock = socket.create_connection((address["host"], address["port"]))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()
    done = bad = 0
    ready.put(1)
    go.wait()
    while not stop.is_set():
        for batch, size in batches:
            sock.sendall(batch)
            got = 0
            while got < size:
                reader.feed(sock.recv(1 << 20))
                reply = reader.gets()
                while reply is not False:
                    got += 1
                    if kind == "decide":
                        bad += not isinstance(reply, list) or reply[1] not in (1, 2)  # long, short
                    else:
                        bad += reply != 1
                    reply = reader.gets()
            done += size
            if stop.is_set():
                break
    sock.close()
    out.put((done, bad))


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def measure(kind: str, url: str, processes: int, pipeline: int, seconds: float) -> dict[str, float]:
    """One run of ``kind``: decisions per second, CPU per decision, per core."""
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    workers = [
        ctx.Process(target=drive, args=(kind, url, pipeline, i * 1000 // processes, ready, go,
                                        stop, out))
        for i in range(processes)
    ]  # fmt: skip
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=120)  # each has its calls packed and its connection open
    client = redis.Redis.from_url(url)
    cpu, wall = redis_cpu(client), time.perf_counter()
    go.set()
    time.sleep(seconds)
    stop.set()
    results: list[tuple[int, int]] = []
    while len(results) < len(workers):  # the last call answered: the clock stops here
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"client process(es) failed: exit codes {failed}") from None
    wall, cpu = time.perf_counter() - wall, redis_cpu(client) - cpu
    for w in workers:
        w.join()
    client.flushall()
    client.close()
    done = sum(r[0] for r in results)
    return {
        "calls": done,
        "bad": sum(r[1] for r in results),
        "wall": wall,
        "cpu": cpu,
        "per_second": done / wall,
        "cpu_us": cpu / done * 1e6,
        "per_core": done / cpu,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument(
        "--pipeline", type=int, nargs="+", default=[50, 1],
        help="calls per round trip; each is measured (1: one call per round trip, as a "
        "request makes it)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-instructions", action="store_true", help="skip the callgrind counts")
    args = parser.parse_args(argv)
    info = machine()
    load = info["load average at start"]
    print(f"{info['date']}, {info['nproc']} cores ({info['cpu']}), redis-server "
          f"{info['redis-server']}, load average at start {load}")  # fmt: skip
    print(f"{args.processes} processes, pipelines of {args.pipeline}, {args.seconds:g} s per "
          f"run, {args.rounds} rounds")  # fmt: skip
    print()
    setups = [(kind, pipeline) for pipeline in args.pipeline for kind in CALLS]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {setup: [] for setup in setups}
    with redis_server() as url:
        for r in range(args.rounds):
            for kind, pipeline in setups:
                m = measure(kind, url, args.processes, pipeline, args.seconds)
                runs[kind, pipeline].append(m)
                print(f"round {r + 1}, {kind}, pipeline {pipeline}: {m['calls']:,.0f} calls in "
                      f"{m['wall']:.2f} s = {m['per_second']:,.0f}/s, redis CPU {m['cpu']:.2f} s "
                      f"({m['cpu'] / m['wall']:.0%} of a core) = {m['cpu_us']:.2f} us per call "
                      f"= {m['per_core']:,.0f} per redis CPU second; not allowed or failed: "
                      f"{m['bad']:,.0f}", flush=True)  # fmt: skip
    median = {
        setup: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for setup, ms in runs.items()
    }
    print()
    print(f"median of {args.rounds} rounds:")
    print()
    print("| call | calls per round trip | calls per second | redis CPU per call "
          "| calls per fully used redis core |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for (kind, pipeline), m in median.items():
        print(f"| {kind} | {pipeline} | {m['per_second']:,.0f} | {m['cpu_us']:.2f} us "
              f"| {m['per_core']:,.0f} |")  # fmt: skip
    if not args.no_instructions:
        counts = dict(decision_instructions(["floor", "tb-3"]))
        print()
        floor, decide = counts["floor"], counts["tb-3"]
        print(f"callgrind (redis_side.decision_instructions), redis-server instructions per "
              f"call: floor {floor:,.0f}, decide (tb-3) {decide:,.0f}")  # fmt: skip
        for pipeline in args.pipeline:
            ips = counts["floor"] * median["floor", pipeline]["per_core"]
            per_core = median["decide", pipeline]["per_core"]
            print(f"pipeline {pipeline}: the floor's count x its calls per redis CPU second = "
                  f"{ips / 1e9:.3f} G counted instructions per second of one core; at that "
                  f"rate decide would do {ips / counts['tb-3']:,.0f} per core (measured: "
                  f"{per_core:,.0f}, i.e. {counts['tb-3'] * per_core / 1e9:.3f} G counted "
                  "instructions per second)")  # fmt: skip
        # Two calls, one machine: a call costs a fixed part per call (the event loop, the
        # kernel's side of reading and answering: callgrind counts neither) plus its
        # counted instructions at some rate. The decide call's instructions over the
        # floor's, against its CPU over the floor's, give that rate without the fixed part.
        for pipeline in args.pipeline:
            more_us = median["decide", pipeline]["cpu_us"] - median["floor", pipeline]["cpu_us"]
            rate = (decide - floor) / more_us * 1e6  # counted instructions per CPU second
            fixed = median["floor", pipeline]["cpu_us"] - floor / rate * 1e6
            print(f"pipeline {pipeline}: decide - floor = {decide - floor:,.0f} counted "
                  f"instructions for {more_us:.2f} us of redis CPU = {rate / 1e9:.3f} G per "
                  f"second; the rest of a call, not counted: {fixed:.2f} us")  # fmt: skip
    busy: list[tuple[str, float]] = []
    print()
    for name in BUSY_CASES:
        case = next(c for c in PREFETCH_CASES if c.name == name)
        got, calls, n = prefetch_run(case, 60.0, 0.05, 1)
        exact, exact_calls, _ = prefetch_run(case, 60.0, None, 1)
        busy.append((name, calls / n))
        print(f"bench.prefetch, {name}, 60 s, QUOTA_PREFETCH=0.05: storage calls per "
              f"request {exact_calls / n:.3f} exact, {calls / n:.3f} with prefetch "
              f"(admitted {got:,} of the exact {exact:,})")  # fmt: skip
    print()
    print(f"requests per second one Redis core takes, and app servers at {APP_SERVER_RPS} "
          "req/s each (gunicorn, 4 workers, flask-quota on Redis, README's Benchmarks "
          "table), by calls per round trip:")  # fmt: skip
    print()
    print("| traffic | storage calls per request | "
          + " | ".join(f"pipeline {p}: requests per core | app servers" for p in args.pipeline)
          + " |")  # fmt: skip
    print("|---|---:|" + "---:|---:|" * len(args.pipeline))
    rows = [
        ("no prefetch (any traffic)", 1.0),
        ("prefetch, 10,000 cold callers", 1.0),
        *((f"prefetch, busy callers at their limit ({name.split(',')[0]})", c) for name, c in busy),
    ]
    for name, per_request in rows:
        cells = []
        for pipeline in args.pipeline:
            rps = median["decide", pipeline]["per_core"] / per_request
            cells.append(f"{rps:,.0f} | {rps / APP_SERVER_RPS:.1f}")
        print(f"| {name} | {per_request:.3f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
