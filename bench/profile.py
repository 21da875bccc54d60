"""Where a request's time goes: ``python -m bench.profile``.

Each case is one app of ``compare``/``apps`` (three tiers, token bucket, callers
rotating over 1,000 identities) called straight through ``app.wsgi_app``:

* ``--cprofile``: cProfile over N requests; prints, per function, the time spent
  in it per request (tottime) and below it (cumtime), in microseconds. cProfile
  inflates small calls, so read it for *where*, and the instruction counts for
  *how much*.
* default: instructions per request, counted by callgrind (valgrind must be
  installed). The case re-runs itself under ``valgrind --tool=callgrind`` with
  collection switched on only inside the timed loop (the loop runs under
  ``functools.reduce``, which nothing else in a request calls), so imports, app
  set-up and warm-up are not counted. Instruction counts barely move with the
  machine's load: use them to compare two versions of the code. flask-quota's
  own cases are the exception, moving by some 35,000 per request from run to
  run (bench/README.md, "Client side, round three"): count the two versions
  side by side, at the same time.

Cases: bare, hook (empty before_request), floor (one EVALSHA of
``compare.FLOOR_SCRIPT``), mem (flask-quota on memory://), mem-h0 (the same with
``QUOTA_HEADERS=none``: what our six headers cost), redis (flask-quota on Redis),
redis-pyparser (the same with redis-py's pure-Python reply parser instead of
hiredis: the difference is what hiredis saves). The newer tiers, each next to
``redis`` (the measured request is the same ``GET /res``):

* redis-tenant-unused: the plan has a ``tenant`` tier, the caller's Identity no tenant;
* redis-tenant: the caller has a tenant (one of ten): the tenant tier's own cost;
* redis-lease-unused: another view (never requested) has ``concurrent=2``, this one none;
* redis-lease: the view has ``@quota.limit(resource="res", concurrent=2)``: a lease
  taken with the decision and given back after the response;
* redis-calendar-unused: another resource of the plan (its view never requested) is
  ``1000/month``, the measured one is not;
* redis-calendar: the measured resource is ``100000000/month``.

And redis-prefetch: ``QUOTA_PREFETCH=0.05`` with four busy callers (every other case
rotates over 1,000), so nearly every request is answered from shares in hand;
redis-prefetch-cold: the same app on 20,000 rotating callers, whose own buckets are
too cold for shares (each is seen again after the sync interval): each request asks
Redis, as ``redis`` does, and only the per-IP tier is busy; redis-cold: exact mode on
those 20,000 callers, so that the two differ only by the prefetch layer.

Redis cases start their own redis-server.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from flask import Flask
from redis._parsers import _RESP2Parser

from flask_quota import Quota

from .apps import ALLOW, RESOURCE, bare_app, limiter_app, quota_app
from .compare import ClientDriver, floor_app, hook_app
from .driver import WsgiDriver, caller_sequence
from .env import redis_server

MARK = "functools_reduce"  # the C function callgrind collects inside


def tenant_unused_app(url: str) -> Flask:
    return quota_app(url, plan_extra={"tenant": ALLOW})


def tenant_app(url: str) -> Flask:
    return quota_app(url, plan_extra={"tenant": ALLOW}, tenant=True)


def lease_unused_app(url: str) -> Flask:
    def leased_view(app: Flask, quota: Quota) -> None:
        @app.get("/leased")
        @quota.limit(resource="leased", rate=ALLOW, concurrent=2)
        def leased() -> str:
            return "ok"

    return quota_app(url, more=leased_view)


def lease_app(url: str) -> Flask:
    return quota_app(url, concurrent=2)


def calendar_unused_app(url: str) -> Flask:
    def monthly_view(app: Flask, quota: Quota) -> None:
        @app.get("/monthly")
        @quota.limit(resource="monthly")
        def monthly() -> str:
            return "ok"

    resources = {RESOURCE: ALLOW, "monthly": "1000/month"}
    return quota_app(url, plan_extra={"resources": resources}, more=monthly_view)


def calendar_app(url: str) -> Flask:
    return quota_app(url, plan_extra={"resources": {RESOURCE: "100000000/month"}})


TIER_CASES: dict[str, Callable[[str], Flask]] = {
    "redis-tenant-unused": tenant_unused_app,
    "redis-tenant": tenant_app,
    "redis-lease-unused": lease_unused_app,
    "redis-lease": lease_app,
    "redis-calendar-unused": calendar_unused_app,
    "redis-calendar": calendar_app,
}
LIMITER_CASES: dict[str, Callable[[str], Flask]] = {
    "fl-mem": lambda url: limiter_app("memory://"),
    "fl-mem-h1": lambda url: limiter_app("memory://", headers=True),
    "fl-redis": lambda url: limiter_app(url),
    "fl-redis-h1": lambda url: limiter_app(url, headers=True),
}
CASES = (
    "bare", "hook", "floor", "mem", "mem-h0", "redis", "redis-pyparser", "redis-prefetch",
    "redis-prefetch-cold", "redis-cold", *TIER_CASES,
    *LIMITER_CASES,
)  # fmt: skip
REDIS_CASES = (
    "floor", "redis", "redis-pyparser", "redis-prefetch", "redis-prefetch-cold", "redis-cold",
    *TIER_CASES, "fl-redis", "fl-redis-h1",
)  # fmt: skip
# Callers each case rotates over (every other case: 1,000).
POPULATIONS = {"redis-prefetch": 4, "redis-prefetch-cold": 20_000, "redis-cold": 20_000}
# (label, numerator, denominator) of the must-shows, over bare.
RATIOS = (
    ("Redis: flask-quota / floor", "redis", "floor"),
    ("Redis: Flask-Limiter (headers on) / flask-quota", "fl-redis-h1", "redis"),
    ("Redis: Flask-Limiter (headers off) / flask-quota", "fl-redis", "redis"),
    ("memory: Flask-Limiter (headers off) / flask-quota", "fl-mem", "mem"),
    ("memory: Flask-Limiter (headers on) / flask-quota", "fl-mem-h1", "mem"),
)


def make_app(case: str, url: str, callers: list[tuple[str, str]]) -> Flask:
    if case in TIER_CASES:
        return TIER_CASES[case](url)
    if case in LIMITER_CASES:
        return LIMITER_CASES[case](url)
    if case == "bare":
        return bare_app()
    if case == "hook":
        return hook_app()
    if case == "floor":
        return floor_app(url, callers)
    if case == "mem":
        return quota_app("memory://")
    if case == "mem-h0":
        return quota_app("memory://", headers="none")
    if case in ("redis", "redis-cold"):
        return quota_app(url)
    if case in ("redis-prefetch", "redis-prefetch-cold"):
        return quota_app(url, prefetch=0.05)
    if case == "redis-pyparser":
        app = quota_app(url)
        storage = app.extensions["quota"].storage
        storage = getattr(storage, "storage", storage)  # inside the deny cache
        # Connections are made on first use, from these arguments.
        storage.client.connection_pool.connection_kwargs["parser_class"] = _RESP2Parser
        return app
    raise ValueError(f"unknown case {case!r}; use one of {', '.join(CASES)}")


@contextmanager
def _server(case: str, url: str | None) -> Iterator[str]:
    if url is not None or case not in REDIS_CASES:
        yield url or ""
    else:
        with redis_server() as started:
            yield started


class _TestClientDriver(ClientDriver):
    def expect(self, code: str) -> None:
        self.expect_ok()


def driver_for(case: str, url: str, client: bool = False) -> WsgiDriver | _TestClientDriver:
    population = POPULATIONS.get(case, 1000)
    callers = caller_sequence(population, max(population, 1000))
    app = make_app(case, url, callers)
    driver = _TestClientDriver(app, callers) if client else WsgiDriver(app, callers)
    for _ in range(1000):  # warm: every caller's state exists, caches are filled
        driver()
    driver.expect("200")
    return driver


def loop(driver: Callable[[], None], n: int) -> None:
    """Call ``driver`` ``n`` times inside ``functools.reduce`` (callgrind's marker)."""
    functools.reduce(lambda _, __: driver(), range(n), None)


def run_cprofile(case: str, url: str, n: int, top: int, client: bool) -> None:
    driver = driver_for(case, url, client)
    profile = cProfile.Profile()
    profile.enable()
    loop(driver, n)
    profile.disable()
    driver.expect("200")
    stats = pstats.Stats(profile)
    rows = []
    for (file, line, name), (_cc, calls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{os.path.basename(file)}:{line}({name})" if line else name
        rows.append((tt / n * 1e6, ct / n * 1e6, calls / n, where))
    total = sum(r[0] for r in rows)
    print(f"{case}: {n} requests under cProfile, {total:.1f} us per request (profiled)")
    print(f"{'tottime us/req':>14} {'cumtime us/req':>14} {'calls/req':>9}  function")
    for tt, ct, calls, where in sorted(rows, reverse=True)[:top]:
        print(f"{tt:14.2f} {ct:14.2f} {calls:9.2f}  {where}")


def run_count(case: str, url: str, n: int, client: bool) -> None:
    """The body run under callgrind: warm up, then ``n`` requests inside the marker."""
    driver = driver_for(case, url, client)
    loop(driver, n)
    driver.expect("200")


def callgrind(case: str, url: str, n: int, client: bool) -> float:
    """Instructions per request of ``case`` (client side: Redis runs in its own process)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        command = [
            "valgrind", "--tool=callgrind", "--collect-atstart=no",
            f"--toggle-collect={MARK}", f"--callgrind-out-file={out}",
            sys.executable, "-m", "bench.profile", "--count", str(n), "--url", url, case,
            *(["--client"] if client else []),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind failed:\n{done.stderr[-3000:]}")
        with open(out) as f:
            text = f.read()
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if found is None:
        raise RuntimeError("no instruction total in the callgrind output")
    return int(found.group(1)) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    # No ``choices``: argparse checks a list default against them as one value and fails.
    parser.add_argument("cases", nargs="*", help=f"some of {', '.join(CASES)} (default: all)")
    parser.add_argument("-n", type=int, default=2000, help="requests measured per case")
    parser.add_argument("--cprofile", action="store_true", help="cProfile instead of callgrind")
    parser.add_argument("--top", type=int, default=30, help="functions shown by --cprofile")
    parser.add_argument("--url", help="an existing redis:// URL (default: start one)")
    parser.add_argument("--client", action="store_true", help="through app.test_client()")
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)  # the callgrind child
    ns = parser.parse_args(argv)
    unknown = sorted(set(ns.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; use some of {', '.join(CASES)}")
    ns.cases = ns.cases or list(CASES)
    if ns.count is not None:
        run_count(ns.cases[0], ns.url, ns.count, ns.client)
        return 0
    needs_redis = any(c in REDIS_CASES for c in ns.cases)
    counts: dict[str, float] = {}
    with _server("redis", ns.url) if needs_redis else nullcontext("") as url:
        for case in ns.cases:
            if ns.cprofile:
                run_cprofile(case, url, ns.n, ns.top, ns.client)
            else:
                counts[case] = callgrind(case, url, ns.n, ns.client)
                print(f"{case}: {counts[case]:,.0f} instructions per request")
            sys.stdout.flush()
    print_ratios(counts)
    return 0


def print_ratios(counts: dict[str, float]) -> None:
    """Each case's instructions over ``bare``, and the must-show ratios of those."""
    if "bare" not in counts:
        return
    added = {case: count - counts["bare"] for case, count in counts.items() if case != "bare"}
    print("added over bare:")
    for case, extra in added.items():
        print(f"  {case}: {extra:,.0f}")
    for label, top, bottom in RATIOS:
        if top in added and bottom in added and added[bottom] > 0:
            print(f"{label}: {added[top] / added[bottom]:.3f}")


if __name__ == "__main__":
    sys.exit(main())
