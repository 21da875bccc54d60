"""``python -m bench.trace``: the request path, counted: which flask-quota modules and
how many of their function calls one request runs, traced with ``sys.setprofile``.

Three requests through the test client on the bench's three-tier app (memory storage,
warm: routes, keys and shapes cached): one admitted, one denied (the endpoint tier
of ``1/hour``, after a first admitted request), one admitted on a route with a
concurrency lease. For each it prints the flask-quota modules entered, with their
calls, and the totals. Calls, not time: the same on every machine and every run.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

from flask import Flask

from .apps import PATH, USER_HEADER, quota_app

CASES: dict[str, Callable[[], Flask]] = {
    "admitted": lambda: quota_app("memory://"),
    "denied": lambda: quota_app("memory://", deny=True),
    "admitted, leased": lambda: quota_app("memory://", concurrent=4),
}


def trace(app: Flask, requests: int = 3) -> Counter[str]:
    """Calls per flask-quota module during the last of ``requests`` identical requests."""
    client = app.test_client()
    headers = {USER_HEADER: "u1"}
    for _ in range(requests - 1):
        client.get(PATH, headers=headers).close()
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith("flask_quota"):
                calls[module] += 1

    sys.setprofile(profile)
    try:
        client.get(PATH, headers=headers).close()
    finally:
        sys.setprofile(None)
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__)
    parser.parse_args(argv)
    for name, make in CASES.items():
        calls = trace(make())
        print(f"## {name}: {len(calls)} modules, {sum(calls.values())} calls")
        print()
        for module, count in sorted(calls.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"- {module}: {count}")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
