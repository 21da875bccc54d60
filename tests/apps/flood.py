"""A flood of unique client addresses through the test client, in a process of its own.

``python -m tests.apps.flood N`` serves N requests from N distinct IPs to an app with
the dashboard on (usage recorded) and memory storage on a frozen clock, lets an hour
and more pass, and prints the process's resident memory (after returning freed memory
to the OS) before the flood, at its end, and after it aged out, as JSON.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import sys
import tempfile

from flask import Flask

from flask_quota import Quota
from flask_quota.core.keys import remote_ip_tag
from flask_quota.storage import MemoryStorage
from flask_quota.storage.usage import HOUR
from flask_quota.testing import FrozenClock

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes once garbage is collected and free heap pages are given back."""
    gc.collect()
    with contextlib.suppress(OSError):  # not glibc: the number is then only less tight
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def ip(i: int) -> str:
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def main(total: int) -> None:
    clock = FrozenClock()
    app = Flask(__name__, instance_path=tempfile.mkdtemp())
    app.secret_key = "flood"
    app.config.update(QUOTA_PLANS={"free": {"user": "2/minute"}}, QUOTA_DASHBOARD_URL="/quota")
    Quota(app, storage=MemoryStorage(clock))

    @app.get("/items")
    def items() -> str:
        return "ok"

    http = app.test_client()
    usage = app.extensions["quota"].usage

    def serve(first: int, count: int) -> None:
        for i in range(first, first + count):
            http.get("/items", environ_base={"REMOTE_ADDR": ip(i)})
            if i % 1000 == 999:  # 1000 new callers a second, flushed every second
                usage.flush()
                clock.advance(1)
        usage.flush()

    def age_out() -> None:
        clock.advance((HOUR + 2) * 60)
        http.get("/items", environ_base={"REMOTE_ADDR": "192.0.2.1"})
        usage.flush()

    # A warm app: its bounded caches (parsed client addresses among them) are full,
    # and the traffic that filled them has aged out.
    for i in range(remote_ip_tag.cache_info().maxsize or 0):
        remote_ip_tag(f"198.18.{i >> 8}.{i & 255}")
    serve(1 << 23, 20_000)
    age_out()
    before = rss()
    serve(0, total)
    during = rss()
    age_out()
    after = rss()
    json.dump({"before": before, "during": during, "after": after}, sys.stdout)


if __name__ == "__main__":
    main(int(sys.argv[1]))
