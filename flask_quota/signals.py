"""Signals (blinker, as ``flask.signals``): subscribe to hear about breaches and outages::

    from flask_quota import signals

    @signals.quota_exceeded.connect_via(app)
    def breach(sender, decision, **extra): ...

``quota_exceeded``: a request was denied (429); ``sender`` is the app,
``decision`` the ``Decision``. ``quota_shadow_exceeded``: a shadow tier would
have denied a request (once per request; ``decision.shadow_denied`` names the
tiers); same arguments. ``quota_near_limit``: a request took a bucket across
``QUOTA_NEAR_LIMIT`` (once per crossing, across every worker and server: the
atomic storage call tells which request crossed); ``decision`` as above and
``check``, the ``TierResult`` of that bucket. ``storage_failed``: the storage stopped
answering and the fail mode applies; ``error`` is the exception.
``storage_recovered``: it answers again. The storage signals are sent once per
change of the circuit breaker, not once per request. ``quota_shed``: overload
protection shed a request (503); ``priority`` is its class, ``reason`` ``capacity``
or ``queue``, ``shadow`` True when ``QUOTA_SHADOW`` only counted it and served it.
``quota_alert``: a calendar quota (``N/month``, ``N/year``) was taken across a
``QUOTA_ALERTS`` share, once per bucket, share and period across every worker and
server; ``identity``, ``client`` (the SQL client's id, else None), ``tenant``,
``resource`` (``user``, ``tenant`` or the resource), ``share`` and ``period`` (``start``
and ``end``, ISO 8601 UTC). It is sent from flask-quota's writer thread inside an app
context, within about ``QUOTA_SYNC_INTERVAL`` of the crossing, not in the request.
``credits_low``: a prepaid balance fell to or under a ``QUOTA_ALERTS`` share of its last
grant used up; ``credits_exhausted``: to or under zero. Each once per balance and grant
across every worker and server, from the writer thread like ``quota_alert``, with
``caller`` (the identity id), ``resource``, ``balance``, ``grant`` (the last grant's id),
``units`` (its units) and, for ``credits_low``, ``share``.

A receiver that raises is logged (with its traceback) and the others still run:
the decision stands, whatever a receiver does.
"""

from __future__ import annotations

import logging
from typing import Any

from blinker import NamedSignal, Namespace

__all__ = [
    "credits_exhausted",
    "credits_low",
    "notify",
    "quota_alert",
    "quota_exceeded",
    "quota_near_limit",
    "quota_shadow_exceeded",
    "quota_shed",
    "storage_failed",
    "storage_recovered",
]

log = logging.getLogger("flask_quota")

_signals = Namespace()

quota_exceeded = _signals.signal("quota-exceeded")
quota_shadow_exceeded = _signals.signal("quota-shadow-exceeded")
quota_near_limit = _signals.signal("quota-near-limit")
quota_shed = _signals.signal("quota-shed")
quota_alert = _signals.signal("quota-alert")
credits_low = _signals.signal("quota-credits-low")
credits_exhausted = _signals.signal("quota-credits-exhausted")
storage_failed = _signals.signal("quota-storage-failed")
storage_recovered = _signals.signal("quota-storage-recovered")


def notify(signal: NamedSignal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to each receiver in turn; one that raises is logged, not raised.

    ``Signal.send`` stops at the first receiver that raises and hands the exception
    to its caller, here a request that has already been decided.
    """
    for receiver in signal.receivers_for(sender):
        try:
            receiver(sender, **kwargs)
        except Exception:
            log.exception(
                "flask-quota: a receiver of the %r signal raised; the decision stands", signal.name
            )
