"""The anti-spoofing filter on every NIC of a machine (libvirt's nwfilter), as element trees. Pure.

A NIC whose addresses the provider knows before the guest boots (static, or from an IP pool) references libvirt's own
`clean-traffic` filter (frames only from the NIC's MAC; IPv4 and ARP only from its addresses, given as `IP`
parameters; no other layer-2 traffic, so no IPv6 either) from its first frame.

A NIC on a libvirt network whose address comes from DHCP starts with this project's before-lease filter: frames only
from its MAC, and of IPv4 and ARP only a DHCP client's (UDP from 0.0.0.0, ARP probes from 0.0.0.0) go out, so the
guest can ask for its lease and send as nobody. It is pinned to clean-traffic with its address once the host's
libvirt network has leased one to its MAC (reconcile: pin_leased_addresses, within seconds: the pass that publishes
the address): the address comes from the host's DHCP server, never from the guest. libvirt's own DHCP snooping (CTRL_IP_LEARNING=dhcp) would learn it from the first frame, but on
libvirt 9.0 a libvirtd restart with such guests running deadlocks its nwfilter driver (seen in tests/e2e/test_chaos.py:
daemon-init and the snooping threads wait on each other's locks), so no learning is used. On a bridge, where the
LAN's DHCP server is not the host's, nothing tells the host the address: such a NIC keeps a MAC-only filter (frames
and ARP only from its MAC; any IPv4 source), so on shared bridges static addresses or an IP pool, pinned from the
start, are the safe choice.

A NIC with `allowedAddresses` (a virtual IP it may take over, which the host's admin granted its namespace) references
this project's root filter instead, `clean-traffic` plus two filters that let the `ALLOWED_IP` addresses pass the
same chains (`ipv4-ip`, `arp-ip`) before their final drop. The provider defines its filters on each host through
libvirt's nwfilter API (hypervisor.traffic_filters); the names carry a version, so a changed filter is a new one and
running guests keep theirs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import uuid
import xml.etree.ElementTree as ET

CLEAN_TRAFFIC = "clean-traffic"  # libvirt's own (Debian, Ubuntu: libvirt-daemon-config-nwfilter)
WITH_ALLOWED = "capi-libvirt-clean-traffic-v1"
MAC_ONLY = "capi-libvirt-mac-only-v1"
BEFORE_LEASE = "capi-libvirt-before-lease-v1"
DHCP_CLIENT_IPV4 = "capi-libvirt-dhcp-client-ipv4-v1"
DHCP_CLIENT_ARP = "capi-libvirt-dhcp-client-arp-v1"
FILTER_UUIDS = uuid.UUID("2f6c1c2e-4c3a-5b8e-9d41-7a0c3e5f9b10")  # the namespace of our filters' fixed UUIDs
ALLOWED_IPV4 = "capi-libvirt-allowed-ipv4-v1"
ALLOWED_ARP = "capi-libvirt-allowed-arp-v1"
ALLOWED_PARAMETER = "ALLOWED_IP"


@dataclasses.dataclass(frozen=True)
class TrafficFilter:
    """What one NIC may send from: `addresses` (its own: known up front, or leased to it by the host's network; none
    yet: only its MAC is held to) and `allowed` (taken over at times: a virtual IP)."""

    addresses: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    awaiting_lease: bool = False  # no address yet, and the host's network will lease one (else: held to its MAC)

    def __post_init__(self) -> None:
        for address in (*self.addresses, *self.allowed):
            if ipaddress.ip_address(address).version != 4:
                raise ValueError(f"traffic filter address {address!r}: IPv4 only (clean-traffic drops IPv6)")

    @property
    def name(self) -> str:
        if not self.addresses:
            return BEFORE_LEASE if self.awaiting_lease else MAC_ONLY
        return WITH_ALLOWED if self.allowed else CLEAN_TRAFFIC

    @property
    def pinned(self) -> bool:
        """Held to its addresses (not only to its MAC)."""
        return bool(self.addresses)


def ipv4_only(addresses: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The IPv4 addresses among `addresses` (plain or CIDR), as plain addresses."""
    found = (ipaddress.ip_interface(address).ip for address in addresses)
    return tuple(str(ip) for ip in found if ip.version == 4)


def filterref_element(traffic: TrafficFilter) -> ET.Element:
    """<filterref> of a NIC, with its parameters."""
    element = ET.Element("filterref", filter=traffic.name)
    parameters = [("IP", address) for address in traffic.addresses]
    if traffic.addresses:
        parameters += [(ALLOWED_PARAMETER, address) for address in traffic.allowed]
    for name, value in parameters:
        ET.SubElement(element, "parameter", name=name, value=value)
    return element


def parse_filterref(interface: ET.Element) -> TrafficFilter | None:
    """The TrafficFilter an <interface> element carries (None: no filter, or one that is not this project's kind)."""
    ref = interface.find("filterref")
    if ref is None or ref.get("filter") not in (CLEAN_TRAFFIC, WITH_ALLOWED, MAC_ONLY, BEFORE_LEASE):
        return None
    values = [(p.get("name"), p.get("value") or "") for p in ref.findall("parameter")]
    return TrafficFilter(addresses=tuple(v for n, v in values if n == "IP"),
                         allowed=tuple(v for n, v in values if n == ALLOWED_PARAMETER),
                         awaiting_lease=ref.get("filter") == BEFORE_LEASE)


def project_filters() -> dict[str, str]:
    """This project's filters by name, as libvirt's nwfilterDefineXML takes them (the root ones last)."""
    ipv4 = ET.Element("filter", name=ALLOWED_IPV4, chain="ipv4-ip", priority="-710")  # no-ip-spoofing's chain
    rule = ET.SubElement(ipv4, "rule", action="return", direction="out", priority="400")  # before its drop (1000)
    ET.SubElement(rule, "ip", srcipaddr=f"${ALLOWED_PARAMETER}")
    arp = ET.Element("filter", name=ALLOWED_ARP, chain="arp-ip", priority="-510")  # no-arp-ip-spoofing's chain
    rule = ET.SubElement(arp, "rule", action="return", direction="out", priority="300")
    ET.SubElement(rule, "arp", match="yes", arpsrcipaddr=f"${ALLOWED_PARAMETER}")
    root = ET.Element("filter", name=WITH_ALLOWED, chain="root")
    for referenced in (ALLOWED_IPV4, ALLOWED_ARP, CLEAN_TRAFFIC):
        ET.SubElement(root, "filterref", filter=referenced)
    mac_only = _held_to_mac(MAC_ONLY, ())
    dhcp_ipv4 = ET.Element("filter", name=DHCP_CLIENT_IPV4, chain="ipv4-ip", priority="-710")
    rule = ET.SubElement(dhcp_ipv4, "rule", action="return", direction="out", priority="100")
    ET.SubElement(rule, "ip", srcipaddr="0.0.0.0", protocol="udp", srcportstart="68", dstportstart="67")
    ET.SubElement(dhcp_ipv4, "rule", action="drop", direction="out", priority="1000")
    dhcp_arp = ET.Element("filter", name=DHCP_CLIENT_ARP, chain="arp-ip", priority="-510")
    rule = ET.SubElement(dhcp_arp, "rule", action="return", direction="out", priority="400")
    ET.SubElement(rule, "arp", match="yes", arpsrcipaddr="0.0.0.0")  # an address conflict probe (RFC 5227)
    ET.SubElement(dhcp_arp, "rule", action="drop", direction="out", priority="1000")
    before_lease = _held_to_mac(BEFORE_LEASE, (DHCP_CLIENT_IPV4, DHCP_CLIENT_ARP))
    filters = (ipv4, arp, root, dhcp_ipv4, dhcp_arp, mac_only, before_lease)
    for element in filters:  # a fixed UUID: defining one twice at once (two creations) is one filter, not an error
        fixed = ET.Element("uuid")
        fixed.text = str(uuid.uuid5(FILTER_UUIDS, element.get("name", "")))
        element.insert(0, fixed)
    return {element.get("name", ""): ET.tostring(element, encoding="unicode") for element in filters}


def _held_to_mac(name: str, more: tuple[str, ...]) -> ET.Element:
    """A root filter of clean-traffic's parts that need no address (frames and ARP only from the NIC's MAC, IPv4 and
    ARP passed, no other layer 2), with `more` filters in their chains."""
    element = ET.Element("filter", name=name, chain="root")
    for referenced in ("no-mac-spoofing", "no-arp-mac-spoofing", *more):
        ET.SubElement(element, "filterref", filter=referenced)
    for protocol in ("ipv4", "arp"):
        rule = ET.SubElement(element, "rule", action="accept", direction="inout", priority="-500")
        ET.SubElement(rule, "mac", protocolid=protocol)
    ET.SubElement(element, "filterref", filter="no-other-l2-traffic")
    ET.SubElement(element, "filterref", filter="qemu-announce-self")
    return element
