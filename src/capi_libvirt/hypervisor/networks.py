"""What a host says of the networks and bridges a new machine joins: that each libvirt network exists and runs, its
own addresses (gateway, DHCP and DNS server) and subnets, its DHCP leases, and the MACs other domains use there
(core.address_conflicts decides from these). Run by LibvirtHost (hypervisor.host) like hypervisor.machines.
"""

from __future__ import annotations

import ipaddress
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import libvirt

from capi_libvirt.core.address_conflicts import Segment, SegmentFacts
from capi_libvirt.hypervisor import errors


def segment_facts(conn: libvirt.virConnect, segments: Sequence[Segment], own_uuid: str) -> dict[Segment, SegmentFacts]:
    """The facts of each segment; NetworkNotFound for a libvirt network that is missing or not active. The domain
    `own_uuid` (the machine's own, when an earlier pass defined it) is not another domain."""
    own: dict[Segment, tuple[str, ...]] = {}
    leases: dict[Segment, dict[str, str]] = {}
    for segment in segments:
        kind, name = segment
        if kind != "network" or segment in own:
            continue
        network = conn.networkLookupByName(name)  # VIR_ERR_NO_NETWORK -> NetworkNotFound
        if not network.isActive():
            raise errors.NetworkNotFound(f"network {name} is not active")
        own[segment] = network_addresses(network.XMLDesc(0))
        leases[segment] = {str(lease["ipaddr"]): str(lease["mac"]).lower() for lease in network.DHCPLeases()
                           if lease.get("ipaddr") and lease.get("mac")}
    macs = macs_in_use(conn, set(segments), own_uuid)
    return {segment: SegmentFacts(own=own.get(segment, ()), macs=frozenset(macs.get(segment, ())),
                                  leases=leases.get(segment, {}))
            for segment in segments}


def network_addresses(xml_text: str) -> tuple[str, ...]:
    """A network's own addresses with their prefixes (`<ip address= netmask=|prefix=>`), as CIDR interfaces."""
    found = []
    for ip in ET.fromstring(xml_text).findall("ip"):
        address = ip.get("address")
        if not address:
            continue
        mask = ip.get("prefix") or ip.get("netmask") or ("64" if ":" in address else "24")
        found.append(str(ipaddress.ip_interface(f"{address}/{mask}")))
    return tuple(found)


def macs_in_use(conn: libvirt.virConnect, segments: set[Segment], own_uuid: str) -> dict[Segment, set[str]]:
    """The MACs (lowercase) every other domain of the host, running or not, has on each of `segments`."""
    found: dict[Segment, set[str]] = {}
    for domain in conn.listAllDomains():
        try:
            if domain.UUIDString() == own_uuid:
                continue
            root = ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        except libvirt.libvirtError as error:
            if errors.is_missing_domain(error):
                continue  # undefined between the listing and the look
            raise
        for interface in root.findall("devices/interface"):
            kind, source, mac = interface.get("type"), interface.find("source"), interface.find("mac")
            if kind not in ("network", "bridge") or source is None or mac is None:
                continue
            segment = (kind, source.get(kind) or "")
            if segment in segments and mac.get("address"):
                found.setdefault(segment, set()).add(str(mac.get("address")).lower())
    return found
