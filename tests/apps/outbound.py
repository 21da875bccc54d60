"""One process of an outbound quota's callers: ``python -m tests.apps.outbound URL CALLS
THREADS START OUT`` calls ``quota.limited("60/minute", key="openai", wait=30)`` from
``THREADS`` threads inside ``app.app_context()`` (as a Celery task would), all starting
at the wall-clock time ``START``, until the processes sharing ``URL`` have made
``CALLS`` calls in all (counted in that Redis, apart from the quota's keys), and writes
one JSON record per call to ``OUT``: when it asked, when it was let in (or refused)."""

from __future__ import annotations

import json
import sys
import threading
import time

import redis
from flask import Flask

from flask_quota import Quota, QuotaExceeded

__all__ = ["main"]


def main(url: str, calls: int, threads: int, start: float, out: str) -> None:
    app = Flask(__name__)
    # Patient: on a loaded machine an answer may take over the default 0.1 s, which the
    # default fail mode would admit unasked (tests/test_waiting.py counts admissions).
    app.config.update(
        QUOTA_STORAGE_URL=url, QUOTA_DATABASE_URL="sqlite://",
        QUOTA_STORAGE_TIMEOUT=5, QUOTA_FAIL_MODE="closed",
    )  # fmt: skip
    quota = Quota(app)
    lock = threading.Lock()
    counter = redis.Redis.from_url(url)
    records: list[dict[str, object]] = []

    def caller() -> None:
        with app.app_context():
            while counter.incr("test:outbound:calls") <= calls:
                asked = time.time()
                record: dict[str, object]
                try:
                    with quota.limited("60/minute", key="openai", wait=30):
                        record = {"asked": asked, "at": time.time(), "admitted": True}
                except QuotaExceeded as exc:
                    record = {"asked": asked, "at": time.time(), "admitted": False,
                              "retry_after": str(exc.retry_after)}  # fmt: skip
                with lock:
                    records.append(record)

    time.sleep(max(0.0, start - time.time()))
    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    with open(out, "w") as file:
        json.dump(records, file)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
