"""The few private or semi-public parts of Flask, Werkzeug and redis-py flask-quota leans
on for speed, each used in one place: these tests fail when a release of the library
underneath changes them, before a user's requests do.

- Werkzeug's ``Headers._list`` (``edge.add_headers``): the response's pair list,
  appended to in one step.
- Flask's ``teardown_request_funcs`` (``edge.insert_teardown``): a dict of lists, run
  in reverse order, where the lease give-back joins at the first lease.
- redis-py's ``Connection`` calls below its command API (``storage.redis._ScriptCall``)
  and its cluster client's per-node calls (``storage.cluster.ClusterStorage._together``).
"""

from __future__ import annotations

import inspect

import redis
from flask import Flask
from redis.cluster import RedisCluster
from werkzeug.datastructures import Headers

from flask_quota.edge import add_headers, insert_teardown
from flask_quota.storage.cluster import checkout
from tests.servers import RedisServer


def test_werkzeug_headers_keep_their_pairs_in_one_list() -> None:
    """What is appended to ``_list`` is what the response sends, in order."""
    headers = Headers([("Content-Type", "text/plain")])
    assert isinstance(headers._list, list)
    ours = [("X-RateLimit-Limit", "5"), ("RateLimit", "x")]
    add_headers(headers, ours, None)
    assert headers._list[1:] == ours  # appended in one step, not through add()
    assert headers.to_wsgi_list() == [("Content-Type", "text/plain"), *ours]
    assert headers["X-RateLimit-Limit"] == "5"
    # One of ours already there: replaced, not appended twice.
    add_headers(headers, [("X-RateLimit-Limit", "6")], None)
    assert headers.getlist("X-RateLimit-Limit") == ["6"]


def test_flask_runs_teardown_functions_from_one_list_in_reverse() -> None:
    """``insert_teardown`` puts a hook where registering it then would have: Flask keeps
    app-wide teardown functions in ``teardown_request_funcs[None]`` and runs them last
    registered first."""
    app = Flask(__name__)
    ran: list[str] = []
    app.teardown_request(lambda error: ran.append("first"))
    position = len(app.teardown_request_funcs[None])
    app.teardown_request(lambda error: ran.append("second"))
    insert_teardown(app, position, lambda error: ran.append("ours"))

    @app.get("/")
    def index() -> str:
        return "ok"

    app.test_client().get("/")
    assert ran == ["second", "ours", "first"]


def test_redis_connections_offer_what_the_decide_call_uses(redis_server: RedisServer) -> None:
    """``_ScriptCall`` makes connections with the pool's factory, polls a reused one with
    ``can_read(0)``, sends a packed command without the health check, reads the reply,
    and disconnects a broken one: each of those on a real connection."""
    client = redis.Redis(port=redis_server.port)
    pool = client.connection_pool
    conn = pool.make_connection()
    assert "check_health" in inspect.signature(conn.send_packed_command).parameters
    conn.connect()  # type: ignore[no-untyped-call]
    assert conn.can_read(0) is False
    conn.send_packed_command((b"*1\r\n$4\r\nPING\r\n",), check_health=False)  # type: ignore[no-untyped-call]
    assert conn.read_response() in (b"PONG", "PONG")
    conn.disconnect()  # type: ignore[no-untyped-call]
    client.close()


def test_redis_cluster_nodes_answer_as_the_storage_asks(redis_server: RedisServer) -> None:
    """``ClusterStorage._together`` finds a key's node and its Redis, checks a connection
    out of its pool (``checkout``), sends on it and parses the reply with the node's
    ``parse_response``; the slot map is read again with ``nodes_manager.initialize``."""
    for name in ("get_node_from_key", "get_redis_connection"):
        assert callable(getattr(RedisCluster, name, None)), name
    client = redis.Redis(port=redis_server.port)
    conn = checkout(client.connection_pool)
    conn.send_command("PING")
    assert client.parse_response(conn, "PING") is True  # type: ignore[no-untyped-call]
    client.connection_pool.release(conn)
    client.close()
    from redis.cluster import NodesManager

    assert callable(NodesManager.initialize)
