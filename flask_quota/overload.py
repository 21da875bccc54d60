"""Overload protection on the request path: a request's class, and the sheds decided in
the worker before the storage is asked (``QUOTA_MAX_QUEUE_MS``, ``QUOTA_ADAPTIVE``).

The fleet's capacity (``QUOTA_CAPACITY``) is a check in the request's one storage call
(``core.policy``'s ``Tier.CAPACITY``); what is decided here costs no storage call:

- **Queue time**: a non-critical request whose ``X-Request-Start`` says it waited longer
  than ``QUOTA_MAX_QUEUE_MS`` before reaching the app is shed at once (its client has
  likely given up), ``"tier": "queue"``.
- **Adaptive capacity**: each worker admits at most its ``Gradient`` limit of requests
  in flight, shared out by class (``core.priority.class_limits``); a request over its
  class's line is shed, ``"tier": "capacity"``. Each admitted request's time in the app
  is its sample when it ends.

Every request with protection on gets a ``Ticket`` (its class and start), handed back
when its response ends (``Shedder.done``): the worker's requests in flight by class,
and the adaptive limit's samples.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .core.adaptive import Gradient
from .core.enforcer import Enforcer
from .core.priority import ORDER, Priority, class_limits, parse_priority, queued_us
from .settings import Settings

__all__ = ["Shedder", "Ticket"]


@dataclass(slots=True)
class Ticket:
    """An admitted request's place in its worker: its class, when it began, and how
    many of the worker's requests were in flight then (itself included)."""

    priority: Priority
    started: float
    in_flight: int


class Shedder:
    """One app's in-worker overload protection (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        enforcer: Enforcer,
        *,
        metrics: Any = None,
        clock: Callable[[], float] = time.monotonic,
        wall_us: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self.settings = settings
        self.enforcer = enforcer
        self.metrics = metrics  # QuotaMetrics: in flight by class, the adaptive limit
        self.clock = clock
        self.wall_us = wall_us  # X-Request-Start is wall-clock time (the proxy's)
        self.gradient: Gradient | None = None
        if settings.adaptive:
            top = settings.capacity or 1000
            self.gradient = Gradient(initial=min(10, top), maximum=top)
        self._lock = threading.Lock()
        self.in_flight = dict.fromkeys(ORDER, 0)
        self._total = 0
        self._lines: dict[int, dict[Priority, int]] = {}
        if metrics is not None:
            if settings.capacity is not None:
                metrics.capacity.set(settings.capacity)
            if self.gradient is not None:
                metrics.adaptive_capacity.set(self.gradient.limit)

    def classify(self, route: Priority | None) -> Priority:
        """The request's class: ``QUOTA_PRIORITY``'s answer, else its route's (``route``),
        else ``default``."""
        ask = self.settings.priority
        if ask is not None:
            answer = ask()
            if answer is not None:
                return parse_priority(answer, "QUOTA_PRIORITY()")
        return route if route is not None else Priority.DEFAULT

    def admit(self, priority: Priority, request_start: str | None) -> Ticket | None:
        """A ticket for a request of ``priority``, or ``RequestShed`` raised (through the
        enforcer: signal, metrics, ``QUOTA_SHADOW``). ``request_start``: its
        ``X-Request-Start`` header, read only with ``QUOTA_MAX_QUEUE_MS``."""
        shadow = self.settings.shadow
        limit_ms = self.settings.max_queue_ms
        if limit_ms is not None and priority is not Priority.CRITICAL:
            waited = queued_us(request_start, self.wall_us())
            if waited is not None and waited > limit_ms * 1000:
                self.enforcer.shed(priority, "queue", limit=int(limit_ms), shadow=shadow)
        gradient = self.gradient
        line = self._line(gradient.limit, priority) if gradient is not None else None
        with self._lock:
            total = self._total
            over = line is not None and total >= line
            if not over or shadow:
                self._total = total + 1
                self.in_flight[priority] += 1
        if over:  # raises, but in shadow mode (then it is told, and served)
            self.enforcer.shed(priority, "capacity", limit=line, shadow=shadow)
        if self.metrics is not None:
            self.metrics.in_flight.labels(priority.value).inc()
        return Ticket(priority, self.clock(), total + 1)

    def _line(self, limit: int, priority: Priority) -> int:
        """The in-flight line of ``priority`` for an adaptive ``limit`` (kept per limit)."""
        lines = self._lines.get(limit)
        if lines is None:
            if len(self._lines) > 1024:
                self._lines.clear()
            lines = self._lines[limit] = class_limits(limit, self.settings.reserve)
        return lines[priority]

    def done(self, ticket: Ticket) -> None:
        """The response of ``ticket``'s request ended: its slot comes back, and its time
        in the app is the adaptive limit's sample."""
        now = self.clock()
        with self._lock:
            self._total -= 1
            self.in_flight[ticket.priority] -= 1
        gradient = self.gradient
        if gradient is not None:
            gradient.sample(now - ticket.started, ticket.in_flight, now)
        if self.metrics is not None:
            self.metrics.in_flight.labels(ticket.priority.value).dec()
            if gradient is not None:
                self.metrics.adaptive_capacity.set(gradient.limit)
