"""The Redis backend's own decide call: clean connections after failures, shared by threads."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import pytest
import redis

from flask_quota.core.algorithms import Algorithm
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check, StorageError
from flask_quota.storage.redis import FUNCTION, RedisStorage, decide_args
from flask_quota.testing import FrozenClock
from tests.servers import RedisServer

TB = Algorithm.TOKEN_BUCKET


def _clients(server: RedisServer) -> int:
    """Connected clients other than the one asking."""
    gc.collect()  # redis-py < 6 closes a dropped client's socket only when it is collected
    client = server.client()
    try:
        return len(client.client_list()) - 1
    finally:
        client.close()
        client.connection_pool.disconnect()  # close() alone keeps it open on redis-py < 6


def test_a_timed_out_call_leaves_no_reply_behind(own_redis: RedisServer) -> None:
    """A call that times out raises StorageError; the late reply to it is never read
    as the answer to the next call, which gets its own."""
    storage = RedisStorage.from_url(own_redis.url, timeout=0.3)
    try:
        first = Check("a", TB, parse_rate("10/minute"), 1)
        other = Check("b", TB, parse_rate("5/minute"), 1)
        assert storage.decide([first]).outcomes[0].remaining == 9  # connected
        own_redis.pause(1000)
        with pytest.raises(StorageError):
            storage.decide([first])  # Redis runs it after the pause and answers late
        deadline = time.monotonic() + 10
        while True:
            try:
                outcome = storage.decide([other]).outcomes[0]
                break
            except StorageError:
                assert time.monotonic() < deadline, "Redis never answered again"
                time.sleep(0.05)
        assert (outcome.limit, outcome.remaining) == (5, 4)  # b's answer, not a's late one
    finally:
        storage.close()


def test_peek_after_an_error_reply_is_answered_on_the_same_connection(
    own_redis: RedisServer,
) -> None:
    """An error reply (here: a wrong-type key) raises StorageError and keeps the
    connection: the next call is answered, on no new connection."""
    storage = RedisStorage.from_url(own_redis.url, timeout=2.0)
    try:
        check = Check("k", TB, parse_rate("10/minute"), 1)
        storage.decide([check])
        connected = _clients(own_redis)
        writer = own_redis.client()
        writer.lpush("list", "x")
        writer.connection_pool.disconnect()
        with pytest.raises(StorageError):
            storage.decide([Check("list", TB, parse_rate("10/minute"), 1)])
        assert storage.peek([check]).outcomes[0].remaining == 8  # what one more would leave
        assert _clients(own_redis) == connected
    finally:
        storage.close()


def test_threads_share_connections_and_count_exactly(own_redis: RedisServer) -> None:
    """Concurrent threads are all counted, each exactly once; a thread per request
    (as a threaded development server runs) reuses connections instead of
    opening one per thread."""
    client = own_redis.client()
    client.flushall()
    # A frozen clock: on Redis time an hour could turn mid-test and reset the window.
    storage = RedisStorage.from_url(own_redis.url, timeout=5.0, clock=FrozenClock())
    try:
        check = Check("shared", Algorithm.FIXED_WINDOW, parse_rate("100000/hour"), 1)

        def work() -> None:
            for _ in range(50):
                storage.decide([check])

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert storage.peek([check]).outcomes[0].remaining == 100000 - 8 * 50 - 1  # peek: one more
        before = _clients(own_redis)
        for _ in range(30):  # one short-lived thread per request
            t = threading.Thread(target=storage.decide, args=([check],))
            t.start()
            t.join()
        assert _clients(own_redis) == before
        assert storage.peek([check]).outcomes[0].remaining == 100000 - 8 * 50 - 30 - 1
    finally:
        storage.close()
        client.close()


FORKED = """
import os, sys
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

# A frozen clock (shared by both processes): on Redis time a token comes back every
# 0.6 s, and the parent's 21 answers on a slow machine could take longer.
storage = RedisStorage.from_url(sys.argv[1], timeout=5.0, clock=FrozenClock())
TB = Algorithm.TOKEN_BUCKET
parent = Check("parent", TB, parse_rate("100/minute"), 1)
child = Check("child", TB, parse_rate("50/minute"), 1)
storage.decide([parent])
pid = os.fork()
if pid == 0:  # the child: exit 0 only if every answer is its own
    ok = all(storage.decide([child]).outcomes[0].remaining == 49 - i for i in range(20))
    os._exit(0 if ok else 1)
answers = [storage.decide([parent]).outcomes[0].remaining for _ in range(20)]
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), answers == [98 - i for i in range(20)])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_opens_its_own_connection(redis_server: RedisServer) -> None:
    """A worker forked after the parent used Redis (gunicorn --preload) does not
    share the parent's socket: both keep getting their own answers. The fork runs in
    a fresh single-threaded interpreter, as gunicorn's master is (forking the test
    runner, which has threads, is what Python warns about)."""
    client = redis_server.client()
    client.flushall()
    client.close()
    done = subprocess.run(
        [sys.executable, "-c", FORKED, redis_server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True"], done.stderr


def test_close_disconnects_idle_connections(own_redis: RedisServer) -> None:
    """close() releases the connections the decide call holds."""
    storage = RedisStorage.from_url(own_redis.url, timeout=5.0)
    before = _clients(own_redis)
    storage.decide([Check("c", TB, parse_rate("10/minute"), 1)])
    assert _clients(own_redis) == before + 1
    storage.close()
    deadline = time.monotonic() + 5
    while _clients(own_redis) != before:
        assert time.monotonic() < deadline, "the connection stayed open"
        time.sleep(0.02)


def test_the_wire_carries_what_redis_py_would_send(redis_server: RedisServer) -> None:
    """The hand-packed FCALL is byte for byte redis-py's packing of the same call."""
    storage = RedisStorage(redis.Redis(port=redis_server.port))
    try:
        checks = [
            Check("quota:{id=é}:u:tb", TB, parse_rate("10/second; burst=50"), 3),
            Check("quota:{ip=1.2.3.4}:g:fw", Algorithm.FIXED_WINDOW, parse_rate("7/day"), 1),
            Check("quota:{id=é}:e:GET:x:tb", TB, parse_rate("2/minute"), 1, shadow=True),
        ]
        conn = redis.Connection()  # type: ignore[no-untyped-call]
        # A test's peek sends its mode and clock; a production decision, the checks alone.
        for mode, now, now_arg in (("peek", b"123", 123), ("decide", b"", "")):
            ours = storage._decide.pack(mode, now, checks)
            args = decide_args(checks, mode, now_arg)  # the reference, shadow mark included
            theirs = b"".join(
                conn.pack_command(  # type: ignore[no-untyped-call]
                    "FCALL", FUNCTION, len(checks), *[c.key for c in checks], *args
                )
            )
            assert ours == theirs
        assert len(args) == 1
    finally:
        storage.close()


def test_connections_connect_the_way_their_class_does(redis_server: RedisServer) -> None:
    """A connection class that finds its server in ``connect()`` (as Sentinel's asks
    the sentinels for the master) is connected through it, never straight to the
    host and port it was made with."""
    from tests.servers import free_port

    class Discovering(redis.Connection):
        def connect(self) -> None:
            self.port = redis_server.port  # the address the "discovery" names
            super().connect()  # type: ignore[no-untyped-call]

    pool = redis.ConnectionPool(
        connection_class=Discovering,
        host="127.0.0.1",
        port=free_port(),  # nothing there
    )
    client = redis.Redis(connection_pool=pool)
    storage = RedisStorage(client)
    try:
        check = Check("discovered", TB, parse_rate("10/minute"), 1)
        assert storage.decide([check]).outcomes[0].remaining == 9
    finally:
        storage.close()


@pytest.mark.parametrize("rate_text", ["3/second", "1000000/366 days", "1/second; burst=31622400"])
def test_the_arguments_reach_the_script_as_they_are_meant(
    redis_server: RedisServer, rate_text: str
) -> None:
    """The rate's numbers travel in hexadecimal and the cost in decimal: the largest
    rates, a cost that never fits and a negative cost (the dashboard's refund) are
    decided as memory decides them, step for step."""
    from flask_quota.storage import MemoryStorage

    redis_server.client().flushall()
    clock = FrozenClock(1_700_000_123.456789)
    memory = MemoryStorage(clock)
    remote = RedisStorage(redis.Redis(port=redis_server.port), clock=clock)
    rate, wide = parse_rate(rate_text), parse_rate("1000/second")
    try:
        for cost in (1, 2, -1, 0, 10**20, -2, 1):
            checks = [Check("k", TB, rate, cost), Check("j", Algorithm.FIXED_WINDOW, wide, 1)]
            assert remote.decide(checks) == memory.decide(checks), cost
            clock.now_us += 1000
        # Charged 1 + 2 - 1 - 2 + 1 = 1 (the cost that never fits was not charged);
        # a peek of 1 more leaves capacity - 2.
        after = remote.peek([Check("k", TB, rate, 1)]).outcomes[0].remaining
        assert after == rate.capacity - 2
    finally:
        remote.close()
