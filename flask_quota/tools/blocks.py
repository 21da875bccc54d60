"""Blocks: a caller who keeps getting denied is refused outright for a while.

A block is one key per caller, ``quota:{tag}:b``, in the caller's hash slot
(so Redis Cluster decides it with the caller's tiers), holding JSON about who
blocked and why, with the block's length as its TTL. Every decision carries a
``Gate.BLOCK`` check on it, so a block costs no extra round trip, and the deny
cache answers a blocked caller locally until the block ends.

With ``QUOTA_BLOCK_AFTER`` set, each denied request charges the caller's
"denials" bucket at that rate (one more storage call, on denials only); when
that bucket denies, the caller is blocked for ``QUOTA_BLOCK_FOR`` seconds.
Operators block and unblock by hand through ``quota.block``/``quota.unblock``,
``flask quota block|unblock|blocks list`` and the dashboard; each change is
audited here before it is made (a storage call that fails adds ``<action>.failed``),
and an unblock bumps the SQL version so that every worker's deny cache forgets
the block within the sync interval. A blocked caller is told an operator blocked
it, and the reason only if the operator made it public (``caller_facing``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ..core.algorithms import Outcome
from ..core.clock import US, ceil_seconds
from ..core.errors import CallerBlocked
from ..core.keys import KeyBuilder, Tag
from ..core.policy import Decision, gate_check
from ..core.validators import is_count
from ..settings import Settings
from ..sql.admin import QuotaAdmin
from ..state import QuotaState
from ..storage import Check, Storage
from ..storage.denycache import DenyCache
from ..storage.failover import GuardedStorage
from .inspection import Caller

__all__ = [
    "Block",
    "block",
    "caller_facing",
    "escalate",
    "gate_check",
    "list_blocks",
    "refusal",
    "unblock",
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


def escalate(
    storage: Storage, guard: GuardedStorage, settings: Settings, keys: KeyBuilder, tag: str
) -> Outcome | None:
    """Count one denial of ``tag`` towards ``QUOTA_BLOCK_AFTER``; the block's outcome when
    the caller is blocked now (by this denial, or meanwhile by another worker)."""
    rate = settings.block_after
    if rate is None:
        return None
    gate = gate_check(keys, tag)
    denials = Check(keys.denials_key(tag, settings.algorithm), settings.algorithm, rate, 1)
    verdict = guard.attempt(lambda: storage.decide([gate, denials]))
    if verdict is None or verdict.allowed:
        return None  # storage down, or still under the threshold
    gate_outcome, _ = verdict.outcomes
    if not gate_outcome.allowed:
        return gate_outcome
    seconds = settings.block_for
    info = _info(f"denied more than {rate.per()}", "auto", seconds)

    def set_block() -> bool:
        storage.block(gate.key, seconds, info)
        return True

    if not guard.attempt(set_block):
        return None  # the storage failed: the caller gets the ordinary 429
    if isinstance(storage, DenyCache):
        # The denials bucket's cached "no" would hide the block from this worker; the
        # next decision asks the storage, sees the block and caches that instead.
        storage.forget([denials.key])
    return Outcome(False, 0, 0, verdict.now_us + seconds * US, seconds * US)


INFO_SECONDS = 2.0  # how long a worker reuses what a block says (blocked floods)


def refusal(state: QuotaState, decision: Decision, gate: Outcome, key: str) -> CallerBlocked:
    """The 429 of a caller whose block gate ``key`` refused it: who blocked it (``auto``
    or an operator) and the reason if it is public, from the block itself.

    The gate is decided in the request's one storage call, but what the block says
    is not; it is read once per ``INFO_SECONDS`` per worker, so a blocked flood
    costs about one read every two seconds. Unreadable (storage failing): the 429
    claims no cause.
    """
    now = time.monotonic()
    cache = state.block_infos
    found = cache.current.get(key) or cache.recall(key)
    if found is None or found[0] < now:
        info = state.guard.attempt(lambda: state.storage.block_info(key))
        found = (now + INFO_SECONDS, caller_facing(info or ""))
        cache.put(key, found)
    return CallerBlocked(decision, gate, **found[1])


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
    info = _info(reason, admin.actor, seconds, public=bool(public))
    entry = {"seconds": seconds, "reason": reason, "public": bool(public)}
    for tag in tags:
        with admin.audited("block", tag, None, entry):
            state.storage.block(state.policy.keys.block_key(tag), seconds, info)
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


def caller_facing(info: str) -> dict[str, str | None]:
    """What a blocked caller may be told about its block (``CallerBlocked``'s keywords),
    from the JSON stored with it: who blocked (``"auto"`` or an operator) and the
    reason only if the operator made it public. Blocks stored by earlier releases
    have no ``public`` flag: their reason stays private."""
    try:
        data = json.loads(info)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return {"by": None, "reason": None}
    by = data.get("by")
    reason = data.get("reason")
    shown = reason if data.get("public") is True and isinstance(reason, str) and reason else None
    return {"by": by if isinstance(by, str) else None, "reason": shown}


def _info(reason: str, by: str, seconds: int, *, public: bool = False) -> str:
    at = int(time.time())
    return json.dumps({"reason": reason, "by": by, "at": at, "seconds": seconds, "public": public})
