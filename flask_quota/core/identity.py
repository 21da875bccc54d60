"""Who is calling: identities, client addresses and API key syntax."""

from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass

__all__ = ["Identity", "client_ip", "plausible_api_key"]

log = logging.getLogger("flask_quota")


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
    """``client_ip`` by parsing the address (the path for all but canonical dotted quads).

    Some proxies write the client's port too: ``ipv4:port`` and ``[ipv6]:port`` are
    their address. Anything else that is no address is keyed as ``unknown`` (one
    bucket for all of them: never a way to a fresh one) and said once per process.
    """
    text = remote_addr
    address = _address(text)
    if address is None:
        host, _, port = text.rpartition(":")
        if port.isdigit() and host.startswith("[") and host.endswith("]"):
            address = _address(host[1:-1])
        elif port.isdigit() and host.count(".") == 3 and ":" not in host:
            address = _address(host)
    if address is None:
        _tell_unparsed(remote_addr)
        return "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        # One subscriber usually owns a whole /64; keying by /128 is free to evade.
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # a zone index is no part of it
    except ValueError:
        return None


_told_unparsed = False  # ``_tell_unparsed`` has spoken (once per process)


def _tell_unparsed(remote_addr: str) -> None:
    global _told_unparsed
    if _told_unparsed:
        return
    _told_unparsed = True
    log.warning(
        "flask-quota: the client address %r is not an IP address (nor one with a port); "
        "such callers share the global tier's 'unknown' bucket. Check what the server or "
        "the proxy (through ProxyFix) puts in REMOTE_ADDR. This is said once.",
        remote_addr,
    )


_KEY_RE = re.compile(r"[\x21-\x7e]{8,256}")


def plausible_api_key(value: str) -> bool:
    """Cheap syntax check before any lookup: 8-256 visible ASCII characters."""
    return _KEY_RE.fullmatch(value) is not None
