"""The anti-spoofing filters on a host (libvirt's nwfilter): libvirt's own `clean-traffic` must be there, and this
project's (core.traffic_filter) are defined when missing. Called through `HostConnection.call` before a domain is
defined. A filter of ours that exists is left as it is: its name carries its version.
"""

from __future__ import annotations

import libvirt

from capi_libvirt.core import traffic_filter
from capi_libvirt.hypervisor import errors


class TrafficFilterMissing(errors.HypervisorError):
    """The host has no `clean-traffic` filter (libvirt's nwfilter definitions are not installed)."""


def ensure_filters(conn: libvirt.virConnect, with_allowed: bool) -> None:
    """`clean-traffic` exists (else TrafficFilterMissing); with `with_allowed`, this project's filters too (defined
    here when missing)."""
    if not _exists(conn, traffic_filter.CLEAN_TRAFFIC):
        raise TrafficFilterMissing("the host has no libvirt traffic filter clean-traffic, which every machine's NIC "
                                   "carries (Debian and Ubuntu: apt install libvirt-daemon-config-nwfilter)")
    if with_allowed:
        for name, xml in traffic_filter.project_filters().items():
            if not _exists(conn, name):
                conn.nwfilterDefineXML(xml)


def _exists(conn: libvirt.virConnect, name: str) -> bool:
    try:
        conn.nwfilterLookupByName(name)
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_NWFILTER:
            return False
        raise
    return True
