"""The machine and the processes a benchmark run owns: its redis-server and gunicorns."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
WORKDIR = ROOT / "bench" / ".work"  # git-ignored: logs of our servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop one process we started (TERM, then KILL), and reap it."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def redis_server() -> Iterator[str]:
    """Our own redis-server on a free loopback port, no persistence; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    WORKDIR.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(WORKDIR),
            "--logfile", str(WORKDIR / f"redis-{port}.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port, socket_timeout=5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.02)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(proc)


@contextmanager
def gunicorn(
    app_spec: str, env: dict[str, str], workers: int = 4, threads: int = 1
) -> Iterator[Server]:
    """``gunicorn app_spec`` with ``workers`` sync workers (``threads`` > 1: threaded
    workers, gthread) on a loopback port."""
    WORKDIR.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (WORKDIR / f"gunicorn-{port}.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gunicorn", "--workers", str(workers),
            "--threads", str(threads), "--bind", f"127.0.0.1:{port}",
            "--log-level", "warning", "--chdir", str(ROOT), app_spec,
        ],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_port(port)
        yield Server(port, proc.pid)
    finally:
        stop(proc)
        log.close()


@dataclass(frozen=True)
class Server:
    port: int
    pid: int  # the gunicorn master; its workers are its children


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time used so far by ``pids`` and their live children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in _with_children(pids):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _with_children(pids: Iterable[int]) -> set[int]:
    found = set(pids)
    for pid in list(found):
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                found.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    """What the results were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    redis_version = "not found"
    binary = shutil.which("redis-server")
    if binary:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        redis_version = out.split()[2].removeprefix("v=") if out.count(" ") >= 2 else out.strip()
    load = os.getloadavg()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "redis-server": redis_version,
        "redis-py": redis.__version__,
        **{name: _version(name) for name in ("flask", "flask-limiter", "limits", "hiredis")},
        "load average at start": " ".join(f"{x:.2f}" for x in load),
    }
