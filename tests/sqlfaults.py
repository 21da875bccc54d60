"""Broken databases for tests, made of real sockets: one that never answers, and a
proxy to a real PostgreSQL that can be frozen, thawed and killed mid-traffic."""

from __future__ import annotations

import contextlib
import select
import socket
import threading

from sqlalchemy.engine import make_url

__all__ = ["HungDatabase", "Proxy", "hung_url"]


def hung_url(port: int) -> str:
    return f"postgresql+psycopg2://quota@127.0.0.1:{port}/quota"


class _Listener:
    """A loopback TCP listener whose accepted sockets are kept until ``close``."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self.closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self.closed.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.1)
                if ready:
                    conn, _ = self.sock.accept()
                    self.on_accept(conn)
            except OSError:
                return

    def on_accept(self, conn: socket.socket) -> None:
        self.accepted.append(conn)

    def close(self) -> None:
        self.closed.set()
        self._thread.join(timeout=5)
        for conn in [self.sock, *self.accepted]:
            with contextlib.suppress(OSError):
                conn.close()


class HungDatabase(_Listener):
    """Accepts every connection and never sends a byte: a database that hangs."""

    @property
    def url(self) -> str:
        return hung_url(self.port)


class Proxy(_Listener):
    """A TCP proxy to ``target`` (a PostgreSQL URL). ``url`` is ``target`` through it.

    ``freeze()`` stops moving bytes while keeping every socket open (the database
    then hangs mid-session for whoever uses it); ``thaw()`` resumes; ``kill()``
    closes every connection and refuses new ones, like a database that went away.
    """

    def __init__(self, target: str) -> None:
        self.target = make_url(target)
        self.flowing = threading.Event()
        self.flowing.set()
        self.refusing = False
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        super().__init__()

    @property
    def url(self) -> str:
        url = self.target.set(host="127.0.0.1", port=self.port)
        return url.render_as_string(hide_password=False)

    def on_accept(self, conn: socket.socket) -> None:
        if self.refusing:
            conn.close()
            return
        try:
            upstream = socket.create_connection((self.target.host, self.target.port or 5432))
        except OSError:
            conn.close()
            return
        self._pairs.append((conn, upstream))
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self.closed.is_set():
            self.flowing.wait()
            try:
                ready, _, _ = select.select([source], [], [], 0.1)
                if not ready or not self.flowing.is_set():
                    continue
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def freeze(self) -> None:
        self.flowing.clear()

    def thaw(self) -> None:
        self.flowing.set()

    def kill(self) -> None:
        """Drop every connection; from now on connections are closed at once."""
        self.refusing = True
        for pair in self._pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._pairs.clear()

    def revive(self) -> None:
        self.refusing = False

    def close(self) -> None:
        self.kill()
        self.flowing.set()
        super().close()
