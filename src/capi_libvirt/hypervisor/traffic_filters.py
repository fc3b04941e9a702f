"""The anti-spoofing filters on a host (libvirt's nwfilter): libvirt's own `clean-traffic` must be there, and this
project's (core.traffic_filter) are defined when missing. Run by LibvirtHost (hypervisor.host) before a domain is
defined. A filter of ours that exists is left as it is: its name carries its version.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import libvirt

from capi_libvirt.core import traffic_filter
from capi_libvirt.hypervisor import errors


class TrafficFilterMissing(errors.HypervisorError):
    """The host has no `clean-traffic` filter (libvirt's nwfilter definitions are not installed)."""


def ensure_filters(conn: libvirt.virConnect) -> None:
    """`clean-traffic` exists (else TrafficFilterMissing), and this project's filters (defined here when missing)."""
    if not _exists(conn, traffic_filter.CLEAN_TRAFFIC):
        raise TrafficFilterMissing("the host has no libvirt traffic filter clean-traffic, which every machine's NIC "
                                   "carries (Debian and Ubuntu: apt install libvirt-daemon-config-nwfilter)")
    for name, xml in traffic_filter.project_filters().items():
        if not _exists(conn, name):
            conn.nwfilterDefineXML(xml)


def pin_leased_addresses(conn: libvirt.virConnect, uuid: str,
                         allowed: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """Each NIC of the domain on a libvirt network still before its lease, whose network has leased its MAC an
    IPv4 address: its filter becomes clean-traffic with that address (and `allowed`, by MAC), on the running domain
    (a filter change, no restart) and in its definition. Returns (MAC, address) of each NIC pinned."""
    domain = conn.lookupByUUIDString(uuid)  # VIR_ERR_NO_DOMAIN -> DomainNotFound
    pinned = []
    for live in ET.fromstring(domain.XMLDesc(0)).findall("devices/interface[@type='network']"):
        current = traffic_filter.parse_filterref(live)
        mac = _mac_of(live)
        network = next((source.get("network") for source in live.findall("source")), None)
        if current is None or not current.awaiting_lease or not mac or not network:
            continue
        leases = sorted((lease for lease in conn.networkLookupByName(network).DHCPLeases(mac)
                         if lease.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and lease.get("ipaddr")),
                        key=lambda lease: lease.get("expirytime") or 0)
        if not leases:
            continue
        leased = [str(leases[-1]["ipaddr"])]  # the newest (a guest that booted twice may hold an older one)
        wanted = traffic_filter.TrafficFilter(addresses=(leased[0],), allowed=allowed.get(mac, ()))
        inactive = ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        for element, flags in ((live, libvirt.VIR_DOMAIN_AFFECT_LIVE),
                               (_interface_by_mac(inactive, mac), libvirt.VIR_DOMAIN_AFFECT_CONFIG)):
            if element is None:
                continue
            for old in element.findall("filterref"):
                element.remove(old)
            element.append(traffic_filter.filterref_element(wanted))
            domain.updateDeviceFlags(ET.tostring(element, encoding="unicode"), flags)
        pinned.append((mac, leased[0]))
    return pinned


def _mac_of(interface: ET.Element) -> str:
    return next(((element.get("address") or "").lower() for element in interface.findall("mac")), "")


def _interface_by_mac(root: ET.Element, mac: str) -> ET.Element | None:
    return next((nic for nic in root.findall("devices/interface") if _mac_of(nic) == mac), None)


def _exists(conn: libvirt.virConnect, name: str) -> bool:
    try:
        conn.nwfilterLookupByName(name)
    except libvirt.libvirtError as error:
        if errors.is_missing_nwfilter(error):
            return False
        raise
    return True
