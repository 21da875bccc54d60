"""Storage key layout: ``quota:{tag}:tier[:METHOD:resource]:algorithm``, and
``quota:{tag}:b`` (a block), ``quota:{tag}:d:algorithm`` (denials towards one) and
``quota:{tag}:c[:resource]`` (a set of leases, ``core/leases.py``).

The ``{tag}`` is a Redis Cluster hash tag: every key of one identity lands in
one slot; a tenant's bucket (``quota:{t=acme}:t:algorithm``) has a tag of its own,
so it lands in its tenant's slot, shared by all of the tenant's callers.
Anything that came from a client is percent-encoded (``{``, ``}``, ``:`` and
``%`` included), so no input can collide with another key or choose
a slot; over-long parts are replaced by a digest.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote

from .algorithms import Algorithm
from .identity import client_ip

__all__ = ["IDENTITY", "IP", "OWNER", "TENANT", "KeyBuilder", "Tag", "escape", "remote_ip_tag"]

_MAX_PART = 128
_SAFE = "._-~@=+"
# Exactly the characters ``quote(part, safe=_SAFE)`` leaves as they are.
_UNCHANGED_RE = re.compile(rf"[A-Za-z0-9._\-~@=+]{{0,{_MAX_PART}}}")


def escape(part: str) -> str:
    """Percent-encode a client-influenced key part (hashed when long), so it cannot collide."""
    if _UNCHANGED_RE.fullmatch(part):
        return part  # fast path: what quote() would return, without encoding
    raw = part.encode("utf-8", "surrogatepass")  # lone surrogates (from JSON) still encode
    encoded = quote(raw, safe=_SAFE)
    if len(encoded) <= _MAX_PART:
        return encoded
    # quote() only ever writes "%" before two hex digits, so "%h" cannot be the
    # escape of any input: no identity can pose as another one's digest.
    return "%h" + hashlib.sha256(raw).hexdigest()


# The kinds of tag, as their text begins: an anonymous caller's (or an address's global
# tier), an identity's, a ``key=`` bucket owner's, and a tenant's (its tenant tier).
IP, IDENTITY, OWNER, TENANT = "ip=", "id=", "k=", "t="
_MAX_TAG = 300  # what a caller tag read back (a URL, usage records) may be at most


@dataclass(frozen=True, slots=True)
class Tag:
    """A caller tag read back (from usage, a block's key, a URL): the one parser of the
    format ``KeyBuilder`` writes. Building stays in ``KeyBuilder``, a plain string on
    the request path."""

    text: str

    @staticmethod
    def valid(text: str) -> bool:
        """A caller's tag as the extension builds them: ``id=...`` or ``ip=...``."""
        return text.startswith((IDENTITY, IP)) and len(IP) < len(text) <= _MAX_TAG

    @property
    def is_ip(self) -> bool:
        return self.text.startswith(IP)

    @property
    def is_identity(self) -> bool:
        return self.text.startswith(IDENTITY)

    @property
    def raw(self) -> str:
        """The escaped part after ``kind=``."""
        return self.text.partition("=")[2]

    @property
    def hashed(self) -> bool:
        """True when the value is a digest (a long id): it cannot be read back."""
        return self.raw.startswith("%h")

    @property
    def value(self) -> str:
        """The address or identity id, unescaped (a digest stays as it is)."""
        return unquote(self.raw)

    @property
    def client_id(self) -> str | None:
        """The SQL client id an identity tag may name (``id=<digits>``)."""
        raw = self.raw
        return raw if self.is_identity and raw.isdigit() else None


class KeyBuilder:
    """Storage keys of the tiers; ``{tag}`` hash tags keep a caller in one Cluster slot."""

    def __init__(self, prefix: str = "quota") -> None:
        self.prefix = prefix

    @staticmethod
    def ip_tag(ip: str) -> str:
        """The tag of an anonymous caller or of an IP's global tier: ``ip=...``."""
        return IP + escape(ip)

    @staticmethod
    def identity_tag(identity_id: str) -> str:
        """The tag of an identity: ``id=...``."""
        # Distinct prefixes keep an identity named "ip=1.2.3.4" off that IP's budget.
        if len(identity_id) <= _CACHED_ID:
            return _identity_tag(identity_id)
        return IDENTITY + escape(identity_id)

    @staticmethod
    def key_tag(value: str) -> str:
        """The tag of a ``key=`` bucket (an organisation, a tenant): never an identity's or IP's."""
        return OWNER + escape(value)

    @staticmethod
    def tenant_tag(tenant: str) -> str:
        """The tag of a tenant's bucket: ``t=...``, never a caller's, IP's or owner's."""
        return TENANT + escape(tenant)

    def tenant_key(self, tenant_tag: str, algorithm: Algorithm) -> str:
        """The tenant tier's key: in the tenant's own hash slot, not its callers'."""
        return f"{self.prefix}:{{{tenant_tag}}}:t:{algorithm.code}"

    def global_key(self, ip_tag: str, algorithm: Algorithm) -> str:
        """The global tier's key for an IP."""
        return f"{self.prefix}:{{{ip_tag}}}:g:{algorithm.code}"

    def user_key(self, tag: str, algorithm: Algorithm) -> str:
        """The user tier's key for a caller."""
        return f"{self.prefix}:{{{tag}}}:u:{algorithm.code}"

    def block_key(self, tag: str) -> str:
        """Where a caller's block lives: in its own hash slot, next to its buckets."""
        return f"{self.prefix}:{{{tag}}}:b"

    def capacity_key(self) -> str:
        """The fleet's one set of requests in flight (``QUOTA_CAPACITY``): a hash tag of
        its own, so a Cluster keeps it in one slot."""
        return f"{self.prefix}:{{fleet}}:cap"

    def block_match(self) -> str:
        """A glob matching every block key (for listing blocks)."""
        return f"{self.prefix}:{{*}}:b"

    def denials_key(self, tag: str, algorithm: Algorithm) -> str:
        """The bucket counting a caller's denials towards a block (``QUOTA_BLOCK_AFTER``)."""
        return f"{self.prefix}:{{{tag}}}:d:{algorithm.code}"

    def lease_key(self, tag: str, resource: str | None = None) -> str:
        """The set of a caller's leases: its plan's (every endpoint), or one resource's
        (a limit's ``concurrent=``, every method). In the caller's hash slot."""
        if resource is None:
            return f"{self.prefix}:{{{tag}}}:c"
        return f"{self.prefix}:{{{tag}}}:c:{escape(resource)}"

    def credits_key(self, tag: str, resource: str) -> str:
        """A caller's prepaid balance of ``resource`` (every method): in its hash slot."""
        return f"{self.prefix}:{{{tag}}}:cr:{escape(resource)}"

    def endpoint_key(self, tag: str, method: str, resource: str, algorithm: Algorithm) -> str:
        """The endpoint tier's key: caller, method and resource."""
        return f"{self.prefix}:{{{tag}}}:e:{_route_part(method, resource)}:{algorithm.code}"


@lru_cache(maxsize=1024)
def _route_part(method: str, resource: str) -> str:
    """``METHOD:resource`` escaped: a route's methods and resource are a small fixed set."""
    return f"{escape(method)}:{escape(resource)}"


# Identities repeat from request to request: their tags are cached, short ones only, so
# hostile long ids cannot make the cache large (8,192 x 64 characters at most).
_CACHED_ID = 64


@lru_cache(maxsize=8192)
def _identity_tag(identity_id: str) -> str:
    return IDENTITY + escape(identity_id)


@lru_cache(maxsize=8192)
def remote_ip_tag(remote_addr: str | None) -> str:
    """``KeyBuilder.ip_tag(client_ip(remote_addr))``: the global tier's tag for a
    ``request.remote_addr``, cached because parsing an address is costly."""
    return KeyBuilder.ip_tag(client_ip(remote_addr))
