"""Signals (blinker, as ``flask.signals``): subscribe to hear about breaches and outages::

    from flask_quota import signals

    @signals.quota_exceeded.connect_via(app)
    def breach(sender, decision, **extra): ...

``quota_exceeded``: a request was denied (429); ``sender`` is the app,
``decision`` the ``Decision``. ``storage_failed``: the storage stopped
answering and the fail mode applies; ``error`` is the exception.
``storage_recovered``: it answers again. The storage signals are sent once per
change of the circuit breaker, not once per request.
"""

from __future__ import annotations

from blinker import Namespace

__all__ = ["quota_exceeded", "storage_failed", "storage_recovered"]

_signals = Namespace()

quota_exceeded = _signals.signal("quota-exceeded")
storage_failed = _signals.signal("quota-storage-failed")
storage_recovered = _signals.signal("quota-storage-recovered")
