"""Storage key layout: ``quota:{tag}:tier[:METHOD:resource]:algorithm``.

The ``{tag}`` is a Redis Cluster hash tag: every key of one identity lands in
one slot. Anything that came from a client is percent-encoded (``{``, ``}``,
``:`` and ``%`` included), so no input can collide with another key or choose
a slot; over-long parts are replaced by a digest.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

from .algorithms import Algorithm

__all__ = ["KeyBuilder", "escape"]

_MAX_PART = 128


def escape(part: str) -> str:
    encoded = quote(part, safe="._-~@=+")
    if len(encoded) <= _MAX_PART:
        return encoded
    return "sha256=" + hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()


class KeyBuilder:
    def __init__(self, prefix: str = "quota") -> None:
        self.prefix = prefix

    @staticmethod
    def ip_tag(ip: str) -> str:
        return "ip=" + escape(ip)

    @staticmethod
    def identity_tag(identity_id: str) -> str:
        # Distinct prefixes keep an identity named "ip=1.2.3.4" off that IP's budget.
        return "id=" + escape(identity_id)

    def global_key(self, ip_tag: str, algorithm: Algorithm) -> str:
        return f"{self.prefix}:{{{ip_tag}}}:g:{algorithm.code}"

    def user_key(self, tag: str, algorithm: Algorithm) -> str:
        return f"{self.prefix}:{{{tag}}}:u:{algorithm.code}"

    def endpoint_key(self, tag: str, method: str, resource: str, algorithm: Algorithm) -> str:
        return f"{self.prefix}:{{{tag}}}:e:{escape(method)}:{escape(resource)}:{algorithm.code}"
