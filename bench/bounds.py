"""The least any standard-speaking limiter costs here: ``python -m bench.bounds``.

Issue 23's time goals compare flask-quota with a floor and with the bare app. Two
things every limiter that meets SPEC has to do, flask-quota included, can be
measured without any limiter at all:

* send the six rate-limit headers of SPEC section 4 (``QUOTA_HEADERS=both``, the
  default): the bare app plus an after-request hook adding the very headers
  flask-quota sends (``apps.standard_headers``), appended the way flask-quota
  appends them;
* in exact mode, ask the shared storage once per request: the bare app plus a
  before-request hook writing ``PING`` on a raw socket each process keeps open and
  reading ``+PONG``. No client library, no script, no key: the cheapest round trip
  there is. Beside it, the same raw socket carrying the floor's ``EVALSHA`` (``GET``
  and ``SET PX`` on the caller's three keys): the least state work a three-tier
  decision needs, with no client library and no decision in Python.

Each is measured in the same run as the cases the goals name, so the run shows
how close to each goal a limiter doing *nothing but* these could get:

1. through the Flask test client (``timing.run``, interleaved rounds), *added*
   latency over the bare app: the headers alone, the floor of ``compare`` with and
   without the headers, flask-quota (Redis and memory), Flask-Limiter;
2. under gunicorn (4 sync workers, wrk, interleaved rounds, ``throughput.measure``),
   throughput over the bare app's: the headers alone, the raw round trip with and
   without the headers, the raw floor script with the headers, the floor,
   flask-quota in exact mode and on each worker's own memory storage.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from flask import Flask, Response

from .apps import bare_app, bound_app, header_hook, limiter_app, quota_app, standard_headers
from .compare import client_cases, floor_app
from .driver import caller_sequence
from .env import WORKDIR, machine, redis_server
from .throughput import Throughput
from .throughput import measure as measure_throughput
from .timing import Case, added, run, spread

CLIENT_LABELS = {
    "bare": "bare Flask app (baseline)",
    "headers": "bare app + SPEC's six rate-limit headers (no limiter)",
    "floor": "floor: bare app + one EVALSHA (GET + SET PX on 3 keys)",
    "floor+headers": "floor + the six headers",
    "q/redis": "flask-quota, Redis, token_bucket, 3 tiers",
    "q/mem": "flask-quota, memory://, token_bucket, 3 tiers",
    "fl/redis/h1": "Flask-Limiter, Redis, fixed-window, 3 limits, headers on",
    "fl/mem/h0": "Flask-Limiter, memory://, fixed-window, 3 limits, no headers",
}

SERVERS: dict[str, dict[str, str]] = {
    "bare": {"BENCH_APP": "bare"},
    "headers": {"BENCH_APP": "headers"},
    "ping": {"BENCH_APP": "ping"},
    "ping+headers": {"BENCH_APP": "ping-headers"},
    "raw floor+headers": {"BENCH_APP": "raw-floor-headers"},
    "floor": {"BENCH_APP": "floor"},
    "flask-quota": {"BENCH_APP": "quota", "BENCH_ALGORITHM": "token_bucket"},
    "flask-quota, memory per worker": {
        "BENCH_APP": "quota",
        "BENCH_ALGORITHM": "token_bucket",
        "BENCH_STORAGE_URL": "memory://",
    },
}
SERVER_LABELS = {
    "bare": "bare Flask app (baseline)",
    "headers": "bare app + the six headers (no limiter)",
    "ping": "bare app + one raw-socket PING per request",
    "ping+headers": "bare app + raw PING + the six headers",
    "raw floor+headers": "bare app + the floor's EVALSHA on a raw socket + the six headers",
    "floor": "floor: one redis-py EVALSHA (GET + SET PX on 3 keys)",
    "flask-quota": "flask-quota, Redis, exact mode",
    "flask-quota, memory per worker": "flask-quota, each worker's own memory://",
}


def cases(redis_url: str) -> list[Case]:
    callers = caller_sequence(1000, 1000)
    six = standard_headers()
    apps: dict[str, Callable[[], Flask]] = {
        "bare": bare_app,
        "headers": lambda: bound_app(six),
        "floor": lambda: floor_app(redis_url, callers),
        "floor+headers": lambda: _with(floor_app(redis_url, callers), header_hook(six)),
        "q/redis": lambda: quota_app(redis_url),
        "q/mem": lambda: quota_app("memory://"),
        "fl/redis/h1": lambda: limiter_app(redis_url, headers=True),
        "fl/mem/h0": lambda: limiter_app("memory://"),
    }
    return client_cases(apps, callers)


def _with(app: Flask, hook: Callable[[Response], Response]) -> Flask:
    app.after_request(hook)
    return app


def report(
    host: dict[str, str],
    client: dict[str, float],
    quartiles: dict[str, tuple[float, float]],
    servers: dict[str, Throughput],
    generator: str,
    rounds: tuple[int, int, int, float],
) -> str:
    c_rounds, batch, g_rounds, seconds = rounds
    out = [
        "# What any standard-speaking limiter costs at the least (`python -m bench.bounds`)",
        "",
        *(f"- {k}: {v}" for k, v in host.items()),
        "",
        "## 1. Through the Flask test client",
        "",
        f"{c_rounds} interleaved rounds of {batch} `GET /res` per case, 1,000 rotating "
        "callers; *added* is the median over rounds of (case - bare app) in the same round.",
        "",
        "| case | added (us) | quartiles (us) |",
        "|---|---:|---|",
    ]
    for key, label in CLIENT_LABELS.items():
        lo, hi = quartiles[key]
        out.append(f"| {label} | {client[key]:.1f} | {lo:.1f} .. {hi:.1f} |")
    floor, headers, with_headers = client["floor"], client["headers"], client["floor+headers"]
    fl_h1, fl_mem = client["fl/redis/h1"], client["fl/mem/h0"]
    out += [
        "",
        "| issue 23's goal | goal | flask-quota | the best a limiter doing only the floor's "
        "call and the headers could show |",
        "|---|---:|---:|---:|",
        f"| Redis: ours / floor | <= 1.05x | {client['q/redis'] / floor:.2f}x | "
        f"(floor + headers) / floor = {with_headers / floor:.2f}x |",
        f"| Redis: Flask-Limiter (headers on) / ours | >= 4.5x | "
        f"{fl_h1 / client['q/redis']:.2f}x | Flask-Limiter / (floor + headers) = "
        f"{fl_h1 / with_headers:.2f}x |",
        f"| memory: Flask-Limiter / ours | >= 8x | {fl_mem / client['q/mem']:.2f}x | "
        f"Flask-Limiter / headers = {fl_mem / headers:.2f}x, leaving "
        f"{fl_mem / 8 - headers:.1f} us for all the rest |",
        "",
        "## 2. Under gunicorn (4 sync workers)",
        "",
        f"{g_rounds} interleaved rounds of {seconds:.0f} s per server, load from {generator} "
        "(2 threads, 16 connections, 10,000 rotating `X-User`s); ratios are medians of "
        "per-round ratios to the bare app.",
        "",
        "| server | req/s | / bare | CPU us per request: gunicorn | redis-server | load |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    bare = servers["bare"]
    for key, label in SERVER_LABELS.items():
        s = servers[key]
        out.append(
            f"| {label} | {s.rps:.0f} | {s.ratio(bare):.2f}x | {s.cpu('gunicorn'):.0f} | "
            f"{s.cpu('redis-server'):.0f} | {s.cpu('load generator'):.0f} |"
        )
    errors = {k: s.errors for k, s in servers.items() if s.errors}
    out += [
        "",
        f"Non-2xx answers or socket errors: {errors or 'none'}.",
        "",
        "| issue 23's goal | goal | flask-quota | the best a limiter doing only this could show |",
        "|---|---:|---:|---:|",
        f"| exact mode / bare | >= 0.80x | {servers['flask-quota'].ratio(bare):.2f}x | "
        f"raw PING + headers: {servers['ping+headers'].ratio(bare):.2f}x; the floor's script "
        f"on a raw socket + headers: {servers['raw floor+headers'].ratio(bare):.2f}x |",
        f"| prefetch (busy callers) / bare | >= 0.90x | (`bench.prefetch`) | headers alone: "
        f"{servers['headers'].ratio(bare):.2f}x; each worker's own memory storage: "
        f"{servers['flask-quota, memory per worker'].ratio(bare):.2f}x |",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bounds", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run (about a minute)")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="markdown file to write (default: bench/bounds.md, or bench/.work/bounds.md "
        "for --quick)",
    )
    ns = parser.parse_args(argv)
    if ns.output is None:  # a smoke run must not replace the full results
        ns.output = WORKDIR / "bounds.md" if ns.quick else Path(__file__).with_name("bounds.md")
    c_rounds, batch, g_rounds, seconds = (20, 20, 1, 2.0) if ns.quick else (200, 100, 5, 5.0)
    started, host = time.monotonic(), machine()  # the date and load at the start
    with redis_server() as url:
        measured = cases(url)
        run(measured, c_rounds, batch)
        bare = measured[0]
        client = {c.key: added(c, bare) for c in measured}
        quartiles = {c.key: spread(c, bare) for c in measured}
        servers, generator = measure_throughput(url, g_rounds, seconds, servers=SERVERS)
    text = report(host, client, quartiles, servers, generator, (c_rounds, batch, g_rounds, seconds))
    text += f"\nRun took {time.monotonic() - started:.0f} s.\n"
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    ns.output.write_text(text)
    print(text)
    print(f"wrote {ns.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
