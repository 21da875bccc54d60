"""A real Redis Cluster for tests: six redis-server (or valkey-server) processes, three
masters with a replica each."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from tests.servers import RedisServer

__all__ = ["Cluster", "cluster_port", "command", "master_calls"]

REDIS_CLI = shutil.which("redis-cli")
NODE_TIMEOUT_MS = 1000  # how long a silent master stays trusted before its replica takes over


def command(client: redis.Redis, *args: str) -> Any:
    """A raw command (redis-py leaves ``execute_command`` untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535:
            continue
        try:
            with socket.socket() as bus:
                bus.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000) on 127.0.0.1")


class Cluster:
    """Six nodes, ``redis-cli --cluster create ... --cluster-replicas 1``, all on loopback.

    ``kind="valkey"`` runs valkey-server nodes (redis-cli creates a Valkey cluster as well)
    and names the cluster by ``valkey+cluster://``.
    """

    def __init__(self, workdir: Path, size: int = 6, *, kind: str = "redis") -> None:
        if REDIS_CLI is None:
            raise RuntimeError("redis-cli is not installed")
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(size):
                port = cluster_port()
                self.nodes.append(
                    RedisServer(
                        workdir / str(port), port,
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", f"nodes-{port}.conf",
                        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                        "--enable-debug-command", "local",
                        kind=kind,
                    )
                )  # fmt: skip
            subprocess.run(
                [REDIS_CLI, "--cluster", "create",
                 *(f"127.0.0.1:{node.port}" for node in self.nodes),
                 "--cluster-replicas", "1", "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
            )  # fmt: skip
            self.wait_healthy()
        except BaseException:
            self.stop()  # never leak half a cluster
            raise

    @property
    def url(self) -> str:
        return f"{self.nodes[0].kind.scheme}+cluster://127.0.0.1:{self.nodes[0].port}"

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def client(self) -> redis.RedisCluster:
        live = next(node for node in self.nodes if node.proc is not None)
        return redis.RedisCluster(host="127.0.0.1", port=live.port, socket_timeout=5)

    def node(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def info(self, node: RedisServer, section: str) -> dict[str, Any]:
        """``INFO section`` as redis-py parses it; section ``cluster`` reads ``CLUSTER INFO``."""
        client = node.client()
        try:
            if section == "cluster":
                raw = command(client, "CLUSTER", "INFO")
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
            return dict(client.info(section))
        finally:
            client.close()

    def master_of(self, key: str) -> RedisServer:
        """The node currently serving ``key``'s slot, as its own masters see it."""
        slot = key_slot(key.encode())
        for node in self.nodes:
            if node.proc is None:
                continue
            client = node.client()
            try:
                ranges = command(client, "CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            finally:
                client.close()
            for start, end, master, *_ in ranges:
                if start <= slot <= end:
                    return self.node(int(master[1]))
        raise RuntimeError(f"no live node serves slot {slot}")

    def replica_of(self, master: RedisServer) -> RedisServer:
        info = self.info(master, "replication")
        for name, value in info.items():
            if name.startswith("slave") and isinstance(value, dict):
                return self.node(int(value["port"]))
        raise RuntimeError(f"master {master.port} has no replica")

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Every live node says ``cluster_state:ok``, agrees on the masters, replicas in sync."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                live = [node for node in self.nodes if node.proc is not None]
                states = [self.info(node, "cluster").get("cluster_state") for node in live]
                views = {self._masters_seen_by(node) for node in live}
                links = [
                    self.info(node, "replication").get("master_link_status", "up") for node in live
                ]
                if all(s == "ok" for s in states) and len(views) == 1 and set(links) == {"up"}:
                    return
                last = f"states={states} views={len(views)} links={links}"
            except redis.RedisError as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise TimeoutError(f"cluster not healthy after {timeout} s: {last}")

    def _masters_seen_by(self, node: RedisServer) -> frozenset[tuple[int, int, int]]:
        client = node.client()
        try:
            ranges = command(client, "CLUSTER", "SLOTS")
        finally:
            client.close()
        return frozenset((int(r[0]), int(r[1]), int(r[2][1])) for r in ranges)


def master_calls(cluster: Cluster, command: str = "fcall") -> int:
    """How often every live master has run ``command`` so far."""
    total = 0
    for node in cluster.nodes:
        if node.proc is None or cluster.info(node, "replication")["role"] != "master":
            continue
        stats = cluster.info(node, "commandstats").get(f"cmdstat_{command}", {})
        total += int(stats.get("calls", 0))
    return total
