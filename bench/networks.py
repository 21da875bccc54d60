"""``python -m bench.networks``: what operators' network rules cost a request, with 1
rule and with 100,000.

Side by side in one run (``bench.timing``: rounds of every case in a shuffled order):
the bare app, and flask-quota's three tiers on its own redis-server with no network
rule, with 1 and with 100,000 rows in ``quota_networks`` (each app its own SQLite
file, the rows loaded into its snapshot before timing). The 100,000 are random IPv4
/16-/32 and (one in ten) IPv6 /48-/128 networks, four in five denials, none holding a
caller: 1,000 callers rotating over ``10.0.0.0/8``, each request straight into the
app's WSGI callable as ``bench.driver`` sends it, every answer checked to be 200.
Before timing, one request from inside a denied network of each app is checked to get
403 (the rules are live). Printed: the median time each case adds over the bare app,
and 100,000 rows / 1 row (the goal: at most 1.05).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from flask import Flask
from sqlalchemy import insert

from .apps import PATH, USER_HEADER, bare_app, quota_app
from .driver import WsgiDriver, caller_sequence
from .env import machine, redis_server
from .timing import Case, added, run, spread

ROWS = 100_000
ONE = "192.0.2.0/24"  # the one row of the 1-row app: no caller is in it


def random_networks(count: int, seed: int = 3) -> list[dict[str, Any]]:
    """``count`` distinct rows, none inside ``10.0.0.0/8`` (the callers')."""
    rng = random.Random(seed)
    found: dict[str, str] = {}
    while len(found) < count:
        if rng.random() < 0.9:
            prefix = rng.randint(16, 32)
            value = rng.getrandbits(32) >> (32 - prefix) << (32 - prefix)
            if value >> 24 == 10:
                continue
            cidr = str(ipaddress.IPv4Network((value, prefix)))
        else:
            prefix = rng.randint(48, 128)
            value = (0x2 << 124 | rng.getrandbits(125)) >> (128 - prefix) << (128 - prefix)
            cidr = str(ipaddress.IPv6Network((value, prefix)))
        found[cidr] = "deny" if rng.random() < 0.8 else "allow"
    return [
        {"cidr": cidr, "action": action, "reason": "bench", "created_by": "bench"}
        for cidr, action in found.items()
    ]


def networks_app(redis_url: str, folder: Path, name: str, rows: list[dict[str, Any]]) -> Flask:
    """``quota_app`` on a SQLite file of its own holding ``rows``, loaded into its snapshot."""
    app = quota_app(redis_url, database_url=f"sqlite:///{folder}/{name}.sqlite3")
    sql = app.extensions["quota"].sql
    sql.start()
    if not sql.wait_loaded(60):
        raise RuntimeError(f"{name}: the quota tables did not load")
    if rows:
        from flask_quota.sql.models import NetworkRecord

        began = time.perf_counter()
        with sql.change() as session:  # one transaction; the snapshot reloads after it
            session.execute(insert(NetworkRecord), rows)
        loaded = sql.networks
        if loaded is None or len(loaded) != len(rows):
            raise RuntimeError(f"{name}: {len(rows)} rows written, the snapshot has {loaded}")
        took = time.perf_counter() - began
        print(f"  {name}: {len(rows):,} rows written and loaded in {took:.2f} s, "
              f"{loaded.prefix_lengths} prefix lengths")  # fmt: skip
    return app


def denied_address(rows: list[dict[str, Any]]) -> str:
    """An address inside one of ``rows``' denied IPv4 networks."""
    for row in rows:
        network = ipaddress.ip_network(row["cidr"])
        if row["action"] == "deny" and network.version == 4:
            return str(network[-1])
    raise ValueError("no denied IPv4 network")


def latency(redis_url: str, rounds: int, batch: int, folder: Path) -> dict[str, float]:
    many = random_networks(ROWS)
    one = [{"cidr": ONE, "action": "deny", "reason": "bench", "created_by": "bench"}]
    apps = {
        "bare": bare_app(),
        "none": networks_app(redis_url, folder, "none", []),
        "1": networks_app(redis_url, folder, "one", one),
        "100k": networks_app(redis_url, folder, "many", many),
    }
    for name, rows in (("1", one), ("100k", many)):
        probe = apps[name].test_client().get(
            PATH, headers={USER_HEADER: "probe"},
            environ_base={"REMOTE_ADDR": denied_address(rows)},
        )  # fmt: skip
        if probe.status_code != 403:
            raise AssertionError(f"{name}: a denied network's request got {probe.status_code}")
    callers = caller_sequence(1000, 5000)
    cases = {}
    for name, app in apps.items():
        driver = WsgiDriver(app, callers)
        cases[name] = Case(name, driver, check=lambda d=driver: d.expect("200"))  # type: ignore[misc]
    run(list(cases.values()), rounds, batch)
    found = {name: added(cases[name], cases["bare"]) for name in ("none", "1", "100k")}
    labels = {"none": "no network rule", "1": "1 row", "100k": f"{ROWS:,} rows"}
    for name, label in labels.items():
        low, high = spread(cases[name], cases["bare"])
        print(f"  {label:15}: +{found[name]:6.1f} us per request "
              f"(quartiles {low:.1f}..{high:.1f})")  # fmt: skip
    print(f"  {ROWS:,} rows / 1 row: {found['100k'] / found['1']:.3f}  (goal <= 1.05)")
    print(f"  1 row / no rule: {found['1'] / found['none']:.3f}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.networks", description=__doc__)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args(argv)
    # Each app's rules are in a SQLite file of its own, which flask-quota warns about
    # (other servers would not see them): right for a fleet, noise for one process.
    logging.getLogger("flask_quota").setLevel(logging.ERROR)
    print(", ".join(f"{k}: {v}" for k, v in machine().items()))
    with redis_server() as redis_url, tempfile.TemporaryDirectory() as tmp:
        print(f"network rules, test client (WSGI), Redis, {args.rounds} rounds of {args.batch}:")
        latency(redis_url, args.rounds, args.batch, Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
