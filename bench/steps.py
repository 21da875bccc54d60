"""Instructions per call of each step of a memory-backend request: ``python -m bench.steps``.

The app is ``apps.quota_app("memory://")`` (three tiers, token bucket, callers
rotating over 1,000 identities, every caller's state already made). Each step
runs 500 times inside ``functools.reduce`` under callgrind, as in
``bench.profile``, and prints instructions per call. Subtract ``pushpop`` (a
request context pushed and popped) from the steps that push one.

* ``pushpop``: push and pop a request context (the harness of the steps below);
* ``before``: ``pushpop`` + flask-quota's ``before_request``;
* ``before_after``: ``pushpop`` + both hooks + building the ``Response``;
* ``response``: ``pushpop`` + building the ``Response`` (subtract it from ``before_after``);
* ``identify``: ``pushpop`` + finding the caller (the benchmark's identity loader);
* ``decide``: the storage call alone (``guard.decide_flat`` on a route's four checks);
* ``route``: the route lookup alone; ``keys``: the caller's four keys alone.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from itertools import count

from flask import g, request
from werkzeug.wrappers import Response

from .apps import PATH, USER_HEADER, quota_app
from .driver import caller_sequence

STEPS = ("pushpop", "before", "before_after", "response", "identify", "decide", "route", "keys")
N = 500


def steps() -> dict[str, Callable[[], object]]:
    """Every step, on one warmed-up app."""
    app = quota_app("memory://")
    state = app.extensions["quota"]
    quota = state.quota
    callers = caller_sequence(1000, 1000)
    client = app.test_client()
    for ip, user in callers:  # every caller's state exists
        client.get(PATH, headers={USER_HEADER: user}, environ_base={"REMOTE_ADDR": ip})
    contexts = [
        app.test_request_context(PATH, headers={USER_HEADER: u}, environ_base={"REMOTE_ADDR": ip})
        for ip, u in callers
    ]
    turn = count()
    # The app's own hooks (bound to its quota state when registered).
    (before_hook,) = (f for f in app.before_request_funcs[None] if "Quota" in f.__qualname__)
    (after_hook,) = (f for f in app.after_request_funcs[None] if "after_hook" in f.__qualname__)
    catalog = state.catalog()
    plan = catalog.resolve("b", "u1", fallback="b")
    spec = state.views[PATH.strip("/")][1][0]  # the view's one limit
    route = state.route(catalog, plan, "res", "GET", spec, "res", 1)
    keys = [route.keys(f"ip={ip}", f"id={u}", f"id={u}") for ip, u in callers]

    def within(body: Callable[[], object]) -> Callable[[], object]:
        def step() -> None:
            ctx = contexts[next(turn) % len(contexts)]
            ctx.push()
            body()
            ctx.pop()

        return step

    def before() -> None:
        before_hook()
        g.__dict__.pop("_quota")

    return {
        "pushpop": within(lambda: None),
        "before": within(before),
        "before_after": within(lambda: (before_hook(), after_hook(Response("ok")))),
        "response": within(lambda: Response("ok")),
        "identify": within(lambda: quota._identify(state.settings, request._get_current_object())),
        "decide": lambda: state.guard.decide_flat(route.calls, keys[next(turn) % len(keys)]),
        "route": lambda: state.route(catalog, plan, "res", "GET", spec, "res", 1),
        "keys": lambda: route.keys("ip=10.0.0.1", "id=u1", "id=u1"),
    }


def run_count(step: str) -> None:
    """The body run under callgrind: warm up, then ``N`` calls inside the marker."""
    fn = steps()[step]
    for _ in range(N):
        fn()
    functools.reduce(lambda _, __: fn(), range(N), None)


def callgrind(step: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        command = [
            "valgrind", "--tool=callgrind", "--collect-atstart=no",
            "--toggle-collect=functools_reduce", f"--callgrind-out-file={out}",
            sys.executable, "-m", "bench.steps", "--count", step,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind failed:\n{done.stderr[-3000:]}")
        with open(out) as f:
            found = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
    if found is None:
        raise RuntimeError("no instruction total in the callgrind output")
    return int(found.group(1)) / N


def main(argv: list[str]) -> int:
    if argv[:1] == ["--count"]:
        run_count(argv[1])
        return 0
    unknown = sorted(set(argv) - set(STEPS))
    if unknown:
        print(f"unknown step(s) {', '.join(unknown)}; use some of {', '.join(STEPS)}")
        return 2
    for step in argv or STEPS:
        print(f"{step}: {callgrind(step):,.0f} instructions per call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
