"""A real Sentinel setup for tests: one master, one replica, three sentinels on loopback,
all redis-server or all valkey-server."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from tests.servers import KINDS, RedisServer, free_port

__all__ = ["SentinelGroup"]

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000  # how long a silent master stays trusted


class SentinelGroup:
    """``redis-server --sentinel`` x3 watching a master and its replica (quorum 2); with
    ``kind="valkey"``, ``valkey-server --sentinel`` and a ``valkey+sentinel://`` URL."""

    def __init__(self, workdir: Path, *, kind: str = "redis") -> None:
        self.kind = KINDS[kind]
        if self.kind.binary is None:
            raise RuntimeError(f"{kind}-server is not installed")
        self.binary = self.kind.binary
        self.workdir = workdir
        self.sentinels: list[tuple[int, subprocess.Popen[bytes]]] = []
        self.master = RedisServer(workdir / "master", kind=kind)
        self.replica: RedisServer | None = None
        try:
            self.replica = RedisServer(
                workdir / "replica",
                None,
                "--replicaof",
                "127.0.0.1",
                str(self.master.port),
                kind=kind,
            )
            for _ in range(3):
                self.sentinels.append(self._start_sentinel())
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port, _ in self.sentinels)
        return f"{self.kind.scheme}+sentinel://{hosts}/{SERVICE}"

    def servers(self) -> list[RedisServer]:
        return [s for s in (self.master, self.replica) if s is not None]

    def stop(self) -> None:
        for _, proc in self.sentinels:
            proc.kill()
            proc.wait()
        self.sentinels = []
        for server in self.servers():
            server.stop()

    def current_master(self) -> int:
        """The master's port, as the first sentinel that answers sees it."""
        for port, _ in self.sentinels:
            client = redis.Redis(port=port, socket_timeout=2)
            try:
                address: Any = client.sentinel_get_master_addr_by_name(SERVICE)
                _, master_port = address
                return int(master_port)
            except redis.RedisError:
                continue
            finally:
                client.close()
        raise RuntimeError("no sentinel answers")

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers() if s.port == port)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Every sentinel sees the master, its replica and the two other sentinels."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            views = []
            for port, _ in self.sentinels:
                client = redis.Redis(port=port, socket_timeout=2)
                try:
                    state: Any = client.sentinel_master(SERVICE)
                    views.append(
                        (int(state["num-other-sentinels"]), int(state["num-slaves"]), state["port"])
                    )
                except redis.RedisError as exc:
                    views.append(repr(exc))  # type: ignore[arg-type]
                finally:
                    client.close()
            if all(v == (2, 1, self.master.port) for v in views):
                return
            last = views
            time.sleep(0.2)
        raise TimeoutError(f"sentinels not ready after {timeout} s: {last}")

    def _start_sentinel(self) -> tuple[int, subprocess.Popen[bytes]]:
        port = free_port()
        folder = self.workdir / f"sentinel-{port}"
        folder.mkdir(parents=True)
        config = folder / "sentinel.conf"  # sentinels rewrite their config: one file each
        config.write_text(
            f"port {port}\n"
            "bind 127.0.0.1\n"
            f"dir {folder}\n"
            f"logfile {folder / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} 2000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        proc = subprocess.Popen(
            [self.binary, str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                if client.ping():
                    return port, proc
            except redis.RedisError:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise
                time.sleep(0.05)
            finally:
                client.close()
