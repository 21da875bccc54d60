"""Operators' rules for whole networks (CIDR), matched in-process in time that does not
grow with the number of rules.

A rule denies a network (its requests get 403) or allows it (its requests skip the
per-IP ``global`` tier). ``NetworkRules`` is built once per snapshot of the quota tables
(``sql.snapshot``) and read by every request (``flask_quota.networks``): per address
family, one dict per prefix length present, mapping a network's leading bits to its
rules. A lookup shifts the address once per distinct prefix length, longest first: at
most 33 (IPv4) or 129 (IPv6) dict lookups, usually a handful, never a scan of rules.

Precedence: the longest prefix that has a live rule wins; at equal prefixes a deny wins.
A timed rule stops matching at its ``expires_at`` (checked against the clock at match
time, so it ends on time without a reload). An IPv4-mapped IPv6 address
(``::ffff:203.0.113.9``) is the IPv4 address it maps, and matches IPv4 rules; a rule
written as a mapped network (``::ffff:203.0.113.0/120``) is stored as the IPv4 one.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "ACTIONS",
    "ALLOW",
    "DENY",
    "Network",
    "NetworkRule",
    "NetworkRules",
    "address_value",
    "parse_network",
]

DENY, ALLOW = "deny", "allow"
ACTIONS = (DENY, ALLOW)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAX_TEXT = 100  # longer than any network's text, with room for a netmask form
_MAPPED = 0xFFFF  # the 96 leading bits of an IPv4-mapped IPv6 address, as a number
_EXAMPLES = "give one such as 203.0.113.0/24, 2001:db8::/32 or a single address"


def parse_network(text: str) -> Network:
    """The network ``text`` names, normalised (``ipaddress.ip_network(strict=False)``:
    host bits cleared, IPv6 compressed): ``10.1.2.3/8`` is ``10.0.0.0/8``, a bare
    address is its /32 or /128, an IPv4-mapped IPv6 network is its IPv4 network.
    Raises ``ValueError`` with a one-line reason for anything else."""
    raw = text.strip() if isinstance(text, str) else ""
    shown = repr(raw[:60] + ("..." if len(raw) > 60 else ""))
    if not raw or len(raw) > _MAX_TEXT or "%" in raw or not raw.isprintable():
        raise ValueError(f"{shown} is not an IPv4 or IPv6 network: {_EXAMPLES}")
    try:
        network: Network = ipaddress.ip_network(raw, strict=False)
    except ValueError:
        # ip_network says only "does not appear to be ..."; the family's own class says why.
        family = ipaddress.IPv6Network if ":" in raw else ipaddress.IPv4Network
        try:
            family(raw, strict=False)
            reason = "not a network"
        except ValueError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else "not a network"
        message = f"{shown} is not an IPv4 or IPv6 network ({reason}): {_EXAMPLES}"
        raise ValueError(message) from None
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        value = int(network.network_address)
        if value >> 32 == _MAPPED:
            return ipaddress.IPv4Network((value & 0xFFFFFFFF, network.prefixlen - 96))
    return network


_pton = socket.inet_pton
_V4, _V6 = socket.AF_INET, socket.AF_INET6


def address_value(remote_addr: str | None) -> tuple[int, int] | None:
    """(4 or 6, the address as a number) of a ``REMOTE_ADDR``; an IPv4-mapped IPv6
    address is its IPv4 address. The forms ``ipv4:port`` and ``[ipv6]:port`` some proxies
    write are their address (as ``core.identity.client_ip`` reads them); None for
    anything that is no address."""
    if not remote_addr:
        return None
    try:
        if ":" not in remote_addr:
            return 4, int.from_bytes(_pton(_V4, remote_addr), "big")
        value = int.from_bytes(_pton(_V6, remote_addr.partition("%")[0]), "big")
    except (OSError, ValueError, TypeError):
        return _with_port(remote_addr)
    if value >> 32 == _MAPPED:
        return 4, value & 0xFFFFFFFF
    return 6, value


def _with_port(text: str) -> tuple[int, int] | None:
    if not isinstance(text, str):
        return None
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]") and ":" in host:
        return address_value(host[1:-1])
    if host.count(".") == 3 and ":" not in host:
        return address_value(host)
    return None


@dataclass(frozen=True, slots=True)
class NetworkRule:
    """One operator's rule: ``action`` (``DENY`` or ``ALLOW``) for every address of
    ``network``, until ``expires_at`` (Unix seconds; None: until removed)."""

    network: Network
    action: str
    expires_at: float | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"a network rule's action is deny or allow, not {self.action!r}")

    @property
    def deny(self) -> bool:
        return self.action == DENY

    @property
    def cidr(self) -> str:
        """The network as stored and shown: ``203.0.113.0/24``, ``2001:db8::/32``."""
        return str(self.network)

    def live(self, now: float) -> bool:
        """True until the rule's expiry (Unix seconds ``now``)."""
        return self.expires_at is None or now < self.expires_at


# One table per prefix length present: (shift, {address >> shift: rules}), longest first.
_Table = tuple[int, dict[int, tuple[NetworkRule, ...]]]


def _precedence(rule: NetworkRule) -> tuple[bool, float]:
    """Order of the rules of one network: denials first, the longest-lasting first."""
    lasts = rule.expires_at if rule.expires_at is not None else float("inf")
    return (not rule.deny, -lasts)


class NetworkRules:
    """Rules for networks, matched by ``match`` in at most one dict lookup per distinct
    prefix length (see the module docstring). Immutable once built; ``clock`` (Unix
    seconds) decides which timed rules still hold."""

    __slots__ = ("_clock", "_v4", "_v6", "count")

    def __init__(
        self, rules: Iterable[NetworkRule], *, clock: Callable[[], float] = time.time
    ) -> None:
        by_length: dict[tuple[int, int], dict[int, list[NetworkRule]]] = {}
        count = 0
        for rule in rules:
            network = rule.network
            bits = network.max_prefixlen
            shift = bits - network.prefixlen
            table = by_length.setdefault((network.version, shift), {})
            table.setdefault(int(network.network_address) >> shift, []).append(rule)
            count += 1
        self.count = count
        self._clock = clock
        self._v4 = self._tables(by_length, 4)
        self._v6 = self._tables(by_length, 6)

    @staticmethod
    def _tables(
        by_length: dict[tuple[int, int], dict[int, list[NetworkRule]]], version: int
    ) -> tuple[_Table, ...]:
        shifts = sorted(shift for v, shift in by_length if v == version)  # longest prefix first
        return tuple(
            (
                shift,
                {
                    key: tuple(sorted(found, key=_precedence))
                    for key, found in by_length[(version, shift)].items()
                },
            )
            for shift in shifts
        )

    def __len__(self) -> int:
        return self.count

    @property
    def prefix_lengths(self) -> int:
        """How many distinct prefix lengths there are: the most lookups a match makes."""
        return len(self._v4) + len(self._v6)

    def match(self, remote_addr: str | None) -> NetworkRule | None:
        """The rule that decides for ``remote_addr`` (a ``REMOTE_ADDR``), or None: the
        live rule of the longest prefix holding the address, a denial before an allowance
        of the same network."""
        found = address_value(remote_addr)
        if found is None:
            return None
        return self.match_value(*found)

    def match_value(self, version: int, value: int) -> NetworkRule | None:
        """``match`` of an address given as (4 or 6, its number)."""
        now = None
        for shift, table in self._v4 if version == 4 else self._v6:
            rules = table.get(value >> shift)
            if rules is None:
                continue
            if now is None:
                now = self._clock()
            for rule in rules:
                expires = rule.expires_at
                if expires is None or now < expires:
                    return rule
        return None

    def seconds_left(self, rule: NetworkRule) -> int | None:
        """Whole seconds until ``rule`` ends (at least 1), or None for a rule without end."""
        if rule.expires_at is None:
            return None
        return max(1, math.ceil(rule.expires_at - self._clock()))
