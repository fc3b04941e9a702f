"""Addresses and MACs that belong to someone else, refused before anything is made on the host. Pure: a machine's
interfaces, what its host says of the networks they join, and the other machines placed on the host in; the first
conflict (or None) out.

An interface on a libvirt network may not take the network's own address (its gateway, DHCP and DNS server), an
address outside the network's subnets (when the network has any), or an address a DHCP lease of another MAC holds.
On a network or a bridge, it may not take an address or a MAC another machine on the same host and segment holds:
one it published (status.addresses), one it asked for first (an earlier machine's spec), one it may take over as a
virtual address (allowedAddresses, shared by the machines that list it), or, for a MAC, one any other domain on the
host uses there. An interface's own allowedAddresses meet the network's rules only. On a bridge the host knows no subnet: only the holders are checked.

A conflict with the network itself cannot pass (the spec is immutable: refused, not retried); one with a holder may
(the holder may go), so it is looked at again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Segment = tuple[str, str]  # ("network", name) or ("bridge", name)


def segment_text(segment: Segment) -> str:
    return f"{segment[0]} {segment[1]}"


@dataclasses.dataclass(frozen=True)
class SegmentFacts:
    """What the host says of one network or bridge."""

    own: tuple[str, ...] = ()  # the network's own addresses with their prefixes (192.168.122.1/24): gateway, DHCP, DNS
    macs: frozenset[str] = frozenset()  # MACs (lowercase) other domains on the host use there
    leases: Mapping[str, str] = dataclasses.field(default_factory=dict)  # leased address -> MAC (lowercase)


@dataclasses.dataclass(frozen=True)
class Nic:
    """One interface of the machine being made."""

    index: int
    segment: Segment
    mac: str  # lowercase
    addresses: tuple[str, ...] = ()  # CIDR: static, or from its IP pools
    allowed: tuple[str, ...] = ()  # its allowedAddresses (a virtual IP it may take over): the network's rules only


@dataclasses.dataclass(frozen=True)
class Holder:
    """Another machine on the same host: what it asks for and what it published, by segment."""

    earlier: bool  # created before the machine being made, or its domain may exist: what it asks for is its own
    segments: frozenset[Segment]
    asked: frozenset[tuple[Segment, str]] = frozenset()  # (segment, address) of its spec's static addressing
    macs: frozenset[tuple[Segment, str]] = frozenset()  # (segment, MAC) of its spec's fixed MACs
    published: frozenset[str] = frozenset()  # the addresses in its status (on whichever of its segments)
    allowed: frozenset[tuple[Segment, str]] = frozenset()  # its allowedAddresses: shared, never another's own


@dataclasses.dataclass(frozen=True)
class Conflict:
    message: str
    may_pass: bool  # a holder may go; the network's own rules never change under an immutable spec


def first_conflict(nics: Sequence[Nic], facts: Mapping[Segment, SegmentFacts],
                   holders: Iterable[Holder]) -> Conflict | None:
    holders = list(holders)
    for nic in nics:
        where = f"interfaces[{nic.index}] ({segment_text(nic.segment)})"
        known = facts.get(nic.segment, SegmentFacts())
        if nic.mac in known.macs:
            return Conflict(f"{where}: MAC {nic.mac} is already used there by another VM on the host", True)
        if any((nic.segment, nic.mac) in h.macs and h.earlier for h in holders):
            return Conflict(f"{where}: MAC {nic.mac} is already another machine's there", True)
        for cidr in nic.addresses:
            found = _address_conflict(where, ipaddress.ip_interface(cidr), nic, known, holders)
            if found is not None:
                return found
        for address in nic.allowed:
            found = _network_conflict(f"{where} allowedAddresses", ipaddress.ip_address(address), known) or \
                _held_conflict(f"{where} allowedAddresses", str(ipaddress.ip_address(address)), nic, known, holders)
            if found is not None:
                return found
    return None


def _held_conflict(where: str, ip: str, nic: Nic, known: SegmentFacts, holders: list[Holder]) -> Conflict | None:
    """`ip` is leased to another MAC, or another machine's own there (published, or asked for first). Another
    machine's allowed address is no conflict for an allowed address: control-plane machines share their VIP."""
    leased_to = known.leases.get(ip)
    if leased_to is not None and leased_to != nic.mac:
        return Conflict(f"{where}: address {ip} is leased by the network's DHCP server to another MAC", True)
    for holder in holders:
        if nic.segment in holder.segments and \
                (ip in holder.published or (holder.earlier and (nic.segment, ip) in holder.asked)):
            return Conflict(f"{where}: address {ip} is already another machine's there", True)
    return None


def _network_conflict(where: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
                      known: SegmentFacts) -> Conflict | None:
    """The network's own rules: not its own address, inside its subnets, not their network or broadcast address."""
    own = [ipaddress.ip_interface(cidr) for cidr in known.own]
    same_family = [o for o in own if o.version == ip.version]
    if any(o.ip == ip for o in own):
        return Conflict(f"{where}: address {ip} is the network's own (its gateway, DHCP and DNS server)", False)
    if same_family and not any(ip in o.network for o in same_family):
        subnets = ", ".join(str(o.network) for o in same_family)
        return Conflict(f"{where}: address {ip} is outside the network's subnet ({subnets})", False)
    if any(ip == o.network.network_address or (o.version == 4 and ip == o.network.broadcast_address)
           for o in same_family):
        return Conflict(f"{where}: address {ip} is the subnet's network or broadcast address", False)
    return None


def _address_conflict(where: str, address: ipaddress.IPv4Interface | ipaddress.IPv6Interface, nic: Nic,
                      known: SegmentFacts, holders: list[Holder]) -> Conflict | None:
    ip = str(address.ip)  # compared as ipaddress writes it (the holders' addresses too)
    found = _network_conflict(where, address.ip, known)
    if found is not None:
        return found
    held = _held_conflict(where, ip, nic, known, holders)
    if held is not None:
        return held
    for holder in holders:
        if nic.segment in holder.segments and (nic.segment, ip) in holder.allowed:
            return Conflict(f"{where}: address {ip} is a virtual address other machines may hold there", True)
    return None


def segment_of(interface: Mapping[str, Any]) -> Segment:
    """An interface's segment, from its spec (as the API holds it, or a model dump by alias)."""
    return ("network", str(interface["network"])) if interface.get("network") else ("bridge", str(interface.get("bridge")))


def holder(spec: Mapping[str, Any], status: Mapping[str, Any], earlier: bool) -> Holder:
    """Another machine as a Holder, from its spec and status as the API holds them."""
    interfaces = [i for i in spec.get("interfaces") or [] if isinstance(i, Mapping)]
    asked, macs, allowed = set(), set(), set()
    for interface in interfaces:
        segment = segment_of(interface)
        for address in interface.get("allowedAddresses") or []:
            with contextlib.suppress(ValueError):
                allowed.add((segment, str(ipaddress.ip_address(address))))
        static = interface.get("static") or {}
        for cidr in static.get("addresses") or []:
            with contextlib.suppress(ValueError):  # (admission refuses one; never let one block the others)
                asked.add((segment, str(ipaddress.ip_interface(cidr).ip)))
        if interface.get("macAddress"):
            macs.add((segment, str(interface["macAddress"]).lower()))
    published = set()
    for entry in status.get("addresses") or []:
        if isinstance(entry, Mapping) and entry.get("type") in ("InternalIP", "ExternalIP"):
            with contextlib.suppress(ValueError):
                published.add(str(ipaddress.ip_address(str(entry.get("address")))))
    return Holder(earlier=earlier, segments=frozenset(segment_of(i) for i in interfaces), asked=frozenset(asked),
                  macs=frozenset(macs), published=frozenset(published), allowed=frozenset(allowed))
