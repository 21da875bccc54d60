"""Redis Cluster: tiers in two slots, one call per slot, all-or-nothing by refund, failover.

Everything runs against a real six-node cluster (three masters, three replicas)
started once for this module; the load tests serve ``tests.apps.many`` with
four gunicorn workers.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask, request
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from flask_quota import Identity, Quota
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.rates import parse_rate
from flask_quota.storage import Check
from flask_quota.storage.cluster import ClusterStorage, slot_groups
from flask_quota.testing import FrozenClock
from tests.apps.many import header_quota
from tests.capacity import capacity_scenario
from tests.cluster import Cluster, command, master_calls
from tests.load import hammer, serve_many
from tests.servers import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.also_valkey]

WEEK = "7 days"  # long windows: nothing refills while a test runs


@pytest.fixture
def flushed(cluster: Cluster) -> Cluster:
    cluster.wait_healthy()
    client = cluster.client()
    try:
        client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    finally:
        client.close()
    return cluster


def server_slot(cluster: Cluster, key: str) -> int:
    client = cluster.nodes[0].client()
    try:
        return int(command(client, "CLUSTER", "KEYSLOT", key))
    finally:
        client.close()


def cluster_app(app: Flask, cluster: Cluster, **config: Any) -> Flask:
    app.config.update(
        QUOTA_STORAGE_URL=cluster.url,
        QUOTA_STORAGE_TIMEOUT=0.5,
        QUOTA_DATABASE_URL=f"sqlite:///{app.instance_path}/quota.sqlite3",
        QUOTA_PLANS={
            "free": {
                "global": f"1000/{WEEK}",
                "user": f"100/{WEEK}",
                "resources": {"work": f"5/{WEEK}"},
            }
        },
        QUOTA_DENY_CACHE=False,
        **config,
    )
    header_quota(app)
    return app


# -- slots ------------------------------------------------------------------------


@given(st.text(min_size=1, max_size=40))
def test_client_input_cannot_choose_the_slot(identity: str) -> None:
    """Whatever an identity contains, its keys hash on the whole escaped identity."""
    keys = KeyBuilder("quota")
    tag = keys.identity_tag(identity)
    for key in (
        keys.user_key(tag, Algorithm.TOKEN_BUCKET),
        keys.endpoint_key(tag, "GET", "work", Algorithm.FIXED_WINDOW),
    ):
        assert key.count("{") == 1 and key.count("}") == 1, key
        assert key_slot(key.encode()) == key_slot(tag.encode())


def test_hostile_identities_land_where_their_escaped_tag_says(flushed: Cluster, app: Flask) -> None:
    """On the real cluster, braces in an identity never select another caller's slot."""
    client = cluster_app(app, flushed).test_client()
    hostile = ["{victim}", "}{victim}", "x{victim}y", "{}{victim}", "victim}", "{victim"]
    victim_slot = server_slot(flushed, "{victim}")
    for identity in hostile:
        assert client.get("/work", headers={"X-Client": identity}).status_code == 200
    written = flushed.client()
    try:
        keys = [_text(k) for k in written.keys("quota:{id=*", target_nodes="primaries")]
    finally:
        written.close()
    assert len(keys) == 2 * len(hostile)  # user + endpoint tier of each caller
    for key in keys:
        tag = key.split("{", 1)[1].split("}", 1)[0]
        assert server_slot(flushed, key) == key_slot(tag.encode())
        assert server_slot(flushed, key) != victim_slot, key


# -- one call per slot, all-or-nothing --------------------------------------------


def test_each_slot_costs_one_script_call(flushed: Cluster, app: Flask) -> None:
    """An identified caller's tiers span two slots: two FCALLs, sent together; an
    anonymous caller's tiers share one slot: one FCALL."""
    client = cluster_app(app, flushed).test_client()
    client.get("/work", headers={"X-Client": "warm"})  # slot map and scripts loaded
    assert len(slot_groups(_checks_for(app, "alice"))) == 2

    before = master_calls(flushed)
    assert client.get("/work", headers={"X-Client": "alice"}).status_code == 200
    assert master_calls(flushed) - before == 2

    before = master_calls(flushed)
    assert client.get("/work").status_code == 200
    assert master_calls(flushed) - before == 1


def test_every_master_gets_the_library_again_after_a_function_flush(
    flushed: Cluster, app: Flask
) -> None:
    """A decision is an FCALL on each slot's master; masters that lost the library
    (FUNCTION FLUSH, a restart) are loaded again and the request is decided."""
    client = cluster_app(app, flushed).test_client()
    assert client.get("/work", headers={"X-Client": "bob"}).status_code == 200
    scripts, loads = master_calls(flushed, "evalsha"), master_calls(flushed, "function|load")
    admin = flushed.client()
    try:
        admin.function_flush()  # the cluster client sends it to every node
    finally:
        admin.close()
    assert client.get("/work", headers={"X-Client": "bob"}).status_code == 200
    assert master_calls(flushed, "function|load") - loads >= 3  # every primary, at once
    before = master_calls(flushed)
    assert client.get("/work", headers={"X-Client": "bob"}).status_code == 200
    assert master_calls(flushed) - before == 2  # two slots, an FCALL each, as before
    assert master_calls(flushed, "evalsha") == scripts  # never the script instead
    remaining = client.get("/work", headers={"X-Client": "bob"}).headers["X-RateLimit-Remaining"]
    assert remaining == "1"  # every one of the four was counted, none twice


def test_slots_are_asked_together(flushed: Cluster) -> None:
    """The identity slot is decided while the global slot's master is still asleep: the
    calls are in flight together, not one after the other."""
    rate = parse_rate("1/hour")  # a token bucket stores now + 3600 s: the decision's time
    glob = Check("quota:{ip=10.9.8.7}:g:tb", Algorithm.TOKEN_BUCKET, rate, 1)
    sleeper = flushed.master_of(glob.key)
    user = next(
        Check(f"quota:{{id=u{i}}}:u:tb", Algorithm.TOKEN_BUCKET, rate, 1)
        for i in range(100)
        if flushed.master_of(f"{{id=u{i}}}") is not sleeper
    )
    storage = ClusterStorage.from_url(flushed.url, timeout=3)
    storage.peek([glob, user])  # connections and scripts ready
    try:
        # Paused when pause() returns (a thread running DEBUG SLEEP might not have
        # reached the node yet on a slow machine); the call waits, queued, 0.6 s.
        sleeper.pause(600)
        assert storage.decide([glob, user]).allowed
    finally:
        storage.close()
    tat = {c.key: int(_text(_raw(flushed, c.key))) for c in (glob, user)}
    assert tat[glob.key] - tat[user.key] > 300_000  # the user slot did not wait for it


def _checks_for(app: Flask, identity: str) -> list[Check]:
    from flask_quota.state import get_state

    state = get_state(app)
    plan = state.settings.plans["free"]
    tag = KeyBuilder.identity_tag(identity)
    return [
        c.check
        for c in state.policy.checks(
            plan,
            ip_tag=KeyBuilder.ip_tag("127.0.0.1"),
            identity_tag=tag,
            method="GET",
            spec=None,
            resource=None,
            cost=1,
        )
    ]


@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("denier_first", [False, True])
def test_a_denied_request_is_charged_nowhere(
    flushed: Cluster, algorithm: Algorithm, denier_first: bool
) -> None:
    """When the user slot denies, the global slot's charge is refunded to the byte."""
    clock = FrozenClock(1_700_000_000.0)
    storage = ClusterStorage.from_url(flushed.url, timeout=2, clock=clock)
    glob = Check(f"quota:{{ip=10.0.0.1}}:g:{algorithm.code}", algorithm, parse_rate("50/hour"), 1)
    user = Check(f"quota:{{id=bob}}:u:{algorithm.code}", algorithm, parse_rate("2/hour"), 1)
    assert len(slot_groups([glob, user])) == 2
    checks = [user, glob] if denier_first else [glob, user]
    try:
        for _ in range(2):
            clock.advance(1)
            assert storage.decide(checks).allowed
        clock.advance(1)
        before = _raw(flushed, glob.key)
        verdict = storage.decide(checks)
        assert not verdict.allowed
        assert verdict.outcomes[checks.index(glob)].allowed  # global allowed, then refunded
        assert _raw(flushed, glob.key) == before
    finally:
        storage.close()


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_a_reservation_refused_by_another_slot_is_given_back(
    flushed: Cluster, algorithm: Algorithm
) -> None:
    """A check that may wait (``delay=``, ``wait=``) reserves on its slot while another
    slot denies: the reservation is refunded for the time it was reserved for, and the
    next waiter gets that same turn."""
    clock = FrozenClock(1_700_000_000.5)
    storage = ClusterStorage.from_url(flushed.url, timeout=2, clock=clock)
    rate = parse_rate("1/second")
    pace = Check(f"quota:{{ip=10.0.0.1}}:e:{algorithm.code}", algorithm, rate, 1, wait_us=3_000_000)
    user = Check(f"quota:{{id=bob}}:u:{algorithm.code}", algorithm, parse_rate("1/hour"), 1)
    assert len(slot_groups([pace, user])) == 2
    try:
        assert storage.decide([pace, user]).allowed  # both slots' one unit
        clock.advance(0.1)
        refused = storage.decide([pace, user])
        assert not refused.allowed
        assert refused.outcomes[0].allowed and refused.outcomes[0].retry_after_us > 0
        turn = refused.outcomes[0].retry_after_us
        again = storage.decide([pace])  # the same turn, not the one after it
        assert again.allowed
        assert again.outcomes[0].retry_after_us == turn
    finally:
        storage.close()


# -- the tenant tier: a slot of its own, in the refund protocol --------------------


def test_a_tenants_callers_share_its_bucket_on_the_cluster(flushed: Cluster, app: Flask) -> None:
    """The must-show on a cluster: alice and bob of acme alternate, 200 x5 then 429 429
    naming the tenant tier; carol of globex passes. acme's bucket sits in the slot of
    its own hash tag, not in either caller's."""
    app.config.update(
        QUOTA_STORAGE_URL=flushed.url,
        QUOTA_PLANS={"pro": {"tenant": f"5/{WEEK}", "user": f"100/{WEEK}"}},
        QUOTA_DEFAULT_PLAN="pro",
        QUOTA_ANONYMOUS_PLAN="pro",
        QUOTA_DENY_CACHE=False,
        QUOTA_STORAGE_TIMEOUT=2,  # a slow first call must not fail open and admit
        QUOTA_FAIL_MODE="closed",
    )
    quota = Quota(app)

    @quota.identity_loader
    def from_headers() -> Identity | None:
        return Identity(request.headers["X-Client"], None, request.headers["X-Tenant"])

    @app.get("/work")
    def work() -> str:
        return "ok"

    client = app.test_client()

    def get(who: str, tenant: str) -> Any:
        return client.get("/work", headers={"X-Client": who, "X-Tenant": tenant})

    assert get("warm", "warm").status_code == 200  # slot map and scripts loaded
    statuses = [get(("alice", "bob")[i % 2], "acme").status_code for i in range(7)]
    assert statuses == [200] * 5 + [429, 429]
    assert get("alice", "acme").get_json()["tier"] == "tenant"
    assert [get("carol", "globex").status_code for _ in range(3)] == [200] * 3
    written = flushed.client()
    try:
        [key] = [_text(k) for k in written.keys("quota:{t=acme}*", target_nodes="primaries")]
    finally:
        written.close()
    assert server_slot(flushed, key) == key_slot(b"t=acme")
    assert server_slot(flushed, key) not in {key_slot(b"id=alice"), key_slot(b"id=bob")}


@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("denier", ["tenant", "user"])
def test_a_tenant_and_its_caller_are_all_or_nothing_across_slots(
    flushed: Cluster, algorithm: Algorithm, denier: str
) -> None:
    """The tenant's slot and the caller's are charged together or not at all: when one
    denies, the other's charge is refunded to the byte."""
    clock = FrozenClock(1_700_000_000.0)
    storage = ClusterStorage.from_url(flushed.url, timeout=2, clock=clock)
    keys = KeyBuilder("quota")
    tight, loose = parse_rate("2/hour"), parse_rate("50/hour")
    tenant = Check(
        keys.tenant_key(keys.tenant_tag("acme"), algorithm),
        algorithm,
        tight if denier == "tenant" else loose,
        1,
    )
    user = Check(
        keys.user_key(keys.identity_tag("bob"), algorithm),
        algorithm,
        tight if denier == "user" else loose,
        1,
    )
    assert len(slot_groups([tenant, user])) == 2
    other = user if denier == "tenant" else tenant
    try:
        for _ in range(2):
            clock.advance(1)
            assert storage.decide([tenant, user]).allowed
        clock.advance(1)
        before = _raw(flushed, other.key)
        verdict = storage.decide([tenant, user])
        assert not verdict.allowed
        assert verdict.outcomes[[tenant, user].index(other)].allowed  # allowed, then refunded
        assert _raw(flushed, other.key) == before
    finally:
        storage.close()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _raw(cluster: Cluster, key: str) -> Any:
    client = cluster.client()
    try:
        if client.type(key) == b"list":
            return client.lrange(key, 0, -1)
        return client.get(key)
    finally:
        client.close()


# -- exact under load: four gunicorn workers, 32 clients ---------------------------


def wait_for_window(window: int) -> None:
    """Fixed windows are epoch-aligned: do not start a test in a window's last minute."""
    left = window - time.time() % window
    if left < 60:
        time.sleep(left + 0.5)


@pytest.mark.parametrize(
    "algorithm",
    [Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW, Algorithm.SLIDING_WINDOW_LOG],
)
def test_three_tiers_admit_exactly_n_on_the_cluster(
    flushed: Cluster, tmp_path: Path, algorithm: Algorithm
) -> None:
    """40 callers x 12 concurrent requests: each gets exactly its endpoint limit (5);
    then with the global tier binding, exactly its limit (60) across all callers.
    Afterwards every counter equals what was admitted through it: refunds left no trace."""
    wait_for_window(7 * 86400)
    plans = {
        "a": {"global": f"1000/{WEEK}", "user": f"8/{WEEK}", "resources": {"work": f"5/{WEEK}"}},
        "b": {"global": f"60/{WEEK}", "user": f"1000/{WEEK}"},
    }
    server = serve_many(
        tmp_path,
        plans,
        QUOTA_STORAGE_URL=flushed.url,
        QUOTA_ALGORITHM=algorithm.value,
        QUOTA_STORAGE_TIMEOUT="2",
    )
    try:
        # Identity tiers bind; the shared global tier is charged and refunded by each denial.
        batch = [
            ("/work", {"X-Client": f"a{i}", "X-Plan": "a"}, f"a{i}")
            for _ in range(12)
            for i in range(40)
        ]
        replies = hammer(server.port, batch, clients=32)
        assert not [r for r in replies if r.status not in (200, 429)]
        admitted = Counter(r.tag for r in replies if r.status == 200)
        assert admitted == Counter({f"a{i}": 5 for i in range(40)})
        assert _count(flushed, "quota:{ip=127.0.0.1}:g:", algorithm) in (200, None)
        flushed.client().flushall(target_nodes=redis.RedisCluster.PRIMARIES)

        # The global tier binds (60); identity slots are charged and refunded.
        batch = [("/ping", {"X-Client": f"b{i}", "X-Plan": "b"}, f"b{i}") for i in range(40)] * 3
        replies = hammer(server.port, batch, clients=32)
        assert not [r for r in replies if r.status not in (200, 429)]
        admitted = Counter(r.tag for r in replies if r.status == 200)
        assert sum(admitted.values()) == 60, admitted
        for i in range(40):
            count = _count(flushed, f"quota:{{id=b{i}}}:u:", algorithm)
            assert count in (admitted[f"b{i}"], None), i
    finally:
        server.stop()


def test_both_slots_tight_never_over_admit(flushed: Cluster, tmp_path: Path) -> None:
    """Global (100) and user (4 each, 40 callers) limits bind at once: refunds race with
    charges, so the cluster may admit a little under 100, never over; and every counter
    still equals what was admitted through it."""
    wait_for_window(7 * 86400)
    plans = {"p": {"global": f"100/{WEEK}", "user": f"4/{WEEK}"}}
    server = serve_many(
        tmp_path,
        plans,
        QUOTA_STORAGE_URL=flushed.url,
        QUOTA_ALGORITHM="fixed_window",
        QUOTA_STORAGE_TIMEOUT="2",
    )
    try:
        batch = [("/ping", {"X-Client": f"t{i}"}, f"t{i}") for i in range(40)] * 6
        replies = hammer(server.port, batch, clients=32)
    finally:
        server.stop()
    assert not [r for r in replies if r.status not in (200, 429)]
    admitted = Counter(r.tag for r in replies if r.status == 200)
    total = sum(admitted.values())
    assert 90 <= total <= 100, admitted
    assert max(admitted.values()) <= 4
    assert _count(flushed, "quota:{ip=127.0.0.1}:g:", Algorithm.FIXED_WINDOW) == total
    for i in range(40):
        assert _count(flushed, f"quota:{{id=t{i}}}:u:", Algorithm.FIXED_WINDOW) == admitted[f"t{i}"]
    print(f"cluster, both tiers tight: admitted {total} of a global limit of 100")


def _count(cluster: Cluster, prefix: str, algorithm: Algorithm) -> int | None:
    """Units a window counter holds (fixed window, sliding log); None for token buckets."""
    client = cluster.client()
    try:
        key = prefix + algorithm.code
        if algorithm is Algorithm.FIXED_WINDOW:
            raw = client.get(key)
            return int(_text(raw).split(":")[1]) if raw else 0
        if algorithm is Algorithm.SLIDING_WINDOW_LOG:
            return int(client.llen(key))
        return None
    finally:
        client.close()


# -- failover ---------------------------------------------------------------------


def test_counters_survive_a_manual_failover(flushed: Cluster, app: Flask) -> None:
    """``CLUSTER FAILOVER`` on the replica of the caller's master: the budget carries over
    exactly (3 used before, exactly 2 more after), and no request fails."""
    client = cluster_app(app, flushed).test_client()
    headers = {"X-Client": "carol"}
    assert [client.get("/work", headers=headers).status_code for _ in range(3)] == [200] * 3

    key = KeyBuilder("quota").endpoint_key(
        KeyBuilder.identity_tag("carol"), "GET", "work", Algorithm.TOKEN_BUCKET
    )
    master = flushed.master_of(key)
    replica = flushed.replica_of(master)
    _wait_replicated(replica, key)
    with replica.client() as r:
        command(r, "CLUSTER", "FAILOVER")
    _wait_master(flushed, key, replica)

    statuses = [client.get("/work", headers=headers) for _ in range(4)]
    decided = [r.status_code for r in statuses if "RateLimit" in r.headers]
    assert [r.status_code for r in statuses] == [200, 200, 429, 429]
    assert decided == [200, 200, 429, 429]


def _wait_replicated(replica: RedisServer, key: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    with replica.client() as r:
        command(r, "READONLY")
        while r.exists(key) == 0:
            assert time.monotonic() < deadline, "the replica never received the counter"
            time.sleep(0.05)


def _wait_master(cluster: Cluster, key: str, node: RedisServer, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while cluster.master_of(key) is not node:
        assert time.monotonic() < deadline, f"{node.port} never became master"
        time.sleep(0.1)
    cluster.wait_healthy()


def test_killed_master_fails_open_then_limits_return(flushed: Cluster, app: Flask) -> None:
    """Kill -9 the master holding a caller's counters: no 5xx while the replica is
    promoted (fail open), then the limit is enforced again within 10 s."""
    client = cluster_app(app, flushed, QUOTA_BREAKER_COOLDOWN=0.25).test_client()
    headers = {"X-Client": "dave"}
    assert client.get("/work", headers=headers).status_code == 200
    key = KeyBuilder("quota").endpoint_key(
        KeyBuilder.identity_tag("dave"), "GET", "work", Algorithm.TOKEN_BUCKET
    )
    master = flushed.master_of(key)
    replica = flushed.replica_of(master)
    _wait_replicated(replica, key)

    master.kill()
    killed = time.monotonic()
    statuses: list[int] = []
    back = None
    while time.monotonic() - killed < 10:
        response = client.get("/work", headers=headers)
        statuses.append(response.status_code)
        if "RateLimit" in response.headers:
            back = time.monotonic() - killed
            break
        time.sleep(0.02)
    try:
        assert back is not None, f"limits not back within 10 s: {Counter(statuses)}"
        assert set(statuses) <= {200, 429}, Counter(statuses)
        # On the promoted replica the counter carried over: 5 per week, 1 used before.
        more = [client.get("/work", headers=headers).status_code for _ in range(5)]
        assert more.count(200) + (statuses[-1] == 200) == 4
        print(f"cluster master kill: limits enforced again after {back:.2f} s")
    finally:
        master.start()  # rejoins as a replica of the promoted node
        flushed.wait_healthy()


def test_a_shadow_denial_in_one_slot_is_no_denial(flushed: Cluster) -> None:
    """A shadow check that would deny in one slot neither denies the request nor makes
    the other slot refund; it is not charged, while the enforced check is."""
    clock = FrozenClock(1_700_000_000.0)
    storage = ClusterStorage.from_url(flushed.url, timeout=2, clock=clock)
    fw = Algorithm.FIXED_WINDOW
    glob = Check("quota:{ip=10.0.0.9}:g:fw", fw, parse_rate("50/hour"), 1)
    user = Check("quota:{id=sam}:u:fw", fw, parse_rate("1/hour"), 1, shadow=True)
    assert len(slot_groups([glob, user])) == 2
    try:
        verdicts = [storage.decide([glob, user]) for _ in range(3)]
        assert all(v.allowed for v in verdicts)
        assert [v.outcomes[1].allowed for v in verdicts] == [True, False, False]
        assert _raw(flushed, glob.key).endswith(b":3")  # every request charged globally
        assert _raw(flushed, user.key).endswith(b":1")  # the shadow check only while it allowed
    finally:
        storage.close()


def test_charge_when_and_charge_on_a_key_bucket_in_its_own_slot(
    flushed: Cluster, app: Flask
) -> None:
    """An endpoint tier shared by ``key=`` (a team) lives in the team's slot, not the
    caller's: ``charge_when`` gives a failed request's unit back there and
    ``quota.charge`` adds to it there, while the caller's own tier keeps every
    request's unit."""
    from flask import request

    from flask_quota import Identity, Quota

    app.config.update(
        QUOTA_STORAGE_URL=flushed.url,
        QUOTA_STORAGE_TIMEOUT=0.5,
        QUOTA_DATABASE_URL=f"sqlite:///{app.instance_path}/quota.sqlite3",
        QUOTA_PLANS={"free": {"user": f"100/{WEEK}", "resources": {"team": f"50/{WEEK}"}}},
        QUOTA_ALGORITHM="fixed_window",
        QUOTA_DENY_CACHE=False,
    )
    quota = Quota(app)

    @quota.identity_loader
    def caller() -> Identity:
        return Identity(request.headers["X-Client"])

    @app.get("/team")
    @quota.limit(
        resource="team",
        key=lambda: request.headers["X-Team"],
        charge_when=lambda response: response.status_code < 400,
    )
    def team() -> tuple[str, int]:
        extra = int(request.args.get("extra", 0))
        if extra:
            quota.charge(extra)
        return ("no", 500) if request.args.get("fail") else ("ok", 200)

    client = app.test_client()
    asked = ["", "?fail=1", "", "?extra=3", "?fail=1&extra=7"]
    for query in asked:
        client.get(f"/team{query}", headers={"X-Client": "ann", "X-Team": "blue"})
    keys = KeyBuilder("quota")
    team_key = keys.endpoint_key(keys.key_tag("blue"), "GET", "team", Algorithm.FIXED_WINDOW)
    user_key = keys.user_key(keys.identity_tag("ann"), Algorithm.FIXED_WINDOW)
    assert key_slot(team_key.encode()) != key_slot(user_key.encode())
    # 3 admitted units that counted, 3 charged on top; the failures' units and the
    # charge made by a failed request are void.
    assert _raw(flushed, team_key).endswith(b":6")
    assert _raw(flushed, user_key).endswith(b":5")  # every request, failed or not


def test_the_fleet_capacity_is_exact_on_the_cluster(flushed: Cluster, app: Flask) -> None:
    """The capacity's set lives in one hash slot, the callers' buckets in others: a shed
    charges no caller, a caller's own denial keeps no slot, slots come back exactly
    (``tests/capacity.py``)."""
    capacity_scenario(app, QUOTA_STORAGE_URL=flushed.url, QUOTA_STORAGE_TIMEOUT=1)
