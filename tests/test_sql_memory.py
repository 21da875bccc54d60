"""The in-memory SQL database (``QUOTA_DATABASE_URL = "sqlite://"``) shared by threads.

One in-memory database lives in one connection, so every thread of the process uses
that connection: the sync thread polls while a request or the CLI writes. A checkout
must own it until its checkin, or the pool's rollback on another thread's checkin
ends a transaction that is still running (its commit then fails, or its rows vanish).
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import text

from flask_quota.sql.engine import own_engine

WRITES = 3000


def test_threads_sharing_the_in_memory_database_never_end_each_others_transactions() -> None:
    engine = own_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE rows (n INTEGER NOT NULL)"))
    stop = threading.Event()
    errors: list[BaseException] = []
    polls = [0]

    def poll() -> None:  # what the sync thread does, far more often
        while not stop.wait(0.0002):
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT count(*) FROM rows")).scalar_one()
                polls[0] += 1
            except Exception as exc:  # every failure is the finding
                errors.append(exc)

    pollers = [threading.Thread(target=poll) for _ in range(2)]
    for thread in pollers:
        thread.start()
    try:
        for n in range(WRITES):
            try:
                with engine.begin() as conn:
                    conn.execute(text("INSERT INTO rows (n) VALUES (:n)"), {"n": n})
                    conn.execute(text("SELECT count(*) FROM rows")).scalar_one()
            except Exception as exc:
                errors.append(exc)
            time.sleep(0)  # let the pollers in between transactions
    finally:
        stop.set()
        for thread in pollers:
            thread.join()
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM rows")).scalar_one()
    assert errors == []
    assert polls[0] > WRITES // 10  # the threads did take turns
    assert stored == WRITES
    engine.dispose()
