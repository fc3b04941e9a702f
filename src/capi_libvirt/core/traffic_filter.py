"""The anti-spoofing filter on every NIC of a machine (libvirt's nwfilter), as element trees. Pure.

Every interface references libvirt's own `clean-traffic` filter (frames only from the NIC's MAC; IPv4 and ARP only
from the NIC's addresses; no other layer-2 traffic, so no IPv6 either), with the addresses the provider knows before
the guest boots (static, or from an IP pool) as its `IP` parameters. An interface whose address comes from DHCP has
none: libvirt learns it by snooping the DHCP exchange (`CTRL_IP_LEARNING=dhcp`), trusting only the network's own
DHCP server when the host names one (`DHCPSERVER`).

An interface with `allowedAddresses` (a virtual IP it may take over, which the host's admin granted its namespace)
references this project's root filter instead, `clean-traffic` plus two filters that let the `ALLOWED_IP` addresses
pass the same chains (`ipv4-ip`, `arp-ip`) before their final drop. The provider defines these on each host through
libvirt's nwfilter API (hypervisor.traffic_filters); the names carry a version, so a changed filter is a new one and
running guests keep theirs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import xml.etree.ElementTree as ET

CLEAN_TRAFFIC = "clean-traffic"  # libvirt's own (Debian, Ubuntu: libvirt-daemon-config-nwfilter)
WITH_ALLOWED = "capi-libvirt-clean-traffic-v1"
ALLOWED_IPV4 = "capi-libvirt-allowed-ipv4-v1"
ALLOWED_ARP = "capi-libvirt-allowed-arp-v1"
ALLOWED_PARAMETER = "ALLOWED_IP"


@dataclasses.dataclass(frozen=True)
class TrafficFilter:
    """What one NIC may send from: `addresses` (its own, known up front; none: learned from DHCP, from
    `dhcp_server` when known) and `allowed` (taken over at times: a virtual IP)."""

    addresses: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    dhcp_server: str | None = None

    def __post_init__(self) -> None:
        for address in (*self.addresses, *self.allowed, *([self.dhcp_server] if self.dhcp_server else [])):
            if ipaddress.ip_address(address).version != 4:
                raise ValueError(f"traffic filter address {address!r}: IPv4 only (clean-traffic drops IPv6)")

    @property
    def name(self) -> str:
        return WITH_ALLOWED if self.allowed else CLEAN_TRAFFIC


def ipv4_only(addresses: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The IPv4 addresses among `addresses` (plain or CIDR), as plain addresses."""
    found = (ipaddress.ip_interface(address).ip for address in addresses)
    return tuple(str(ip) for ip in found if ip.version == 4)


def filterref_element(traffic: TrafficFilter) -> ET.Element:
    """<filterref> of a NIC, with its parameters."""
    element = ET.Element("filterref", filter=traffic.name)
    parameters = [("IP", address) for address in traffic.addresses]
    if not traffic.addresses:
        parameters.append(("CTRL_IP_LEARNING", "dhcp"))
        if traffic.dhcp_server:
            parameters.append(("DHCPSERVER", traffic.dhcp_server))
    parameters += [(ALLOWED_PARAMETER, address) for address in traffic.allowed]
    for name, value in parameters:
        ET.SubElement(element, "parameter", name=name, value=value)
    return element


def project_filters() -> dict[str, str]:
    """This project's filters by name, as libvirt's nwfilterDefineXML takes them (the root one last)."""
    ipv4 = ET.Element("filter", name=ALLOWED_IPV4, chain="ipv4-ip", priority="-710")  # no-ip-spoofing's chain
    rule = ET.SubElement(ipv4, "rule", action="return", direction="out", priority="400")  # before its drop (1000)
    ET.SubElement(rule, "ip", srcipaddr=f"${ALLOWED_PARAMETER}")
    arp = ET.Element("filter", name=ALLOWED_ARP, chain="arp-ip", priority="-510")  # no-arp-ip-spoofing's chain
    rule = ET.SubElement(arp, "rule", action="return", direction="out", priority="300")
    ET.SubElement(rule, "arp", match="yes", arpsrcipaddr=f"${ALLOWED_PARAMETER}")
    root = ET.Element("filter", name=WITH_ALLOWED, chain="root")
    for referenced in (ALLOWED_IPV4, ALLOWED_ARP, CLEAN_TRAFFIC):
        ET.SubElement(root, "filterref", filter=referenced)
    return {element.get("name", ""): ET.tostring(element, encoding="unicode") for element in (ipv4, arp, root)}
