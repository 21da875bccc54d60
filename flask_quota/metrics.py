"""Prometheus metrics (``QUOTA_METRICS_URL``), with ``prometheus_client``.

Imported only when ``QUOTA_METRICS_URL`` is set: an app without metrics never
loads ``prometheus_client`` and pays one ``is None`` test per request.

What ``flask_quota_decisions_total{tier,resource,plan,outcome}`` counts, once
per request that at least one tier applies to:

- decided by the storage (a deny cache answer included: it is a denial like
  any other): an admitted request counts ``allowed`` once per tier result (one
  per rate: three tiers, three series); a refused one counts ``denied`` once
  per tier that denied it, and its other tiers not at all (they were not
  charged). ``resource`` is the tier's policy name, as in ``RateLimit-Policy``:
  ``global``, ``user``, the endpoint's resource, or ``NAME@W`` for a further
  window of a multi-rate limit;
- decided by the in-process fallback (``QUOTA_FAIL_MODE=local``): as above,
  with ``local`` instead of ``allowed`` (its denials are still ``denied``);
- the storage failed: ``fail_open`` or ``fail_closed`` once per tier that
  would have been checked;
- the caller is blocked: ``blocked`` once, ``tier="blocked"``,
  ``resource="blocked"`` (a denial that starts a block counts as that denial);
- a shadow tier would have denied: ``shadow_denied`` once per such tier.

So admitted requests are ``allowed`` + ``local`` + ``fail_open`` on any one
tier, and refusals are ``denied``, ``blocked`` and ``fail_closed``. Labels hold
tier, policy and plan names only, which the app's code and plans bound: never
an identity, an address or a key.

``flask_quota_storage_seconds`` times each decision call as the request saw it
(the storage round trip, or the deny cache, or the fallback while the storage
is down). ``flask_quota_breaker_open`` is 1 while a worker's circuit breaker is
open; under several workers it is the highest among live workers (multiprocess
mode ``livemax``), so 1 means "at least one worker is failing over".
``flask_quota_deny_cache_hits_total`` counts decisions the deny cache answered,
``flask_quota_prefetch_hits_total`` those answered from a worker's prefetched
shares (``QUOTA_PREFETCH``): neither asked the storage.
``flask_quota_near_limit_total{tier,resource,plan}`` counts the requests that
took a bucket across ``QUOTA_NEAR_LIMIT`` (once per crossing, as
``signals.quota_near_limit``).

Prepaid credits (``docs/credits.md``): ``flask_quota_credits_spent_total{resource,plan}``
counts the units requests were admitted at (before a ``quota.settle`` correction),
``flask_quota_credits_refused_total{resource,plan}`` the requests refused with 402,
``flask_quota_credits_granted_total{resource}`` the units granted through this process
(``quota.grant``, the CLI, the dashboard), ``flask_quota_credits_events_total{resource,
event}`` the ``credits.low`` / ``credits.exhausted`` events, counted by the worker that
told each (once across the fleet).

Several processes (gunicorn workers) share counts through prometheus_client's
multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR`` names an empty directory, set
in the environment before the server starts, and gunicorn's ``child_exit``
hook is ``gunicorn_child_exit``. Without it, each process counts alone.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from typing import Any

from flask import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .core.enforcer import FAIL_CLOSED, FAIL_OPEN
from .core.policy import Decision, TierCheck, TierResult
from .core.priority import Priority
from .core.tiers import Tier

__all__ = [
    "OUTCOMES",
    "QuotaMetrics",
    "gunicorn_child_exit",
    "multiprocess_dir",
]

ALLOWED = "allowed"
DENIED = "denied"
SHADOW_DENIED = "shadow_denied"
BLOCKED = "blocked"
LOCAL = "local"
OUTCOMES = (ALLOWED, DENIED, SHADOW_DENIED, BLOCKED, FAIL_OPEN, FAIL_CLOSED, LOCAL)
"""Every value of the ``outcome`` label."""

# A decision takes well under a millisecond on a healthy Redis and at most about
# QUOTA_STORAGE_TIMEOUT (0.1 s by default) on a failing one.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The multiprocess directory from the environment, or ``None`` (one process)."""
    # As prometheus_client reads it: set (even empty) means multiprocess; the older
    # lower-case name counts too.
    return os.environ.get(_ENV, os.environ.get(_ENV.lower()))


def gunicorn_child_exit(server: Any, worker: Any) -> None:
    """gunicorn's ``child_exit`` hook: forget a dead worker's live gauges.

    In ``gunicorn.conf.py``: ``from flask_quota.metrics import gunicorn_child_exit
    as child_exit``. Without it, a worker that died with its breaker open keeps
    ``flask_quota_breaker_open`` at 1. Its counters stay: they were counted.
    """
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


class QuotaMetrics:
    """One app's metrics, and the Prometheus text exposition of them.

    The metrics live in a registry of the app's own (two apps in one process
    never clash); in multiprocess mode the exposition reads every process's
    files instead, so whichever worker answers a scrape reports the whole app.
    """

    def __init__(self) -> None:
        self.directory = _checked_directory()
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "flask_quota_decisions",
            "Rate-limit decisions per tier result, by outcome.",
            ("tier", "resource", "plan", "outcome"),
            registry=self.registry,
        )
        self.storage_seconds = Histogram(
            "flask_quota_storage_seconds",
            "Seconds each rate-limit decision call took.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.breaker_open = Gauge(
            "flask_quota_breaker_open",
            "1 while the storage circuit breaker is open (in any live worker).",
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.deny_cache_hits = Counter(
            "flask_quota_deny_cache_hits",
            "Decisions answered by the local deny cache without the storage.",
            registry=self.registry,
        )
        self.prefetch_hits = Counter(
            "flask_quota_prefetch_hits",
            "Decisions answered from this worker's prefetched shares without the storage.",
            registry=self.registry,
        )
        self.near_limits = Counter(
            "flask_quota_near_limit",
            "Requests that took a bucket across QUOTA_NEAR_LIMIT, once per crossing.",
            ("tier", "resource", "plan"),
            registry=self.registry,
        )
        self.alerts = Counter(
            "flask_quota_alerts",
            "QUOTA_ALERTS crossings of a calendar quota, once per bucket, share and period "
            "across the fleet (counted by the worker that claimed it).",
            ("resource", "share"),
            registry=self.registry,
        )
        self.credits_spent = Counter(
            "flask_quota_credits_spent",
            "Prepaid credit units requests were admitted at (before quota.settle's correction).",
            ("resource", "plan"),
            registry=self.registry,
        )
        self.credits_refused = Counter(
            "flask_quota_credits_refused",
            "Requests refused with 402: too few prepaid credits.",
            ("resource", "plan"),
            registry=self.registry,
        )
        self.credits_granted = Counter(
            "flask_quota_credits_granted",
            "Prepaid credit units granted through this process (quota.grant, CLI, dashboard).",
            ("resource",),
            registry=self.registry,
        )
        self.credits_events = Counter(
            "flask_quota_credits_events",
            "credits.low and credits.exhausted events, once per balance and grant across the "
            "fleet (counted by the worker that told it).",
            ("resource", "event"),
            registry=self.registry,
        )
        self.sheds = Counter(
            "flask_quota_shed",
            "Requests shed by overload protection, by class and reason (capacity, queue); "
            "shadow 'true' when QUOTA_SHADOW only counted them.",
            ("priority", "reason", "shadow"),
            registry=self.registry,
        )
        self.waits = Histogram(
            "flask_quota_wait_seconds",
            "Callers admitted after waiting for room, and how long they slept: kind 'delay' "
            "(a view's delay=, its request held) or 'wait' (quota.limited's wait=).",
            ("resource", "kind"),
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "flask_quota_in_flight",
            "Requests in flight in this app's workers, by class (overload protection on).",
            ("priority",),
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.capacity = Gauge(
            "flask_quota_capacity",
            "QUOTA_CAPACITY: requests in flight at once across the fleet, at most.",
            multiprocess_mode="livemax",
            registry=self.registry,
        )
        self.adaptive_capacity = Gauge(
            "flask_quota_adaptive_capacity",
            "QUOTA_ADAPTIVE: the requests in flight the live workers admit at most, summed "
            "(each worker's limit follows its latency).",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.breaker_open.set(0)
        # One child per label set, found with one dict lookup instead of labels()'s lock.
        self._children: dict[tuple[str, str, str, str], Counter] = {}
        self._exposed = self.registry
        if self.directory is not None:
            self._exposed = CollectorRegistry()
            self._exposed.register(_Workers(self.directory))

    # -- counting ----------------------------------------------------------------

    def count(self, tier: str, resource: str, plan: str, outcome: str) -> None:
        """One more decision in the series ``(tier, resource, plan, outcome)``."""
        key = (tier, resource, plan, outcome)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.decisions.labels(*key)
        child.inc()

    # -- the enforcer's observer ---------------------------------------------------

    def watching(self) -> bool:
        """Always: every decision is counted."""
        return True

    def stored(self, seconds: float) -> None:
        """One decision's storage call took ``seconds``."""
        self.storage_seconds.observe(seconds)

    def unavailable(self, tiers: Sequence[TierCheck], plan: str, outcome: str) -> None:
        """The storage failed: each tier counted as ``FAIL_CLOSED`` or ``FAIL_OPEN``."""
        for c in tiers:
            self.count(c.tier.value, c.name, plan, outcome)

    def decided(self, decision: Decision, *, local: bool, blocked: bool) -> None:
        """Count a decision (``local``: the in-process fallback made it; see the module
        docstring)."""
        plan = decision.plan
        if blocked:
            self.count(BLOCKED, BLOCKED, plan, BLOCKED)
            return
        if decision.allowed:
            outcome = LOCAL if local else ALLOWED
            for r in decision.results:
                if not r.shadow_denied:
                    self.count(r.tier.value, r.name, plan, outcome)
        else:
            credits = False
            for r in decision.enforced:
                if not r.outcome.allowed:
                    self.count(r.tier.value, r.name, plan, DENIED)
                    credits = credits or r.tier is Tier.CREDITS
            if credits:  # a 402 only when no rate tier's 429 answers first
                denied = decision.denied
                if denied is not None and denied.tier is Tier.CREDITS:
                    self.credits_refused.labels(denied.resource or denied.name, plan).inc()
        # Shadow tiers (QUOTA_SHADOW, a limit's `shadow` flag) that would have denied.
        shadow = decision.shadow_denied
        if shadow:
            self.count_shadow_denied(plan, ((r.tier.value, r.name) for r in shadow))

    def near_limit(self, decision: Decision, result: TierResult) -> None:
        """One more crossing of ``QUOTA_NEAR_LIMIT`` by ``result``'s bucket."""
        self.near_limits.labels(result.tier.value, result.name, decision.plan).inc()

    def alert(self, resource: str, share: float) -> None:
        """One more ``QUOTA_ALERTS`` crossing told (``alerts.Alerts``)."""
        self.alerts.labels(resource, f"{share:g}").inc()

    def shed(self, priority: Priority, reason: str, *, shadow: bool) -> None:
        """One more shed request (or one ``QUOTA_SHADOW`` only counted)."""
        self.sheds.labels(priority.value, reason, "true" if shadow else "false").inc()

    def waited(self, resource: str, kind: str, seconds: float) -> None:
        """A caller was admitted after sleeping ``seconds`` for a reservation."""
        self.waits.labels(resource, kind).observe(seconds)

    def credits_spent_units(self, resource: str, plan: str, units: int) -> None:
        """A request was admitted at ``units`` of a prepaid balance of ``resource``."""
        self.credits_spent.labels(resource, plan).inc(units)

    def credits_granted_units(self, resource: str, units: int) -> None:
        """A grant of ``units`` was written through this process."""
        self.credits_granted.labels(resource).inc(units)

    def credits_event(self, resource: str, event: str) -> None:
        """One ``credits.low`` or ``credits.exhausted`` told (``flask_quota.credits``)."""
        self.credits_events.labels(resource, event).inc()

    def count_shadow_denied(self, plan: str, tiers: Iterable[tuple[str, str]]) -> None:
        """Count ``shadow_denied`` once per (tier, policy name) that would have denied."""
        for tier, resource in tiers:
            self.count(str(tier), resource, plan, SHADOW_DENIED)

    def breaker_changed(self, error: BaseException | None) -> None:
        """The breaker's ``on_change``: opened with ``error``, closed with ``None``."""
        self.breaker_open.set(0 if error is None else 1)

    def deny_cache_hit(self) -> None:
        """The deny cache's ``on_hit``."""
        self.deny_cache_hits.inc()

    def prefetch_hit(self) -> None:
        """The prefetch layer's ``on_hit``."""
        self.prefetch_hits.inc()

    # -- exposition ----------------------------------------------------------------

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format, of all processes in multiprocess mode."""
        return generate_latest(self._exposed)

    def view(self) -> Response:
        """The ``QUOTA_METRICS_URL`` view."""
        return Response(self.exposition(), content_type=CONTENT_TYPE_LATEST)


class _Workers(Collector):
    """prometheus_client's multiprocess collector, but for the files a booting worker
    has created and not yet sized: read while empty, one failed the whole scrape (a
    500 from ``/metrics`` whenever gunicorn replaced a worker). They are skipped; the
    worker's counts show from the next scrape on."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self) -> Iterable[Metric]:
        try:
            return self._merged()
        except FileNotFoundError:  # a dead worker's live gauge, removed since listed
            return self._merged()

    def _merged(self) -> Iterable[Metric]:
        files = [f for f in glob.glob(os.path.join(self.directory, "*.db")) if _sized(f)]
        merged: Iterable[Metric] = multiprocess.MultiProcessCollector.merge(files)  # type: ignore[no-untyped-call]
        return merged


def _sized(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:  # removed since it was listed
        return False


def _checked_directory() -> str | None:
    """The multiprocess directory, checked; a setting that cannot work is an error."""
    directory = multiprocess_dir()
    # prometheus_client picks single- or multiprocess values once, when first imported.
    multi = values.ValueClass is not values.MutexValue
    if directory is None and multi:
        raise ValueError(
            f"{_ENV} was unset after prometheus_client was imported with it; keep it set for "
            "the whole life of the process"
        )
    if directory is None:
        return None
    if not multi:
        raise ValueError(
            f"{_ENV}={directory!r} was set after prometheus_client was imported, so this "
            "process counts alone; set it in the environment before the server starts"
        )
    if not (os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)):
        raise ValueError(
            f"{_ENV}={directory!r} is not a writable directory; create an empty one for each "
            "deployment before the server starts (e.g. mkdir -p and clear it in the start script)"
        )
    return directory
