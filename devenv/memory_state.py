"""The state of an in-memory host (devenv.memory_host): its storage pools and their volumes (capacity counted, bytes
kept), its libvirt networks and their DHCP leases, its domains; the rules libvirt holds that state to (a pool must be
active, a volume fit, a domain exist), raising the hypervisor errors the libvirt side raises; and the test's hands on
it (an admin's volume, a foreign domain, a lost domain, a full pool)."""

from __future__ import annotations

import dataclasses
import ipaddress
import xml.etree.ElementTree as ET
from collections.abc import Iterator

from capi_libvirt.core import domain_owner, domain_xml_edits, images, placement
from capi_libvirt.core.address_conflicts import Segment
from capi_libvirt.hypervisor import errors, machines
from capi_libvirt.hypervisor import images as host_images

GIB = 1 << 30
OVERLAY_ALLOCATION = 196 * 1024  # what a fresh qcow2 overlay takes on disk: its header and tables


@dataclasses.dataclass
class Volume:
    name: str
    capacity: int
    allocation: int
    format: str = "raw"
    data: bytes = b""
    backing: str | None = None


@dataclasses.dataclass
class Pool:
    name: str
    path: str
    capacity: int
    volumes: dict[str, Volume] = dataclasses.field(default_factory=dict)
    active: bool = True
    used_elsewhere: int = 0  # bytes taken by files that are not volumes (fill_pool)

    @property
    def allocation(self) -> int:
        return self.used_elsewhere + sum(volume.allocation for volume in self.volumes.values())

    @property
    def available(self) -> int:
        return max(self.capacity - self.allocation, 0)

    def path_of(self, name: str) -> str:
        return f"{self.path}/{name}"


@dataclasses.dataclass
class Network:
    name: str
    subnet: ipaddress.IPv4Network
    active: bool = True
    leases: dict[str, str] = dataclasses.field(default_factory=dict)  # MAC (lowercase) -> address

    @property
    def gateway(self) -> str:
        return str(next(self.subnet.hosts()))

    def lease(self, mac: str) -> str:
        """The MAC's address, leased now if it has none (the next free one after the gateway)."""
        if mac not in self.leases:
            taken = {*self.leases.values(), self.gateway}
            free = next((str(a) for a in self.subnet.hosts() if str(a) not in taken), None)
            if free is None:
                raise errors.HypervisorError(f"network {self.name}: no address left to lease")
            self.leases[mac] = free
        return self.leases[mac]


@dataclasses.dataclass
class Domain:
    uuid: str
    name: str
    xml: str  # live and persistent alike
    state: str = "shutoff"  # machines.STATE_NAMES' values: running, paused, shutoff
    pause_reason: str | None = None


class HostState:
    """Pools, networks and domains of one host, by name (UUID for domains), and the rules they are kept by."""

    def __init__(self, host: str, pools: dict[str, int] | None, networks: dict[str, str] | None) -> None:
        """`pools`: name -> capacity in bytes (default: `default`, 100 GiB); `networks`: name -> subnet (default:
        `default`, 192.168.122.0/24)."""
        self.host = host
        self.pools = {name: Pool(name, f"/var/lib/libvirt/{name}", size)
                      for name, size in (pools if pools is not None else {"default": 100 * GIB}).items()}
        self.networks = {name: Network(name, ipaddress.IPv4Network(subnet))
                         for name, subnet in (networks if networks is not None
                                              else {"default": "192.168.122.0/24"}).items()}
        self.domains: dict[str, Domain] = {}
        # False: uploads keep their size, not their bytes (the scale bench: 2,000 NoCloud ISOs held in the operator's
        # own process would be counted as the operator's memory).
        self.keep_uploads = True
        self._readings: dict[str, tuple[domain_owner.Owner | None, int, int, frozenset[str]]] = {}

    # -- the test's hands on the host ---------------------------------------------------------------------------------

    def lose_domain(self, uuid: str) -> None:
        """The domain is gone (an admin undefined it), its volumes left where they are."""
        del self.domains[uuid]

    def fill_pool(self, pool: str, leave_bytes: int = 0) -> None:
        """Something else takes the pool's free space but `leave_bytes`."""
        self.pools[pool].used_elsewhere += max(self.pools[pool].available - leave_bytes, 0)

    def add_volume(self, pool: str, name: str, data: bytes = b"", *, capacity: int | None = None,
                   fmt: str = "raw") -> Volume:
        """A volume an admin made (a base image: `fmt` qcow2 and a `capacity`)."""
        volume = Volume(name, capacity if capacity is not None else len(data), len(data), fmt, data)
        self.pools[pool].volumes[name] = volume
        return volume

    def define_foreign(self, name: str, uuid: str, memory_mib: int = 1024, vcpus: int = 1,
                       running: bool = True) -> Domain:
        """A domain that is not this provider's (no owner metadata)."""
        xml = (f"<domain type='qemu'><name>{name}</name><uuid>{uuid}</uuid>"
               f"<memory unit='KiB'>{memory_mib * 1024}</memory><vcpu>{vcpus}</vcpu><devices/></domain>")
        self.domains[uuid] = Domain(uuid, name, xml, "running" if running else "shutoff")
        return self.domains[uuid]

    def leased(self, uuid: str) -> dict[str, str]:
        """The domain's NICs on libvirt networks that have a lease: MAC -> address."""
        return {mac: self.networks[network].leases[mac] for mac, network in self._network_nics(uuid)
                if network in self.networks and mac in self.networks[network].leases}

    def volume_names(self, pool: str) -> list[str]:
        return sorted(self.pools[pool].volumes)

    def _usage(self, domain: Domain) -> placement.DomainUsage:
        """What the probe reads of a domain; its XML parsed once while it stays the same (as the product's probe does,
        hypervisor.probe.DomainXMLReadings: this host runs in the operator's process in the scale bench)."""
        read = self._readings.get(domain.xml)
        if read is None:
            root = ET.fromstring(domain.xml)
            read = self._readings[domain.xml] = (domain_owner.parse_owner(domain.xml),
                                                 int(root.findtext("memory") or 0),  # the provider writes KiB
                                                 int(root.findtext("vcpu") or 1),
                                                 domain_xml_edits.disk_paths(domain.xml))
            if len(self._readings) > 4 * len(self.domains) + 64:  # old definitions: forget them
                self._readings = {d.xml: self._readings[d.xml] for d in self.domains.values() if d.xml in self._readings}
        owner, memory_kib, vcpus, disk_paths = read
        return placement.DomainUsage(owner=owner, active=domain.state != "shutoff", memory_mib=memory_kib // 1024,
                                     vcpus=vcpus, disk_paths=disk_paths, running=domain.state == "running")

    @staticmethod
    def _pool_usage(pool: Pool, machine_paths: frozenset[str]) -> placement.PoolUsage:
        ours = [v for v in pool.volumes.values() if pool.path_of(v.name) in machine_paths]
        return placement.PoolUsage(pool.name, pool.capacity, pool.allocation, pool.available,
                                   sum(v.capacity for v in ours), sum(v.allocation for v in ours))

    # -- the state's rules ---------------------------------------------------------------------------------------------

    def _active_pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            raise errors.PoolNotFound(f"Storage pool not found: no storage pool with matching name '{name}'",
                                      self.host)
        if not pool.active:
            raise errors.OperationInvalid(f"storage pool '{name}' is not active", self.host)
        return pool

    def _active_network(self, name: str) -> Network:
        network = self.networks.get(name)
        if network is None:
            raise errors.NetworkNotFound(f"Network not found: no network with matching name '{name}'", self.host)
        if not network.active:
            raise errors.NetworkNotFound(f"network {name} is not active", self.host)
        return network

    def _volume(self, pool: Pool, name: str) -> Volume:
        volume = pool.volumes.get(name)
        if volume is None:
            raise errors.VolumeNotFound(f"Storage volume not found: no storage vol with matching name '{name}'",
                                        self.host)
        return volume

    def _volume_at(self, path: str) -> Volume | None:
        folder, _, name = path.rpartition("/")
        return next((p.volumes.get(name) for p in self.pools.values() if p.path == folder and name in p.volumes),
                    None)

    def _create(self, pool: Pool, volume: Volume) -> None:
        if volume.name in pool.volumes:
            raise errors.HypervisorError(f"storage volume '{volume.name}' exists already", self.host)
        if volume.allocation > pool.available:
            raise errors.HypervisorError(f"Not enough space in pool {pool.name} for volume {volume.name}: "
                                         f"{volume.allocation} bytes wanted, {pool.available} free", self.host)
        pool.volumes[volume.name] = volume

    def _upload(self, pool_name: str, name: str, data: bytes) -> str:
        pool = self._active_pool(pool_name)
        pool.volumes.pop(name, None)  # an earlier upload may have been cut short: replaced, never trusted
        self._create(pool, Volume(name, len(data), len(data), "raw", data if self.keep_uploads else b""))
        return pool.path_of(name)

    def _found_image(self, pool: Pool, sha256: str) -> host_images.ImageVolume | None:
        volume = pool.volumes.get(images.image_volume_name(sha256))
        if volume is None or images.verified_marker_name(sha256) not in pool.volumes:
            return None
        return host_images.ImageVolume(volume.name, pool.path_of(volume.name), volume.format)

    def _domain(self, uuid: str) -> Domain:
        domain = self.domains.get(uuid)
        if domain is None:
            raise errors.DomainNotFound(f"Domain not found: no domain with matching uuid '{uuid}'", self.host)
        return domain

    def _info(self, uuid: str) -> machines.DomainInfo:
        domain = self.domains[uuid]
        return machines.DomainInfo(uuid=uuid, name=domain.name, state=domain.state, xml=domain.xml,
                                   pause_reason=domain.pause_reason if domain.state == "paused" else None)

    def _nics(self, uuid: str) -> Iterator[tuple[str, Segment]]:
        """(MAC, segment) of each NIC of the domain on a libvirt network or a bridge."""
        for nic in ET.fromstring(self.domains[uuid].xml).findall("devices/interface"):
            kind, source, mac = nic.get("type"), nic.find("source"), nic.find("mac")
            if kind in ("network", "bridge") and source is not None and mac is not None:
                yield (mac.get("address") or "").lower(), (kind, source.get(kind) or "")

    def _network_nics(self, uuid: str) -> list[tuple[str, str]]:
        return [(mac, name) for mac, (kind, name) in self._nics(uuid) if kind == "network"]

    @staticmethod
    def _with_device(xml: str, device_xml: str) -> str:
        """The domain's XML with the disk of the same target replaced by `device_xml` (a media change)."""
        root, device = ET.fromstring(xml), ET.fromstring(device_xml)
        target = device.find("target")
        devices = root.find("devices")
        assert devices is not None and target is not None
        for index, disk in enumerate(devices):
            found = disk.find("target")
            if disk.tag == "disk" and found is not None and found.get("dev") == target.get("dev"):
                devices[index] = device
        return ET.tostring(root, encoding="unicode")
