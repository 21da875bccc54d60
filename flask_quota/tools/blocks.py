"""Operators' blocks: ``quota.block``/``quota.unblock``/``quota.blocks``, the CLI's and
the dashboard's (a block on the request path is ``flask_quota/blocking.py``).

Each change is audited here before it is made (a storage call that fails adds
``<action>.failed``), and an unblock bumps the SQL version so that every worker's deny
cache forgets the block within the sync interval.

``ip`` may name a network (``split_ip``): a CIDR shorter than one address is blocked as
a timed denial of that network (a ``quota_networks`` row, ``block_network``), lifted by
``unblock_network``; a plain address (or its /32, /128) is blocked as the caller it is.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta

from ..blocking import block_info, blocked_event
from ..core.clock import US, ceil_seconds
from ..core.keys import Tag
from ..core.networks import DENY, Network, parse_network
from ..core.policy import gate_check
from ..core.validators import is_count
from ..sql.admin import QuotaAdmin
from ..state import QuotaState
from .inspection import Caller

__all__ = [
    "Block",
    "block",
    "block_network",
    "list_blocks",
    "split_ip",
    "unblock",
    "unblock_network",
]

_REASON_MAX = 200


@dataclass(frozen=True, slots=True)
class Block:
    """A live block as ``quota.blocks()`` lists it."""

    tag: str  # "id=..." (an identity) or "ip=..." (the anonymous caller from an address)
    name: str  # the identity or address itself
    until: int  # Unix seconds
    remaining: int  # whole seconds left
    reason: str
    by: str  # "auto" (QUOTA_BLOCK_AFTER) or who blocked by hand
    public: bool = False  # the caller's 429 shows the reason (blocks before it: never)


# -- tools: quota.block/unblock/blocks, the CLI and the dashboard ---------------


def block(
    state: QuotaState,
    caller: Caller,
    seconds: int,
    reason: str,
    actor: str,
    *,
    public: bool = False,
) -> list[str]:
    """Block the caller's identity, and the anonymous caller of its address if one is
    named, for ``seconds``. Returns the blocked tags.

    Each tag is audited before its block is written; a write that fails adds a
    ``block.failed`` entry and raises (the tags after it are left alone). ``public``:
    the caller's 429 shows ``reason`` (otherwise it only says an operator blocked it).
    """
    if not is_count(seconds, minimum=1):
        raise ValueError(f"seconds must be a whole number above 0, got {seconds!r}")
    if not isinstance(reason, str):
        raise ValueError(f"reason must be a string, got {type(reason).__name__}")
    reason = reason.strip()[:_REASON_MAX]
    tags = caller.tags
    admin = QuotaAdmin(state.sql, actor=actor)
    info = block_info(reason, admin.actor, seconds, public=bool(public))
    entry = {"seconds": seconds, "reason": reason, "public": bool(public)}
    for tag in tags:
        with admin.audited("block", tag, None, entry):
            state.storage.block(state.policy.keys.block_key(tag), seconds, info)
        blocked_event(state, tag, seconds, reason, admin.actor)
    return tags


def unblock(state: QuotaState, caller: Caller, actor: str) -> list[str]:
    """Lift the blocks of ``block``'s tags (and forget their denials). Returns the tags
    that were blocked.

    Each tag is audited before it is touched; a storage call that fails adds an
    ``unblock.failed`` entry and raises. Then bumps the SQL version so that every
    worker's deny cache forgets the block within the sync interval.
    """
    keys, tags = state.policy.keys, caller.tags
    admin = QuotaAdmin(state.sql, actor=actor)
    blocked = []
    for tag in tags:
        gate = gate_check(keys, tag)
        with admin.audited("unblock", tag):
            if not state.storage.peek([gate]).outcomes[0].allowed:
                blocked.append(tag)
            state.storage.clear([gate.key, keys.denials_key(tag, state.settings.algorithm)])
    state.sql.bump()
    return blocked


def split_ip(ip: str | None) -> tuple[str | None, Network | None]:
    """``quota.block``'s ``ip``: (the address, None) for an address, (None, the network)
    for a CIDR shorter than one address (``10.0.0.0/8``, ``2001:db8::/48``). A /32 or
    /128 is its address. Raises ``ValueError`` for a CIDR that is no network."""
    if ip is None or "/" not in ip:
        return ip, None
    network = parse_network(ip)
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address), None
    return None, network


def block_network(
    state: QuotaState,
    network: Network,
    seconds: int,
    reason: str,
    actor: str,
    *,
    public: bool = False,
) -> str:
    """Deny ``network`` for ``seconds``: a timed network rule (audited as
    ``network.deny``, replacing the network's earlier rule), refused with 403 by every
    worker within the sync interval. Returns its CIDR. A network's 403 never shows the
    reason, so ``public`` is refused."""
    if not is_count(seconds, minimum=1):
        raise ValueError(f"seconds must be a whole number above 0, got {seconds!r}")
    if not isinstance(reason, str):
        raise ValueError(f"reason must be a string, got {type(reason).__name__}")
    if public:
        raise ValueError(
            "public=True shows a caller's block reason in its 429; a network's 403 never "
            "shows the reason: leave public out when ip names a network"
        )
    admin = QuotaAdmin(state.sql, actor=actor)
    lifetime = timedelta(seconds=seconds)
    return admin.deny_network(str(network), expires_in=lifetime, reason=reason.strip()[:200]).cidr


def unblock_network(state: QuotaState, network: Network, actor: str) -> list[str]:
    """Remove the denial of ``network`` (audited as ``network.remove``); returns its CIDR
    when it was denied, else nothing (an allowance of it is left alone)."""
    admin = QuotaAdmin(state.sql, actor=actor)
    removed = admin.remove_network(str(network), action=DENY, missing_ok=True)
    return [removed.cidr] if removed is not None else []


def list_blocks(state: QuotaState) -> list[Block]:
    """Every live block, the longest-lasting first (one SCAN on Redis: an admin call)."""
    now = time.time()
    found = []
    for entry in state.storage.blocks(state.policy.keys.block_match()):
        tag = entry.key[entry.key.find("{") + 1 : entry.key.rfind("}")]
        try:
            info = json.loads(entry.info)
        except ValueError:
            info = {}
        if not isinstance(info, dict):
            info = {}
        until = ceil_seconds(round(now * US) + entry.remaining_us)
        found.append(
            Block(
                tag,
                Tag(tag).value,
                until,
                max(1, ceil_seconds(entry.remaining_us)),
                str(info.get("reason", "")),
                str(info.get("by", "")),
                info.get("public") is True,
            )
        )
    return sorted(found, key=lambda b: (-b.until, b.tag))
