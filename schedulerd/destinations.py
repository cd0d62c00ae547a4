"""Where an http target may point: the rule that keeps the HTTP executor from being
a request-forgery tool (a job whose URL is the cloud metadata service, or a
loopback service of the worker's host).

The node applies it to a target's literal host at create and update; the executor
applies it again to every address a name resolves to, just before it connects.
A destination is refused when it matches a deny entry and no allow entry: an
allow entry is how an operator opens one range on purpose (`--target-allow
127.0.0.0/8` for a local test), a deny entry how they close another
(`--target-deny 10.0.0.0/8`). Entries are CIDRs, host names, or `.domain` for
every name under it."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from functools import cached_property

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Addresses no scheduled call should reach by default, each with why.
DEFAULT_DENY_WHY: dict[str, str] = {
    "0.0.0.0/8": "unspecified: reaches this host",
    "127.0.0.0/8": "loopback",
    "169.254.0.0/16": "link-local, where cloud metadata services answer",
    "100.100.100.200/32": "a cloud metadata service",
    "::/128": "unspecified: reaches this host",
    "::1/128": "loopback",
    "fe80::/10": "link-local",
    "fd00:ec2::254/128": "a cloud metadata service",
    "localhost": "loopback",
    ".localhost": "loopback",
    "metadata.google.internal": "a cloud metadata service",
}
DEFAULT_DENY = tuple(DEFAULT_DENY_WHY)


class DestinationRefused(Exception):
    """The target's destination is refused by the destination policy."""


def _entry(text: str) -> Network | str:
    entry = text.strip().lower().rstrip(".")
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        pass
    name = entry[1:] if entry.startswith(".") else entry
    if not name or not all(label and len(label) <= 63 and label.replace("-", "").replace("_", "").isalnum()
                           for label in name.split(".")):
        raise ValueError(f"target policy entry {text!r} must be a CIDR (10.0.0.0/8, fd00::/8), an address, "
                         "a host name, or .domain (every name under it)")
    return entry


def address_of(host: str) -> Address | None:
    """The address a URL's host names literally, in any form a resolver would take as one
    (2130706433 and 0x7f.1 are 127.0.0.1); an IPv4-mapped IPv6 address as its IPv4."""
    text = host.strip("[]").lower()
    try:
        address: Address = ipaddress.ip_address(text)
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _name_matches(name: str, entry: str) -> bool:
    return name == entry or (entry.startswith(".") and (name.endswith(entry) or name == entry[1:]))


@dataclass(frozen=True)
class DestinationPolicy:
    # Refused destinations (the defaults plus --target-deny).
    deny: tuple[str, ...] = DEFAULT_DENY
    # Destinations let through although a deny entry matches (--target-allow).
    allow: tuple[str, ...] = ()

    @classmethod
    def build(cls, allow: tuple[str, ...] = (), deny: tuple[str, ...] = ()) -> "DestinationPolicy":
        """The defaults widened by allow and narrowed by deny; raises ValueError naming a bad entry."""
        policy = cls(DEFAULT_DENY + tuple(deny), tuple(allow))
        policy.validate()
        return policy

    def validate(self) -> None:
        for entry in (*self.deny, *self.allow):
            _entry(entry)

    @cached_property
    def _deny(self) -> tuple[tuple[str, Network | str], ...]:
        return tuple((text, _entry(text)) for text in self.deny)

    @cached_property
    def _allow(self) -> tuple[Network | str, ...]:
        return tuple(_entry(text) for text in self.allow)

    def _match(self, entries: tuple[Network | str, ...], host: str, address: Address | None) -> bool:
        for entry in entries:
            if isinstance(entry, str):
                if address is None and _name_matches(host, entry):
                    return True
            elif address is not None and address.version == entry.version and address in entry:
                return True
        return False

    def refusal(self, host: str) -> str | None:
        """Why a URL's host (a name or a literal address) is refused, naming the rule; None if allowed.
        A name is judged by itself here; the executor judges the addresses it resolves to."""
        name = host.strip("[]").lower().rstrip(".")
        address = address_of(name)
        if self._match(self._allow, name, address):
            return None
        for text, entry in self._deny:
            if self._match((entry,), name, address):
                why = DEFAULT_DENY_WHY.get(text, "listed with --target-deny")
                shown = name if address is None or str(address) == name else f"{name} ({address})"
                return f"{shown} is in the refused destination {text} ({why})"
        return None
