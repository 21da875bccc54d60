"""Operators' network rules on the request path: a denied network's 403, an allowed
network's pass on the per-IP global tier.

The rules are rows of ``quota_networks`` (``flask quota networks``, the dashboard's
Networks page, ``quota.block(ip=CIDR)``), loaded with the rest of the quota tables into
each process's snapshot and matched in-process (``core.networks.NetworkRules``): no
storage call, no query. The request edge (``edge.before_hook``) calls ``check`` only when
the snapshot has rules (``SqlStore.networks`` is not None), so an app without any pays
one attribute check per request.
"""

from __future__ import annotations

from .core.errors import NetworkDenied
from .state import QuotaState

__all__ = ["check"]


def check(state: QuotaState, remote_addr: str | None) -> bool:
    """Decide ``remote_addr`` (the request's ``REMOTE_ADDR``) by the operators' rules:
    raises ``NetworkDenied`` (403) when its network is denied, returns True when it is
    allowed (the request skips the global tier, ``Facts.allowed``), False otherwise."""
    rules = state.sql.networks
    if rules is None:
        return False
    rule = rules.match(remote_addr)
    if rule is None:
        return False
    if rule.deny:
        raise NetworkDenied(rule.cidr, rules.seconds_left(rule))
    return True
