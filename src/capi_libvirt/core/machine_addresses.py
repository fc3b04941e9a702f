"""A machine's InternalIP addresses as status.addresses publishes them, and the AddressesDiscovered condition.

Two kinds of address meet here. Addresses known before the guest boots (an interface's `static`, or what an IP pool
allocated it: the reconcile's `addressing`) are published as soon as the domain runs, first, in interface order. What
discovery finds (libvirt's DHCP leases, the guest agent, the host's ARP table; hypervisor.machines asks them in that
order and takes the first that answers) follows, without repeating a known address. When discovery finds nothing (a
lease expired, the agent stopped, the ARP entry aged out), the addresses it found last are kept: the previously
published ones that are not known up front. Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence

from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core.conditions import Status

# Discovery's sources, as hypervisor.machines names them (libvirt's VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_*), in the order
# they are asked.
LEASE, AGENT, ARP = "lease", "agent", "arp"
SOURCES = (LEASE, AGENT, ARP)
SOURCE_TEXT = {LEASE: "libvirt's DHCP leases", AGENT: "the guest agent", ARP: "the host's ARP table"}
# The condition's reasons: where the addresses came from, or that nothing answered.
SOURCE_REASON = {LEASE: reasons.DHCP_LEASE, AGENT: reasons.GUEST_AGENT, ARP: reasons.ARP_TABLE}
def known_addresses(addressing: Mapping[int, v1alpha1.StaticAddressing]) -> list[str]:
    """The addresses of each interface's addressing (interface index -> its addresses), in interface order, without
    their prefix length (192.0.2.10/24 -> 192.0.2.10), each once."""
    return _unique(str(ipaddress.ip_interface(cidr).ip)
                   for index in sorted(addressing) for cidr in addressing[index].addresses)


def internal_addresses(known: Sequence[str], discovered: Sequence[str], previous: Sequence[str]) -> list[str]:
    """What status.addresses lists as InternalIP: the known addresses, then the discovered ones not among them; when
    discovery found nothing, the previously published addresses that are not known (the last discovered) instead."""
    found = list(discovered) or [address for address in previous if address not in known]
    return _unique([*known, *found])


def kept_addresses(known: Sequence[str], discovered: Sequence[str], previous: Sequence[str]) -> list[str]:
    """The last discovered addresses published again although discovery found nothing this time."""
    if discovered:
        return []
    return [address for address in _unique(previous) if address not in known]


def discovery_condition(asked: Sequence[str], source: str | None, discovered: Sequence[str], known: Sequence[str],
                        kept: Sequence[str]) -> tuple[Status, str, str]:
    """(status, reason, message) of the AddressesDiscovered condition after one look: True with the source as the
    reason when one answered; else False, naming the sources asked and what is published instead."""
    if source is not None and discovered:
        return "True", SOURCE_REASON[source], f"{', '.join(discovered)} from {SOURCE_TEXT[source]}"
    if asked:
        message = "nothing from " + " or ".join(SOURCE_TEXT[name] for name in asked)
    else:
        message = "no source can answer (no interface on a libvirt network or a bridge, no guest agent connected)"
    if kept:
        message += f"; keeping the last discovered {', '.join(kept)}"
    if known:
        message += f"; publishing the addresses known up front: {', '.join(known)}"
    return "False", reasons.NOTHING_DISCOVERED, message


def _unique(addresses: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for address in addresses:
        if address not in seen:
            seen.append(address)
    return seen
