"""Blocks on the request path: a blocked caller's 429, and a denial counted towards
``QUOTA_BLOCK_AFTER``.

A block is one key per caller, ``quota:{tag}:b``, in the caller's hash slot
(so Redis Cluster decides it with the caller's tiers), holding JSON about who
blocked and why (``block_info``), with the block's length as its TTL. Every decision
carries a ``Gate.BLOCK`` check on it, so a block costs no extra round trip, and the
deny cache answers a blocked caller locally until the block ends.

With ``QUOTA_BLOCK_AFTER`` set, each denied request charges the caller's
"denials" bucket at that rate (one more storage call, on denials only); when
that bucket denies, the caller is blocked for ``QUOTA_BLOCK_FOR`` seconds
(``escalate``). A blocked caller is told an operator blocked it, and the reason only
if the operator made it public (``caller_facing``). Operators' blocks and unblocks
are ``tools/blocks.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .core.algorithms import Outcome
from .core.clock import US
from .core.errors import CallerBlocked
from .core.keys import KeyBuilder
from .core.policy import Decision, gate_check
from .settings import Settings
from .state import QuotaState
from .storage import Check, Storage
from .storage.denycache import DenyCache
from .storage.failover import GuardedStorage

__all__ = ["INFO_SECONDS", "block_info", "blocked_event", "caller_facing", "escalate", "refusal"]


def escalate(
    storage: Storage,
    guard: GuardedStorage,
    settings: Settings,
    keys: KeyBuilder,
    tag: str,
    *,
    on_block: Callable[[str, int, str], None] = lambda tag, seconds, reason: None,
) -> Outcome | None:
    """Count one denial of ``tag`` towards ``QUOTA_BLOCK_AFTER``; the block's outcome when
    the caller is blocked now (by this denial, or meanwhile by another worker).
    ``on_block(tag, seconds, reason)`` is told when this denial set the block."""
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
    info = block_info(f"denied more than {rate.per()}", "auto", seconds)

    def set_block() -> bool:
        storage.block(gate.key, seconds, info)
        return True

    if not guard.attempt(set_block):
        return None  # the storage failed: the caller gets the ordinary 429
    on_block(tag, seconds, f"denied more than {rate.per()}")
    if isinstance(storage, DenyCache):
        # The denials bucket's cached "no" would hide the block from this worker; the
        # next decision asks the storage, sees the block and caches that instead.
        storage.forget([denials.key])
    return Outcome(False, 0, 0, verdict.now_us + seconds * US, seconds * US)


def blocked_event(state: QuotaState, tag: str, seconds: int, reason: str, by: str) -> None:
    """With ``QUOTA_WEBHOOK_URL``: a ``caller.blocked`` event for the outbox (``tag``: the
    caller's, such as ``id=ada`` or ``ip=203.0.113.7``; ``by``: ``auto`` or the operator)."""
    outbox = state.outbox
    if outbox is None:
        return
    from .webhooks import new_event

    now = datetime.now(UTC)
    data = {
        "caller": tag,
        "seconds": seconds,
        "until": (now + timedelta(seconds=seconds)).isoformat(),
        "reason": reason,
        "by": by,
    }
    outbox.event(new_event("caller.blocked", data, now))


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


def block_info(reason: str, by: str, seconds: int, *, public: bool = False) -> str:
    at = int(time.time())
    return json.dumps({"reason": reason, "by": by, "at": at, "seconds": seconds, "public": public})
