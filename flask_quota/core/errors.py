"""The HTTP errors flask-quota raises, each rendered as an RFC 9457 problem."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from werkzeug.exceptions import (
    Forbidden,
    HTTPException,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
)

from . import leases
from .algorithms import Outcome
from .clock import ceil_seconds
from .headers import ENVIRON_KEY, RETRY_AFTER
from .plans import Plan, PlanCatalog
from .policy import Decision
from .tiers import RATE_TIERS, Tier
from .validators import DEFAULT_UNIT as UNIT

__all__ = [
    "PROBLEM_TYPE",
    "CallerBlocked",
    "CreditsExhausted",
    "InvalidApiKey",
    "NetworkDenied",
    "QuotaExceeded",
    "QuotaUnavailable",
    "RequestShed",
    "retry_after_seconds",
    "upgrade_for",
]

PROBLEM_TYPE = "https://iana.org/assignments/http-problem-types#quota-exceeded"

_TIER_WORDS = {
    Tier.GLOBAL: "Global (per-IP) limit",
    Tier.TENANT: "Tenant limit",  # shared by every caller of the tenant
    Tier.USER: "User limit",
}


class _Problem(HTTPException):
    """Renders ``problem()`` as ``application/problem+json`` with ``extra_headers()``."""

    def problem(self) -> dict[str, Any]:
        """The RFC 9457 problem object sent as the response body."""
        return {
            "type": "about:blank",
            "title": self.name,
            "status": self.code,
            "detail": self.description,
        }

    def extra_headers(self) -> list[tuple[str, str]]:
        """Response headers besides ``Content-Type``."""
        return []

    def get_body(self, environ: Any = None, scope: dict[str, Any] | None = None) -> str:
        return json.dumps(self.problem(), ensure_ascii=True)

    def get_headers(
        self, environ: Any = None, scope: dict[str, Any] | None = None
    ) -> list[tuple[str, str]]:
        pairs = [("Content-Type", "application/problem+json"), *self.extra_headers()]
        renamer = environ.get(ENVIRON_KEY) if environ else None  # QUOTA_HEADER_NAMES
        return renamer.pairs(pairs) if renamer is not None else pairs


class _Denial(NamedTuple):
    """What a 429 says: its ``detail`` and the attributes ``QuotaExceeded`` carries."""

    detail: str
    tier: str
    policy: str
    resource: str | None
    limit: int
    window: int
    remaining: int
    retry_after: int
    reset: int


class QuotaExceeded(_Problem, TooManyRequests):
    """A tier denied the request. Subclasses ``TooManyRequests``, so
    ``@app.errorhandler(QuotaExceeded)`` (or 429) can replace the response.

    The decision is on the exception: ``tier``, ``resource``, ``plan``, ``limit``,
    ``window``, ``remaining``, ``retry_after``, ``reset`` and ``upgrade``.
    ``cost`` is the request's cost on the endpoint tier: one above the limit's
    capacity can never pass, and the detail says so. ``detail`` replaces the body's
    ``detail`` (a limit's ``error_message=``). A concurrency limit's denial has
    ``tier`` ``"concurrent"``, ``limit`` its slots and ``window`` the leases' longest
    life (``QUOTA_LEASE_SECONDS``).
    """

    def __init__(
        self,
        decision: Decision,
        *,
        upgrade: str | None = None,
        cost: int = 1,
        detail: str | None = None,
        unit: str = UNIT,
    ) -> None:
        self.unit = unit  # what the endpoint tier's resource counts, read by _denial
        denial = self._denial(decision, cost)
        super().__init__(denial.detail if detail is None else detail)
        # Set after super().__init__, which would reset ``retry_after``.
        self.decision = decision
        self.tier: str = denial.tier  # a Tier, or "blocked" (CallerBlocked)
        self.policy = denial.policy
        self.resource = denial.resource
        self.plan = decision.plan
        self.limit = denial.limit
        self.window = denial.window
        self.remaining = denial.remaining
        self.retry_after = denial.retry_after
        self.reset = denial.reset
        self.upgrade = upgrade

    def _denial(self, decision: Decision, cost: int) -> _Denial:
        """What denied, as the attributes and the body show it: the denying tier."""
        denied = decision.denied
        if denied is None:
            raise ValueError("QuotaExceeded needs a decision in which a tier denied")
        outcome = denied.outcome
        what = _TIER_WORDS.get(denied.tier) or f"Endpoint limit {denied.name!r}"
        window = denied.rate.policy_window
        # Only the endpoint tier weighs requests by cost; the others count requests.
        unit = self.unit if denied.tier is Tier.ENDPOINT else UNIT
        if denied.tier is Tier.CONCURRENT:
            detail = _concurrent_detail(outcome.limit, denied.resource, decision.plan)
        elif denied.tier is Tier.ENDPOINT and cost > outcome.limit:
            # Retry-After is one window (the algorithms say so): waiting will not help.
            counted = "" if unit == UNIT else f" {unit}"  # a cost is in requests unless named
            detail = (
                f"{what}: this request's cost {cost} exceeds the limit's capacity "
                f"{outcome.limit}{counted}; it can never pass."
            )
        else:
            # A calendar window's nominal length would mislead: name its unit.
            period = denied.rate.calendar or f"{window} s"
            detail = (
                f"{what} exceeded: {outcome.limit} {unit} per {period} on plan {decision.plan!r}."
            )
        return _Denial(
            detail=detail,
            tier=denied.tier,
            policy=denied.name,
            resource=denied.resource,
            limit=outcome.limit,
            window=window,
            remaining=max(0, outcome.remaining),  # a charge after the fact may owe more
            retry_after=retry_after_seconds(decision),
            reset=ceil_seconds(outcome.reset_us),
        )

    def problem(self) -> dict[str, Any]:
        """The 429 problem body: RFC 9457 fields plus the denying tier, its limit and the wait."""
        return {
            "type": PROBLEM_TYPE,
            "title": "Too Many Requests",
            "status": 429,
            "detail": self.description,
            "violated-policies": [r.name for r in self.decision.results if not r.outcome.allowed],
            "tier": str(self.tier),
            "resource": self.resource,
            "plan": self.plan,
            "limit": self.limit,
            "window": self.window,
            "remaining": self.remaining,
            "retry_after": self.retry_after,
            "reset": self.reset,
            "upgrade": self.upgrade,
        }

    def extra_headers(self) -> list[tuple[str, str]]:
        """``Retry-After`` in whole seconds, at least 1."""
        return [(RETRY_AFTER, str(self.retry_after))]


class CreditsExhausted(QuotaExceeded):
    """A prepaid balance (a plan's ``"credits"`` resource) holds too few units for the
    request's cost: **402 Payment Required**, without ``Retry-After`` (time refills
    nothing), ``"tier": "credits"``, the ``balance`` left and the ``upgrade`` hint (where
    to buy more: ``QUOTA_UPGRADE_URL``). No other budget of the request was charged.

    A subclass of ``QuotaExceeded`` for what it carries; Flask dispatches it by its code,
    so an app customises it with ``@app.errorhandler(CreditsExhausted)`` or ``(402)``.
    """

    code = 402
    name = "Payment Required"

    def _denial(self, decision: Decision, cost: int) -> _Denial:
        denied = decision.denied
        if denied is None or denied.tier is not Tier.CREDITS:
            raise ValueError("CreditsExhausted needs a decision in which a credits check denied")
        self.balance = denied.outcome.remaining
        self.cost = cost
        counted = "" if self.unit == UNIT else f" {self.unit}"
        detail = (
            f"Not enough prepaid credits for {denied.resource!r}: this request needs {cost}"
            f"{counted}, the balance is {self.balance}."
        )
        return _Denial(detail, Tier.CREDITS, denied.name, denied.resource, 0, 0,
                       max(0, self.balance), 0, 0)  # fmt: skip

    def problem(self) -> dict[str, Any]:
        """The 402 problem body: the balance and this request's cost instead of a wait."""
        return {
            "type": "about:blank",
            "title": self.name,
            "status": 402,
            "detail": self.description,
            "violated-policies": [self.policy],
            "tier": str(self.tier),
            "resource": self.resource,
            "plan": self.plan,
            "balance": self.balance,
            "cost": self.cost,
            "upgrade": self.upgrade,
        }

    def extra_headers(self) -> list[tuple[str, str]]:
        """None: waiting refills nothing, so there is no ``Retry-After``."""
        return []


def upgrade_for(catalog: PlanCatalog, plan: Plan, tier: Tier, resource: str | None) -> str | None:
    """The ``upgrade`` of a denial by ``tier``: the one rule. A plan's own ``upgrade``
    text is about its rates, so it replaces the generated hint on a rate tier's denial
    only (``catalog.upgrade_hint``). Any other denial gets the plan's text for its kind
    (``Plan.upgrades``: ``concurrent``, ``credits``) when the plan says one, else its own
    generated hint: the next plan that allows more in flight (a plan's concurrency
    limit), where to buy credits (``QUOTA_UPGRADE_URL``), or none."""
    if tier in RATE_TIERS:
        return catalog.upgrade_hint(plan.name, tier, resource)
    own = plan.upgrades.get(tier.value)
    if own is not None:
        return own
    if tier is Tier.CONCURRENT:
        return leases.upgrade_hint(catalog, plan.name, of_plan=resource is None)
    if tier is Tier.CREDITS:
        return f"Buy more credits: see {catalog.upgrade_url}"
    return None


def _concurrent_detail(slots: int, resource: str | None, plan: str) -> str:
    """A concurrency limit's ``detail``: how many may run at once, and on what."""
    where = f"on {resource!r}" if resource is not None else "across every endpoint"
    return (
        f"{slots} request{'' if slots == 1 else 's'} in flight at once {where} is the limit "
        f"on plan {plan!r}; "
        "retry when one of yours has finished."
    )


def retry_after_seconds(decision: Decision) -> int:
    """``Retry-After`` of a denied decision: whole seconds, at least 1."""
    denied = decision.denied
    wait = denied.outcome.retry_after_us if denied is not None else 0
    return max(1, decision.seconds_until(decision.now_us + wait))


class CallerBlocked(QuotaExceeded):
    """The caller is blocked (``QUOTA_BLOCK_AFTER`` or ``quota.block``): 429 with
    ``"tier": "blocked"`` and ``Retry-After`` the rest of the block.

    ``decision`` holds the tiers as the storage saw them; none was charged. ``by``
    is who blocked, as stored with the block (``"auto"``: ``QUOTA_BLOCK_AFTER``;
    anything else: an operator); ``reason`` is shown only when given, which
    ``blocking.caller_facing`` does for a reason the operator made public.
    """

    def __init__(
        self,
        decision: Decision,
        block: Outcome,
        *,
        by: str | None = None,
        reason: str | None = None,
    ) -> None:
        self._block = (block, by, reason)  # read by _denial, which __init__ below calls
        super().__init__(decision)

    def _denial(self, decision: Decision, cost: int) -> _Denial:
        """No tier denied, the block did: its rest is the wait and the window."""
        block, by, reason = self._block
        retry_after = max(1, decision.seconds_until(decision.now_us + block.retry_after_us))
        return _Denial(
            detail=_blocked_detail(retry_after, by, reason),
            tier="blocked",
            policy="blocked",
            resource=None,
            limit=0,
            window=retry_after,
            remaining=0,
            retry_after=retry_after,
            reset=ceil_seconds(block.reset_us),
        )

    def problem(self) -> dict[str, Any]:
        return {**super().problem(), "violated-policies": ["blocked"]}


def _blocked_detail(retry_after: int, by: str | None, reason: str | None) -> str:
    """A block's ``detail``: said to be an operator's only when it is one (unknown: neither)."""
    if by == "auto":
        return f"Blocked for {retry_after} more s after too many denied requests."
    if not by:
        return f"Blocked for {retry_after} more s."
    detail = f"Blocked by an operator for {retry_after} more s."
    return f"{detail} Reason: {reason}" if reason else detail


class QuotaUnavailable(_Problem, ServiceUnavailable):
    """``QUOTA_FAIL_MODE=closed`` and the storage is down: 503 with ``Retry-After``."""

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__(
            "Rate-limit storage is unavailable; requests are refused until it recovers."
        )
        self.retry_after = max(1, retry_after)

    def problem(self) -> dict[str, Any]:
        """The 503 problem body, with ``retry_after``."""
        return {**super().problem(), "retry_after": self.retry_after}

    def extra_headers(self) -> list[tuple[str, str]]:
        """``Retry-After`` until the next probe of the storage."""
        return [(RETRY_AFTER, str(self.retry_after))]


class RequestShed(_Problem, ServiceUnavailable):
    """The service sheds the request to protect itself (overload protection): 503 with
    ``Retry-After`` and ``"tier"``: ``"capacity"`` (the capacity in force, less the
    reserves of the classes above this request's, is in use) or ``"queue"`` (it waited
    longer than ``QUOTA_MAX_QUEUE_MS`` before reaching the app), and its ``"priority"``.
    No caller budget was charged. ``decision`` is the storage's decision when the fleet's
    capacity refused it (else None: decided in-process)."""

    def __init__(
        self,
        tier: str,
        priority: str,
        *,
        retry_after: int = 1,
        limit: int | None = None,
        decision: Decision | None = None,
    ) -> None:
        if tier == "queue":
            detail = (
                f"The request waited longer than the {limit} ms allowed before reaching the "
                f"service, which sheds such {priority} requests under load."
            )
        else:
            at = f" ({limit} in flight for {priority} requests)" if limit is not None else ""
            detail = (
                f"The service is at its capacity{at}; {priority} requests are shed until it "
                "has room. Retry later."
            )
        super().__init__(detail)
        # Set after super().__init__, which would reset ``retry_after``.
        self.tier = tier
        self.priority = priority
        self.retry_after = max(1, retry_after)
        self.limit = limit
        self.decision = decision

    def problem(self) -> dict[str, Any]:
        """The 503 problem body: the reason (``tier``), the request's class and the wait."""
        return {
            **super().problem(),
            "tier": self.tier,
            "priority": self.priority,
            "limit": self.limit,
            "retry_after": self.retry_after,
        }

    def extra_headers(self) -> list[tuple[str, str]]:
        """``Retry-After`` in whole seconds, at least 1."""
        return [(RETRY_AFTER, str(self.retry_after))]


class NetworkDenied(_Problem, Forbidden):
    """The caller's address is in a network an operator denied (``flask quota networks
    deny``, ``quota.block(ip=CIDR)``, the dashboard's Networks page): 403 with
    ``"tier": "network"``. A timed denial adds ``Retry-After`` (and ``retry_after`` in the
    body), the rest of the denial; one without an end has neither. Refused before any
    storage call: no budget of the caller's was charged. ``network`` (the rule's CIDR) is
    on the exception for the app's own handler and logs; the body does not name it."""

    def __init__(self, network: str, retry_after: int | None = None) -> None:
        if retry_after is None:
            detail = "Requests from your network are refused by the operators of this service."
        else:
            detail = (
                f"Requests from your network are refused by the operators of this service "
                f"for {retry_after} more s."
            )
        super().__init__(detail)
        self.tier = "network"
        self.network = network
        self.retry_after = retry_after

    def problem(self) -> dict[str, Any]:
        """The 403 problem body: RFC 9457 fields, ``tier`` and, when timed, the wait."""
        body = {**super().problem(), "tier": self.tier}
        if self.retry_after is not None:
            body["retry_after"] = self.retry_after
        return body

    def extra_headers(self) -> list[tuple[str, str]]:
        """``Retry-After`` (whole seconds, at least 1) for a timed denial only."""
        if self.retry_after is None:
            return []
        return [(RETRY_AFTER, str(self.retry_after))]


class InvalidApiKey(_Problem, Unauthorized):
    """An unknown, revoked or malformed API key with ``QUOTA_REJECT_UNKNOWN_KEYS`` set."""

    def __init__(self, header: str) -> None:
        self.header = header
        super().__init__(f"The API key in the {header} header is unknown, revoked or malformed.")

    def extra_headers(self) -> list[tuple[str, str]]:
        """``WWW-Authenticate`` naming the API-key header."""
        return [("WWW-Authenticate", f'ApiKey header="{self.header}"')]
