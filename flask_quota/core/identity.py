"""Who is calling: identities, client addresses and API key syntax."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = ["Identity", "client_ip", "plausible_api_key"]


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller known to the app. ``plan`` ``None`` means ``QUOTA_DEFAULT_PLAN``;
    ``tenant`` names the customer org whose ``tenant`` bucket the caller also draws from
    (``None``: the tenant tier does not apply)."""

    id: str
    plan: str | None = None
    tenant: str | None = None

    # Written out (dataclass keeps it): an identity loader makes one per request, and the
    # generated __init__ would call __post_init__ for these checks, a second frame.
    def __init__(self, id: str, plan: str | None = None, tenant: str | None = None) -> None:
        if not isinstance(id, str) or not id:
            raise ValueError("Identity.id must be a non-empty string")
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            raise ValueError("Identity.tenant must be a non-empty string, or None")
        _set(self, "id", id)  # frozen: set as the generated __init__ does
        _set(self, "plan", plan)
        _set(self, "tenant", tenant)

    def __post_init__(self) -> None:
        """The same checks for a dataclass subclass, whose generated __init__ calls this."""
        Identity.__init__(self, self.id, self.plan, self.tenant)


_set = object.__setattr__


# A dotted quad exactly as ``ipaddress`` prints it (no leading zeros, parts <= 255):
# most addresses are one, and matching it costs a fraction of parsing it.
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CANONICAL_IPV4 = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")


def client_ip(remote_addr: str | None) -> str:
    """The address the global tier is keyed by; IPv6 grouped by /64.

    Only ``request.remote_addr`` is trusted: behind a proxy the app applies
    Werkzeug's ``ProxyFix``, so a client's own ``X-Forwarded-For`` changes nothing.
    """
    if remote_addr is not None and _CANONICAL_IPV4.fullmatch(remote_addr):
        return remote_addr  # what parsed_ip() would return for it
    return parsed_ip(remote_addr or "")


def parsed_ip(remote_addr: str) -> str:
    """``client_ip`` by parsing the address (the path for all but canonical dotted quads)."""
    try:
        address = ipaddress.ip_address(remote_addr.split("%", 1)[0])
    except ValueError:
        return "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        # One subscriber usually owns a whole /64; keying by /128 is free to evade.
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


_KEY_RE = re.compile(r"[\x21-\x7e]{8,256}")


def plausible_api_key(value: str) -> bool:
    """Cheap syntax check before any lookup: 8-256 visible ASCII characters."""
    return _KEY_RE.fullmatch(value) is not None
