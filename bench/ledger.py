"""``python -m bench.ledger``: what ``QUOTA_LEDGER`` costs a request, and what it costs
the database.

* **Latency**, side by side in one run (``bench.timing``: rounds of every case in a
  shuffled order): the bare app, flask-quota's three tiers on Redis with the ledger off
  and with it on (same plans, 1,000 callers rotating, each request straight into the
  app's WSGI callable as ``bench.driver`` sends it). Printed: the median time each adds
  over the bare app, and on/off (the goal: at most 1.10).
* **Database writes per flush**, at two request rates (``--rates``, requests per
  second, paced by sleeping) for ``--seconds`` each, 100 callers (each active in every
  flush interval at both rates: they rotate in shuffled rounds), a ledger on a SQLite
  file: every statement sent to the database is counted (``before_cursor_execute``; an
  executemany is one statement of N rows). Printed per rate: flushes, requests, and per
  flush the median statements and rows written. Rows follow the callers active in an
  interval, not the rate: the goal is the same figures at both rates.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from .apps import bare_app, quota_app
from .driver import WsgiDriver, caller_sequence
from .env import machine, redis_server
from .timing import Case, added, run, spread

CALLERS = 100


def latency(redis_url: str, rounds: int, batch: int, folder: Path) -> dict[str, float]:
    callers = caller_sequence(1000, 5000)
    apps = {
        "bare": bare_app(),
        "off": quota_app(redis_url, database_url=f"sqlite:///{folder}/off.sqlite3"),
        "on": quota_app(
            redis_url,
            database_url=f"sqlite:///{folder}/on.sqlite3",
            config={"QUOTA_LEDGER": True},
        ),
    }
    drivers = {name: WsgiDriver(app, callers) for name, app in apps.items()}
    cases = {
        name: Case(name, driver, check=lambda d=driver: d.expect("200"))  # type: ignore[misc]
        for name, driver in drivers.items()
    }
    run(list(cases.values()), rounds, batch)
    off = added(cases["off"], cases["bare"])
    on = added(cases["on"], cases["bare"])
    for name in ("off", "on"):
        low, high = spread(cases[name], cases["bare"])
        print(f"  ledger {name:3}: +{added(cases[name], cases['bare']):6.1f} us per request "
              f"(quartiles {low:.1f}..{high:.1f})")  # fmt: skip
    print(f"  on/off: {on / off:.3f}  (goal <= 1.10)")
    return {"off": off, "on": on}


def writes(redis_url: str, rate: float, seconds: float, folder: Path) -> dict[str, float]:
    """Drive ``rate`` requests per second for ``seconds``; the statements per flush."""
    app = quota_app(
        redis_url,
        database_url=f"sqlite:///{folder}/w{rate:g}.sqlite3",
        config={"QUOTA_LEDGER": True, "QUOTA_SYNC_INTERVAL": 0.5},
    )
    state = app.extensions["quota"]
    driver = WsgiDriver(app, caller_sequence(CALLERS, 20_000))
    driver()  # the first request: the writer thread starts, the tables are made
    state.ledger.flush()
    flushes: list[dict[str, int]] = []
    current: dict[str, int] = {}

    @event.listens_for(state.sql.engine, "before_cursor_execute")
    def seen(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        verb = sql.lstrip().split()[0].upper()
        if verb in ("INSERT", "UPDATE", "DELETE"):
            if "quota_usage_flushes" in sql and verb == "INSERT":  # a flush begins
                flushes.append(current.copy())  # the one before it, complete
                current.clear()
            current["statements"] = current.get("statements", 0) + 1
            current["rows"] = current.get("rows", 0) + (len(params) if many else 1)

    sent = 0
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + 1
        while sent < due:
            driver()
            sent += 1
        time.sleep(max(0.0, (sent / rate) - (time.monotonic() - start)))
    time.sleep(1.0)  # the last interval's flush
    flushes.append(current.copy())
    done = [f for f in flushes[1:] if f.get("statements")]
    driver.expect("200")
    return {
        "rate": sent / seconds,
        "flushes": len(done),
        "statements": statistics.median(f["statements"] for f in done),
        "rows": statistics.median(f["rows"] for f in done),
        "requests_per_flush": sent / max(1, len(done)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rates", type=float, nargs=2, default=(400.0, 2000.0))
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    print(", ".join(f"{k}: {v}" for k, v in machine().items()))
    with redis_server() as redis_url, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"latency, test client (WSGI), Redis, {args.rounds} rounds of {args.batch}:")
        latency(redis_url, args.rounds, args.batch, folder)
        print(f"database writes per flush (QUOTA_SYNC_INTERVAL 0.5 s, {CALLERS} callers, "
              f"{args.seconds:g} s per rate):")  # fmt: skip
        for rate in args.rates:
            found = writes(redis_url, rate, args.seconds, folder)
            print(f"  {found['rate']:7.0f} requests/s: {found['flushes']} flushes, "
                  f"{found['requests_per_flush']:.0f} requests per flush, per flush "
                  f"{found['statements']:g} statements writing {found['rows']:g} rows")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
