"""Calling an app in-process, one WSGI request at a time, and counting Redis round trips."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flask import Flask
from redis.connection import AbstractConnection
from werkzeug.test import EnvironBuilder

from .apps import PATH


def identity(i: int) -> tuple[str, str]:
    """The ``(REMOTE_ADDR, X-User)`` of caller ``i``: one IP and one user per caller."""
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", f"user{i}"


def caller_sequence(population: int, length: int, seed: int = 1) -> list[tuple[str, str]]:
    """``length`` callers from ``population`` (fixed seed: the same for every case).

    Up to ``length`` callers, the population is covered in shuffled rounds (each
    caller once per round); a larger population is sampled uniformly at random.
    """
    rng = random.Random(seed)
    if population > length:
        return [identity(rng.randrange(population)) for _ in range(length)]
    order: list[int] = []
    while len(order) < length:
        block = list(range(population))
        rng.shuffle(block)
        order += block
    return [identity(i) for i in order[:length]]


class WsgiDriver:
    """``driver()`` sends one ``GET /res`` straight to ``app.wsgi_app``: no sockets,
    no test client. Callers rotate through ``callers``. Statuses are tallied so a
    benchmark can check that every request got the answer it expects.
    """

    def __init__(self, app: Flask, callers: Sequence[tuple[str, str]]) -> None:
        self.wsgi = app.wsgi_app
        self.template = EnvironBuilder(path=PATH, method="GET").get_environ()
        self.callers = list(callers)
        self.position = 0
        self.statuses: dict[str, int] = {}
        self._status = ""

    def _start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None, /
    ) -> Callable[[bytes], object]:
        self._status = status
        return _discard

    def __call__(self) -> None:
        ip, user = self.callers[self.position]
        self.position = (self.position + 1) % len(self.callers)
        environ = dict(self.template)
        environ["REMOTE_ADDR"] = ip
        environ["HTTP_X_USER"] = user
        body = self.wsgi(environ, self._start_response)
        try:
            for _ in body:
                pass
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        code = self._status[:3]
        self.statuses[code] = self.statuses.get(code, 0) + 1

    def expect(self, code: str) -> None:
        """Raise unless every request so far answered ``code``; then reset the tally."""
        other = {k: v for k, v in self.statuses.items() if k != code}
        if other:
            raise AssertionError(f"expected only {code}, got {self.statuses}")
        self.statuses.clear()


def _discard(data: bytes) -> None:
    pass


@dataclass
class RoundTrips:
    sends: int = 0  # socket writes of whole commands or pipelines: one per round trip
    replies: int = 0  # replies read: one per command


@contextmanager
def count_round_trips() -> Iterator[RoundTrips]:
    """Count redis-py client traffic in this process (both libraries use redis-py).

    Every command or pipeline is written by one ``send_packed_command`` call and
    each reply read by one ``read_response`` call on the connection, so the
    counts are taken there, at the client, for every connection of every pool.
    """
    counts = RoundTrips()
    send: Callable[..., Any] = AbstractConnection.send_packed_command
    read: Callable[..., Any] = AbstractConnection.read_response

    def counting_send(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        counts.sends += 1
        return send(self, *args, **kwargs)

    def counting_read(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        counts.replies += 1
        return read(self, *args, **kwargs)

    AbstractConnection.send_packed_command = counting_send  # type: ignore[method-assign]
    AbstractConnection.read_response = counting_read  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        AbstractConnection.read_response = read  # type: ignore[method-assign]


def repeat(call: Callable[[], None], n: int) -> None:
    for _ in range(n):
        call()
