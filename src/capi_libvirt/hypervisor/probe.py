"""What a host is asked before anything is placed on it: its probe (versions, size, free memory, this provider's
domains and the foreign ones, the pools the machines may use and what they hold), which core.placement decides
from. Run by LibvirtHost (hypervisor.host) like hypervisor.machines.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import libvirt

from capi_libvirt.core import domain_owner, domain_xml_edits, placement
from capi_libvirt.hypervisor import errors


@dataclasses.dataclass(frozen=True)
class HostProbe:
    """What a health probe reads of a host in one go."""

    libvirt_version: str
    hypervisor_version: str
    cpus: int
    memory_mib: int
    free_memory_mib: int
    machines: int
    allocated_cpus: int
    allocated_memory_mib: int
    pool_capacity_bytes: int | None
    pool_available_bytes: int | None
    available_memory_mib: int | None = None  # free + buffers + cached (virNodeGetMemoryStats); None: not reported
    foreign_vms: int = 0  # running domains that are not this provider's (core.placement.host_usage)
    foreign_cpus: int = 0
    foreign_memory_mib: int = 0
    foreign_shut_off: int = 0  # foreign domains defined but shut off
    pools: tuple[placement.PoolUsage, ...] = ()  # the active pools the probe was asked about
    machine_domains: frozenset[tuple[str, str, str, bool]] = frozenset()  # core.placement.HostUsage's


def _version(number: int) -> str:
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


class DomainXMLReadings:
    """What the probe reads in each domain's XML (its owner metadata and the files it uses), kept from one probe of a
    host to the next and read again only when the XML changed: a domain's definition rarely changes, and parsing every
    domain twice at every probe was most of what an idle operator spent with thousands of machines."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[domain_owner.Owner | None, frozenset[str]]] = {}
        self._seen: dict[str, tuple[domain_owner.Owner | None, frozenset[str]]] = {}

    def read(self, xml_text: str) -> tuple[domain_owner.Owner | None, frozenset[str]]:
        reading = self._held.get(xml_text)
        if reading is None:
            reading = (domain_owner.parse_owner(xml_text), domain_xml_edits.disk_paths(xml_text))
        self._seen[xml_text] = reading
        return reading

    def probe_done(self) -> None:
        """Keep what this probe read, forget the rest (domains gone or redefined)."""
        self._held, self._seen = self._seen, {}


def _domain_usage(domain: libvirt.virDomain, readings: DomainXMLReadings) -> placement.DomainUsage:
    """A domain's owner, state, memory and vCPUs. This provider's domains count with their maximum memory (what they
    were defined with); a foreign one with the memory it has now (its balloon's current size), which is what it holds
    from the host; the vCPUs it has now."""
    owner, disk_paths = readings.read(domain.XMLDesc(0))
    state, max_kib, kib, vcpus, _time = domain.info()
    return placement.DomainUsage(owner=owner, active=state != libvirt.VIR_DOMAIN_SHUTOFF,
                                 memory_mib=(max_kib if owner is not None else kib) // 1024, vcpus=vcpus,
                                 disk_paths=disk_paths, running=state == libvirt.VIR_DOMAIN_RUNNING)


def _available_memory_mib(conn: libvirt.virConnect) -> int | None:
    """What the host can hand to a new guest without swapping, as libvirt reports it: free + buffers + cached
    (virNodeGetMemoryStats, KiB). Free memory alone undercounts on any host that has run a while: Linux keeps the
    page cache until memory is needed. None when the driver reports no such numbers."""
    try:
        stats = conn.getMemoryStats(libvirt.VIR_NODE_MEMORY_STATS_ALL_CELLS, 0)
    except libvirt.libvirtError as error:
        if errors.is_unsupported(error):
            return None
        raise
    if "free" not in stats:
        return None
    return int(sum(stats.get(key, 0) for key in ("free", "buffers", "cached")) // 1024)


def _pool_usage(pool: libvirt.virStoragePool, machine_paths: frozenset[str], refresh: bool) -> placement.PoolUsage:
    """An active pool's numbers, and the full size and allocation of the volumes in it that `machine_paths` (the files
    this management cluster's domains use) name. A volume's path is the pool's target folder and its name (folder,
    file system and LVM pools), so only those volumes are asked for their sizes (each answer is as of now).

    The pool's own allocation is as of its last refresh (libvirt adds what it creates, but not what guests write),
    so `refresh` renews it first; a refresh reads every volume's header under the pool's lock, so the caller asks for
    one only every few minutes. Meanwhile the machines' growth since then is not in "other" (it is in their full size,
    which placement counts anyway)."""
    if refresh:
        try:
            pool.refresh(0)
        except libvirt.libvirtError as error:
            if not errors.is_internal_error(error):  # "has asynchronous jobs running": next time
                raise
    _state, capacity, allocation, available = pool.info()
    target = ET.fromstring(pool.XMLDesc(0)).findtext("target/path") or ""
    disks = disks_allocation = 0
    for volume in pool.listAllVolumes(0):
        if f"{target.rstrip('/')}/{volume.name()}" not in machine_paths:
            continue
        try:
            _type, volume_capacity, volume_allocation = volume.info()
        except libvirt.libvirtError as error:
            if errors.is_missing_volume(error):
                continue  # deleted between the listing and the look
            raise
        disks += volume_capacity
        disks_allocation += volume_allocation
    return placement.PoolUsage(pool.name(), capacity, allocation, available, disks, disks_allocation)


def probe_host(conn: libvirt.virConnect, pool_name: str, management_cluster: str | None = None,
               pool_patterns: Sequence[str] = (), refresh_pools: bool = False,
               readings: DomainXMLReadings | None = None) -> HostProbe:
    """Versions, size, free memory, this provider's domains and the foreign ones (by their owner metadata: see
    core.placement.is_foreign), the pool's space, and the usage of every active pool named by `pool_patterns`
    (shell-style: the pools the host's access rules let machines use). `readings`: what the host's last probe read in
    its domains' XML (none: all read)."""
    _model, memory_mib, cpus, *_ = conn.getInfo()
    readings = readings if readings is not None else DomainXMLReadings()
    domains = []
    for domain in conn.listAllDomains():
        try:
            domains.append(_domain_usage(domain, readings))
        except libvirt.libvirtError as error:
            if errors.is_missing_domain(error):
                continue  # undefined between the listing and the look: not there any more
            raise
    readings.probe_done()
    usage = placement.host_usage(domains, management_cluster)
    capacity = available = None
    try:
        pool = conn.storagePoolLookupByName(pool_name)
        if pool.isActive():
            _state, capacity, _allocation, available = pool.info()
    except libvirt.libvirtError as error:
        if not errors.is_missing_pool(error):
            raise
    pools = []
    for pool in conn.listAllStoragePools(libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE):
        if any(fnmatch.fnmatchcase(pool.name(), pattern) for pattern in pool_patterns):
            try:
                pools.append(_pool_usage(pool, usage.volume_paths, refresh_pools))
            except libvirt.libvirtError as error:
                if not (errors.is_missing_pool(error) or errors.is_operation_invalid(error)):
                    raise  # (gone, or stopped, between the listing and the look: not counted)
    return HostProbe(
        libvirt_version=_version(conn.getLibVersion()), hypervisor_version=_version(conn.getVersion()),
        cpus=cpus, memory_mib=memory_mib, free_memory_mib=conn.getFreeMemory() // (1024 * 1024),
        machines=usage.machines, allocated_cpus=usage.allocated_cpus, allocated_memory_mib=usage.allocated_memory_mib,
        pool_capacity_bytes=capacity, pool_available_bytes=available,
        available_memory_mib=_available_memory_mib(conn), foreign_vms=usage.foreign_vms,
        foreign_cpus=usage.foreign_cpus, foreign_memory_mib=usage.foreign_memory_mib,
        foreign_shut_off=usage.foreign_shut_off, pools=tuple(pools), machine_domains=usage.machine_domains)
