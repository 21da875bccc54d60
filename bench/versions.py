"""``python -m bench.versions BEFORE AFTER``: the latency flask-quota adds per request,
two checkouts of it side by side in one run (a change's cost, e.g. a refactor's).

``BEFORE`` and ``AFTER`` are directories holding a checkout each (``git worktree add``).
Each gets a worker process started in its directory, so it imports its own
``flask_quota``; the workers build the bench's apps (``bench.apps``: the bare app and
flask-quota's three tiers, on Redis and on ``memory://``) and time ``--batch``
requests through the Flask test client per case and round, callers rotating. Rounds
alternate between the two workers (one measures while the other waits), so a slow
moment of the machine falls on both. Printed: per case, the median over rounds of the
time added over the same worker's bare app, and AFTER's over BEFORE's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

CASES = ("q/redis", "q/mem")


# A worker: run with ``python -c`` in a checkout, so it imports that checkout's
# ``bench.apps`` and ``flask_quota`` (an older checkout need not have this module).
# It builds the apps, then times one batch of each for every line on its stdin.
_WORKER = """
import json, sys, time
from bench.apps import PATH, USER_HEADER, bare_app, quota_app

redis_url, batch = sys.argv[1], int(sys.argv[2])
apps = {"bare": bare_app(), "q/redis": quota_app(redis_url), "q/mem": quota_app("memory://")}
clients = {name: app.test_client() for name, app in apps.items()}
users = [f"u{i}" for i in range(1000)]
for client in clients.values():  # warm: routes, keys, connections, scripts
    for user in users[:200]:
        client.get(PATH, headers={USER_HEADER: user}).close()
print("ready", flush=True)
offset = 0
for _ in sys.stdin:
    timings = {}
    for name, client in clients.items():
        start = time.perf_counter()
        for i in range(batch):
            client.get(PATH, headers={USER_HEADER: users[(offset + i) % len(users)]}).close()
        timings[name] = (time.perf_counter() - start) / batch * 1e6
    offset += batch
    print(json.dumps(timings), flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.versions", description=__doc__)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args(argv)
    from .env import redis_server

    with redis_server() as url:
        workers = {}
        for name, where in (("before", args.before), ("after", args.after)):
            workers[name] = subprocess.Popen(
                [sys.executable, "-c", _WORKER, url, str(args.batch)],
                cwd=where, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        for proc in workers.values():
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        added: dict[str, dict[str, list[float]]] = {w: {c: [] for c in CASES} for w in workers}
        for round_ in range(args.rounds):
            order = list(workers) if round_ % 2 == 0 else list(reversed(workers))
            for name in order:
                proc = workers[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                timings: dict[str, Any] = json.loads(proc.stdout.readline())
                for case in CASES:
                    added[name][case].append(timings[case] - timings["bare"])
        for proc in workers.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
    print(f"{args.rounds} interleaved rounds of {args.batch} requests per case")
    print()
    print("| case | added, before (us) | added, after (us) | after / before |")
    print("|---|---:|---:|---:|")
    for case in CASES:
        before = statistics.median(added["before"][case])
        after = statistics.median(added["after"][case])
        print(f"| {case} | {before:.1f} | {after:.1f} | {after / before:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
