"""Usage is filed on the storage's clock, like the limits themselves.

Two app servers whose clocks differ by an hour decide exactly (Redis ``TIME``), and
each dashboard must show both servers' traffic: a count is filed under the minute
Redis says, not the minute its server's wall clock says. The flush script reads
``TIME`` and returns it, so learning the offset costs no round trip of its own after
a process's first flush, and recording a request still costs none at all.
"""

from __future__ import annotations

import time

import redis

from flask_quota.recorder import UsageRecorder
from flask_quota.storage.redis_usage import RedisUsageSink
from tests.redis_probes import CountingConnection, counting_client
from tests.servers import RedisServer

HOUR_US = 3600 * 1_000_000


def wall_us() -> int:
    return time.time_ns() // 1000


def late_us() -> int:
    """A server whose clock runs an hour ahead."""
    return wall_us() + HOUR_US


def requests_seen(sink: RedisUsageSink) -> int:
    """Whole requests in the last five minutes, read as that server's dashboard reads."""
    now_minute = sink.clock() // 60_000_000
    return sum(sum(m.requests.values()) for m in sink.minutes(5, now_minute))


def test_two_servers_an_hour_apart_see_each_others_usage(redis_client: redis.Redis) -> None:
    """Recorders on clocks an hour apart, flushing into one real redis-server: each
    dashboard (its sink's clock and minutes) counts the requests of both."""
    redis_client.flushall()
    sinks = [
        RedisUsageSink(lambda: redis_client, "quota", local_clock=wall_us),
        RedisUsageSink(lambda: redis_client, "quota", local_clock=late_us),
    ]
    for n, sink in enumerate(sinks):
        recorder = UsageRecorder(sink)
        recorder._start = lambda: None  # type: ignore[method-assign]  # this test flushes
        for i in range(3 + n):  # 3 requests on the first server, 4 on the second
            recorder.record(f"id=s{n}-{i}", "free", [("user", True)])
        recorder.flush()
    assert [requests_seen(sink) for sink in sinks] == [7, 7]
    # Each sink's notion of now is Redis's, within the flush's round trip.
    server_us = int(redis_client.time()[0]) * 1_000_000
    assert all(abs(sink.clock() - server_us) < 5_000_000 for sink in sinks)


def test_flushes_learn_the_offset_without_a_round_trip_of_their_own(
    redis_server: RedisServer,
) -> None:
    """After a process's first flush (one TIME to learn the offset), a flush is only its
    script calls: the script returns Redis's TIME with its reply."""
    client = counting_client(redis_server)
    client.flushall()
    sink = RedisUsageSink(lambda: client, "quota", local_clock=late_us)
    recorder = UsageRecorder(sink)
    recorder._start = lambda: None  # type: ignore[method-assign]  # only counted flushes
    recorder.record("id=a", "free", [("user", True)])
    recorder.flush()
    for _ in range(2):
        recorder.record("id=a", "free", [("user", True)])
        before = CountingConnection.sent
        recorder.flush()
        assert CountingConnection.sent - before == 1  # one minute: one script call
    assert requests_seen(sink) == 3
