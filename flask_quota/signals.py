"""Signals (blinker, as ``flask.signals``): subscribe to hear about breaches and outages::

    from flask_quota import signals

    @signals.quota_exceeded.connect_via(app)
    def breach(sender, decision, **extra): ...

``quota_exceeded``: a request was denied (429); ``sender`` is the app,
``decision`` the ``Decision``. ``quota_shadow_exceeded``: a shadow tier would
have denied a request (once per request; ``decision.shadow_denied`` names the
tiers); same arguments. ``storage_failed``: the storage stopped
answering and the fail mode applies; ``error`` is the exception.
``storage_recovered``: it answers again. The storage signals are sent once per
change of the circuit breaker, not once per request.
"""

from __future__ import annotations

from blinker import Namespace

__all__ = ["quota_exceeded", "quota_shadow_exceeded", "storage_failed", "storage_recovered"]

_signals = Namespace()

quota_exceeded = _signals.signal("quota-exceeded")
quota_shadow_exceeded = _signals.signal("quota-shadow-exceeded")
storage_failed = _signals.signal("quota-storage-failed")
storage_recovered = _signals.signal("quota-storage-recovered")
