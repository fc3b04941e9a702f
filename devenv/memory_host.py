"""An in-memory hypervisor host: the provider's `Host` protocol (capi_libvirt.hypervisor.host) over state kept in
memory, for the fast test tier and for benchmarks of the reconciles without guests.

It keeps what the provider makes on a host and answers as the libvirt implementation does, raising the same
hypervisor errors: storage pools with volumes (their capacity counted against the pool, their bytes kept: the NoCloud
ISO can be read back), domains defined from the provider's own XML (started, paused, stopped; a start needs every disk
and CD-ROM file it names), libvirt networks that lease an address to each NIC when its domain starts (or, with
`lease_on_start=False`, when the test says), base images imported by sha256 with their marker, and foreign domains an
admin defined. Faults on demand: the host unreachable (`unreachable`), an operation failing the next N times
(`fail`), an operation held until the test releases it (`hold`), a domain lost behind the provider's back
(`lose_domain`), a pool filled by something else (`fill_pool`).

What it is not: libvirt. It checks what the provider's reconciles rely on (ownership metadata, files before a start,
space in a pool, a network that exists and runs), not libvirt's schema; the integration and e2e tiers keep the real
libvirtd for that.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import fnmatch
import hashlib
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence

from capi_libvirt.core import domain_owner, domain_xml, domain_xml_edits, images, placement, traffic_filter
from capi_libvirt.core.address_conflicts import Segment, SegmentFacts
from capi_libvirt.core.orphans import HostDomain
from capi_libvirt.hypervisor import connection, credentials, errors, machines, probe, serial_log, traffic_filters
from capi_libvirt.hypervisor import images as host_images
from capi_libvirt.hypervisor.host import Host, ImageOpener
from devenv.memory_state import GIB, OVERLAY_ALLOCATION, Domain, HostState, Volume


@dataclasses.dataclass
class Hold:
    """An operation held (MemoryHost.hold): `reached` once it waits, and it goes on once the test calls release()."""

    after: bool = False
    reached: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def release(self) -> None:
        self.released.set()

    async def wait(self) -> None:
        self.reached.set()
        await self.released.wait()


class MemoryHost(HostState):
    """One host in memory. `host`, `uri`, `credentials`, `opened` and `calls` as the Host protocol says;
    `operations` counts each operation by name, `asked` lists them with their arguments."""

    def __init__(self, host: str = "memory", *, uri: str = "memory:///system", cpus: int = 8,
                 memory_mib: int = 16384, pools: dict[str, int] | None = None,
                 networks: dict[str, str] | None = None, lease_on_start: bool = True,
                 domain_types: Sequence[str] = ("qemu", "kvm"),
                 machine_types: Sequence[str] = ("pc", "q35", "pc-i440fx-7.2", "pc-q35-7.2"),
                 cpu_models: dict[str, bool] | None = None, libvirt_version: str = "9.0.0",
                 hypervisor_version: str = "7.2.0", clean_traffic: bool = True, latency_s: float = 0.0) -> None:
        """`latency_s`: each operation takes that long (a libvirt call's round trip, for the scale bench)."""
        super().__init__(host, pools, networks)
        self.uri = uri
        self.latency_s = latency_s
        self.credentials: credentials.Credentials | None = None
        self.observe: connection.CallObserver | None = None
        self.opened, self.calls = 1, 0
        self.operations: collections.Counter[str] = collections.Counter()
        self.asked: list[tuple[str, tuple[object, ...]]] = []  # every operation asked, with its arguments, in order
        self.keep_asked = True  # False: `asked` stays empty (the scale bench: it would hold every seed's bytes)
        self.cpus, self.memory_mib = cpus, memory_mib
        self.libvirt_version, self.hypervisor_version = libvirt_version, hypervisor_version
        self.lease_on_start = lease_on_start
        self.domain_types = frozenset(domain_types)  # what its QEMU runs (no kvm: a host without hardware virtualization)
        self.known_machine_types = frozenset(machine_types)  # of its QEMU, for each of its domain types
        self.known_cpu_models = cpu_models if cpu_models is not None else {"qemu64": True, "Haswell": False}  # usable?
        self.clean_traffic = clean_traffic
        self.agent_addresses: dict[str, list[str]] = {}  # domain UUID -> what its guest agent answers
        self.arp_addresses: dict[str, list[str]] = {}  # domain UUID -> what the host's ARP table holds for it
        # Faults
        self.unreachable: str | None = None  # every operation raises HostUnreachable with this message
        self.connected = True  # Host.connected: False as while a connection is being opened and none is alive
        self._failures: dict[str, list[Exception]] = {}
        self._holds: dict[str, Hold] = {}

    # -- faults ---------------------------------------------------------------------

    def fail(self, operation: str, error: Exception, times: int = 1) -> None:
        """The next `times` calls of `operation` (a Host method's name) raise `error`, doing nothing."""
        self._failures.setdefault(operation, []).extend([error] * times)

    def hold(self, operation: str, *, after: bool = False) -> Hold:
        """The next call of `operation` waits until the test releases it: before it acts, or (`after`) once it has
        acted, before it answers (a look-up that read the state, its answer still on its way)."""
        self._holds[operation] = Hold(after=after)
        return self._holds[operation]

    def close(self) -> None:
        """Nothing to release."""

    @contextlib.asynccontextmanager
    async def _operation(self, name: str, *args: object) -> collections.abc.AsyncIterator[None]:
        self.calls += 1
        self.operations[name] += 1
        if self.keep_asked:
            self.asked.append((name, args))
        started, ok = time.monotonic(), False
        try:
            held = self._holds.pop(name, None)
            if held is not None and not held.after:
                await held.wait()
            await asyncio.sleep(self.latency_s)  # a real call is a thread's round trip: other passes run meanwhile
            if self.unreachable is not None:
                raise errors.HostUnreachable(f"{name}: {self.unreachable}", self.host)
            failures = self._failures.get(name)
            if failures:
                error = failures.pop(0)
                if isinstance(error, errors.HypervisorError):
                    error.host = error.host or self.host
                raise error
            yield
            if held is not None and held.after:
                await held.wait()
            ok = True
        finally:
            if self.observe is not None:
                self.observe(name, time.monotonic() - started, ok)

    # -- the host as a whole -------------------------------------------------------------------------------------------

    async def probe(self, pool: str, management_cluster: str | None, pool_patterns: Sequence[str],
                    refresh_pools: bool) -> probe.HostProbe:
        async with self._operation("probe", pool, management_cluster, pool_patterns, refresh_pools):
            usage = placement.host_usage([self._usage(domain) for domain in self.domains.values()],
                                         management_cluster)
            main = self.pools.get(pool)
            pools = tuple(self._pool_usage(p, usage.volume_paths) for p in self.pools.values()
                          if p.active and any(fnmatch.fnmatchcase(p.name, pattern) for pattern in pool_patterns))
            used = sum(self._usage(d).memory_mib for d in self.domains.values() if d.state != "shutoff")
            free = max(self.memory_mib - used, 0)
            return probe.HostProbe(
                libvirt_version=self.libvirt_version, hypervisor_version=self.hypervisor_version, cpus=self.cpus,
                memory_mib=self.memory_mib, free_memory_mib=free, machines=usage.machines,
                allocated_cpus=usage.allocated_cpus, allocated_memory_mib=usage.allocated_memory_mib,
                pool_capacity_bytes=main.capacity if main is not None and main.active else None,
                pool_available_bytes=main.available if main is not None and main.active else None,
                available_memory_mib=free, foreign_vms=usage.foreign_vms, foreign_cpus=usage.foreign_cpus,
                foreign_memory_mib=usage.foreign_memory_mib, foreign_shut_off=usage.foreign_shut_off, pools=pools,
                machine_domains=usage.machine_domains)

    async def machine_types(self, domain_type: str) -> frozenset[str]:
        async with self._operation("machine_types", domain_type):
            return self.known_machine_types if domain_type in self.domain_types else frozenset()

    async def cpu_models(self, model: str, domain_type: str, machine_type: str) -> machines.CPUModels:
        async with self._operation("cpu_models", model, domain_type, machine_type):
            usable = tuple(sorted(name for name, ok in self.known_cpu_models.items() if ok))
            return machines.CPUModels(known=model in self.known_cpu_models,
                                      usable=self.known_cpu_models.get(model, False),
                                      usable_models=usable)

    async def segment_facts(self, segments: Sequence[Segment], own_uuid: str) -> dict[Segment, SegmentFacts]:
        async with self._operation("segment_facts", segments, own_uuid):
            facts = {}
            for segment in segments:
                kind, name = segment
                own: tuple[str, ...] = ()
                leases: dict[str, str] = {}
                if kind == "network":
                    network = self._active_network(name)
                    own = (f"{network.gateway}/{network.subnet.prefixlen}",)
                    leases = {address: mac for mac, address in network.leases.items()}
                macs = frozenset(mac for uuid in self.domains if uuid != own_uuid
                                 for mac, nic_segment in self._nics(uuid) if nic_segment == segment)
                facts[segment] = SegmentFacts(own=own, macs=macs, leases=leases)
            return facts

    async def ensure_filters(self) -> None:
        async with self._operation("ensure_filters"):
            if not self.clean_traffic:
                raise traffic_filters.TrafficFilterMissing("the host has no libvirt traffic filter clean-traffic")

    # -- a machine's volumes ------------------------------------------------------------------------------------------

    async def pool_path(self, pool: str) -> str:
        async with self._operation("pool_path", pool):
            return self._active_pool(pool).path

    async def ensure_overlay(self, volumes: machines.MachineVolumes, base_pool: str, base_volume: str,
                             disk_gib: int) -> machines.Overlay:
        """As the real host's, with every volume here world-readable: a base without a backing file of its own is
        shared as it is (core.volume_xml.shareable_base)."""
        async with self._operation("ensure_overlay", volumes, base_pool, base_volume, disk_gib):
            pool = self._active_pool(volumes.pool)
            base_in = self._active_pool(base_pool)
            if volumes.overlay not in pool.volumes:
                base = self._volume(base_in, base_volume)
                self._create(pool, Volume(volumes.overlay, max(disk_gib * GIB, base.capacity), OVERLAY_ALLOCATION,
                                          "qcow2", backing=base_in.path_of(base.name)))
            backing_path = pool.volumes[volumes.overlay].backing
            base_found = next((volume for volume in base_in.volumes.values()
                               if base_in.path_of(volume.name) == backing_path), None)
            backing = (domain_xml.BackingFile(str(backing_path), base_found.format)
                       if base_found is not None and base_found.backing is None else None)
            return machines.Overlay(pool.path_of(volumes.overlay), backing)

    async def ensure_data_disks(self, volumes: machines.MachineVolumes, sizes_gib: list[int]) -> list[str]:
        async with self._operation("ensure_data_disks", volumes, sizes_gib):
            pool = self._active_pool(volumes.pool)
            for name, size in zip(volumes.data_disks, sizes_gib, strict=True):
                if name not in pool.volumes:
                    self._create(pool, Volume(name, size * GIB, OVERLAY_ALLOCATION, "qcow2"))
            return [pool.path_of(name) for name in volumes.data_disks]

    async def replace_nocloud(self, volumes: machines.MachineVolumes, iso: bytes) -> str:
        async with self._operation("replace_nocloud", volumes, iso):
            return self._upload(volumes.pool, volumes.nocloud, iso)

    async def replace_ignition(self, volumes: machines.MachineVolumes, config: bytes) -> str:
        async with self._operation("replace_ignition", volumes, config):
            if not volumes.ignition:
                raise ValueError("no Ignition volume name")
            return self._upload(volumes.pool, volumes.ignition, config)

    async def ensure_serial_log(self, volumes: machines.MachineVolumes) -> str:
        async with self._operation("ensure_serial_log", volumes):
            pool = self._active_pool(volumes.pool)
            if volumes.serial_log not in pool.volumes:
                self._create(pool, Volume(volumes.serial_log, 0, 0))
            return pool.path_of(volumes.serial_log)

    async def read_serial_log(self, pool: str, log_volume: str, start: int, tail: int | None) -> serial_log.LogChunk:
        async with self._operation("read_serial_log", pool, log_volume, start, tail):
            data = self._volume(self._active_pool(pool), log_volume).data
            first, end = serial_log.log_range(len(data), start, tail)
            return serial_log.LogChunk(data[first:end], end)

    # -- a machine's domain -------------------------------------------------------------------------------------------

    async def domain_info(self, uuid: str) -> machines.DomainInfo | None:
        async with self._operation("domain_info", uuid):
            return self._info(uuid) if uuid in self.domains else None

    async def define_domain(self, uuid: str, xml: str) -> machines.DomainInfo:
        async with self._operation("define_domain", uuid, xml):
            if uuid not in self.domains:
                root = ET.fromstring(xml)
                name = root.findtext("name") or ""
                if root.findtext("uuid") != uuid:
                    raise errors.HypervisorError(f"define domain: the XML's UUID is not {uuid}")
                if any(domain.name == name for domain in self.domains.values()):
                    raise errors.HypervisorError(f"define domain: domain '{name}' already exists")
                self.domains[uuid] = Domain(uuid, name, xml)
            return self._info(uuid)

    async def start_domain(self, uuid: str) -> bool:
        async with self._operation("start_domain", uuid):
            domain = self._domain(uuid)
            if domain.state == "paused":
                domain.state, domain.pause_reason = "running", None
                return True
            if domain.state == "shutoff":
                missing = sorted(p for p in domain_xml_edits.disk_paths(domain.xml) if not self._volume_at(p))
                if missing:
                    raise errors.HypervisorError(f"start domain: Cannot access storage file '{missing[0]}'")
                for mac, network in self._network_nics(uuid):
                    self._active_network(network)
                    if self.lease_on_start:
                        self.networks[network].lease(mac)
                domain.state = "running"
            return False

    async def domain_addresses(self, uuid: str) -> machines.Discovery:
        async with self._operation("domain_addresses", uuid):
            domain = self._domain(uuid)
            asked = []
            for source in machines.address_sources(domain.xml):
                asked.append(source)
                answers = {"lease": list(self.leased(uuid).values()), "agent": self.agent_addresses.get(uuid, []),
                           "arp": self.arp_addresses.get(uuid, [])}
                found = list(answers.get(source, [])) if domain.state == "running" else []
                if found:
                    return machines.Discovery(found, source, asked)
            return machines.Discovery([], None, asked)

    async def pin_leased_addresses(self, uuid: str, allowed: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
        async with self._operation("pin_leased_addresses", uuid, allowed):
            domain = self._domain(uuid)
            root = ET.fromstring(domain.xml)
            pinned = []
            for nic in root.findall("devices/interface[@type='network']"):
                current = traffic_filter.parse_filterref(nic)
                mac_element, source = nic.find("mac"), nic.find("source")
                mac = (mac_element.get("address") or "").lower() if mac_element is not None else ""
                network = self.networks.get(source.get("network") or "") if source is not None else None
                if current is None or not current.awaiting_lease or network is None or mac not in network.leases:
                    continue
                wanted = traffic_filter.TrafficFilter(addresses=(network.leases[mac],), allowed=allowed.get(mac, ()))
                for old in nic.findall("filterref"):
                    nic.remove(old)
                nic.append(traffic_filter.filterref_element(wanted))
                pinned.append((mac, network.leases[mac]))
            domain.xml = ET.tostring(root, encoding="unicode")
            return pinned

    async def set_owner(self, uuid: str, owner: domain_owner.Owner, expected: domain_owner.Owner | None) -> None:
        async with self._operation("set_owner", uuid, owner, expected):
            domain = self._domain(uuid)
            if expected is not None and domain_owner.parse_owner(domain.xml) != expected:
                raise errors.HypervisorError(f"owner metadata of domain {domain.name} changed meanwhile")
            root = ET.fromstring(domain.xml)
            metadata = root.find("metadata")
            if metadata is None:
                metadata = ET.SubElement(root, "metadata")
            for old in metadata.findall(f"{{{domain_owner.METADATA_NAMESPACE}}}{domain_owner.METADATA_ELEMENT}"):
                metadata.remove(old)
            metadata.append(ET.fromstring(domain_owner.owner_metadata_xml(owner)))
            domain.xml = ET.tostring(root, encoding="unicode")

    async def eject_nocloud(self, uuid: str, iso_volume: str) -> list[str]:
        async with self._operation("eject_nocloud", uuid, iso_volume):
            domain = self._domain(uuid)
            ejected = domain_xml_edits.ejected_cdrom_xml(domain.xml, iso_volume)
            if ejected is None:
                return []
            domain.xml = self._with_device(domain.xml, ejected)
            return ["live", "persistent"] if domain.state != "shutoff" else ["persistent"]

    async def delete_nocloud(self, volumes: machines.MachineVolumes) -> bool:
        async with self._operation("delete_nocloud", volumes):
            return self._active_pool(volumes.pool).volumes.pop(volumes.nocloud, None) is not None

    async def drop_ignition(self, uuid: str, volumes: machines.MachineVolumes) -> list[str]:
        async with self._operation("drop_ignition", uuid, volumes):
            if not volumes.ignition:
                raise ValueError("no Ignition volume name")
            domain, done = self._domain(uuid), []
            redefined = domain_xml_edits.without_fw_cfg_file_xml(domain.xml, volumes.ignition)
            if redefined is not None:
                domain.xml = redefined
                done.append("definition")
            pool = self._active_pool(volumes.pool)
            volume = pool.volumes.get(volumes.ignition)
            if volume is not None and domain.state != "shutoff":
                volume.data = bytes(len(volume.data))
                done.append("emptied")
            elif volume is not None:
                del pool.volumes[volumes.ignition]
                done.append("volume")
            return done

    async def delete_machine(self, uuid: str, machine_uid: str, volumes: machines.MachineVolumes,
                             namespace: str | None, name: str | None) -> list[str]:
        async with self._operation("delete_machine", uuid, machine_uid, volumes, namespace, name):
            removed = []
            domain = self.domains.get(uuid)
            if domain is not None:
                owner = domain_owner.parse_owner(domain.xml)
                if owner is None or owner.uid != machine_uid or (namespace is not None and owner.namespace != namespace) \
                        or (name is not None and owner.name != name):
                    raise errors.HypervisorError(f"domain {uuid} is not owned by machine {machine_uid}; left alone")
                del self.domains[uuid]
                removed.append(f"domain {uuid}")
            pool = self.pools.get(volumes.pool)
            if pool is None:
                return removed
            pool.active = True
            for volume in volumes.all_names():
                if pool.volumes.pop(volume, None) is not None:
                    removed.append(f"volume {volume}")
            return removed

    # -- the host's domains as the orphan collector sees them ---------------------------------------------------------

    async def list_domains(self, pool: str) -> tuple[list[HostDomain], list[str]]:
        async with self._operation("list_domains", pool):
            found = []
            for domain in self.domains.values():
                try:
                    owner = domain_owner.parse_owner(domain.xml)
                except ValueError:
                    owner = None
                found.append(HostDomain(uuid=domain.uuid, name=domain.name, owner=owner,
                                        paths=domain_xml_edits.disk_paths(domain.xml)))
            listed = self.pools.get(pool)
            return found, sorted(listed.volumes) if listed is not None and listed.active else []

    async def remove_orphan(self, orphan: HostDomain, paths: frozenset[str]) -> list[str]:
        async with self._operation("remove_orphan", orphan, paths):
            domain = self.domains.get(orphan.uuid)
            if domain is None:
                return []
            if domain.name != orphan.name or domain_owner.parse_owner(domain.xml) != orphan.owner:
                raise errors.HypervisorError(f"domain {orphan.name} changed since it was found orphaned; left alone")
            del self.domains[orphan.uuid]
            removed = [f"domain {orphan.name}"]
            for path in sorted(paths):
                for pool in self.pools.values():
                    folder, _, name = path.rpartition("/")
                    if folder == pool.path and pool.volumes.pop(name, None) is not None:
                        removed.append(f"volume {name}")
            return removed

    # -- base images imported from a URL ------------------------------------------------------------------------------

    async def find_image(self, pool: str, sha256: str) -> host_images.ImageVolume | None:
        async with self._operation("find_image", pool, sha256):
            return self._found_image(self._active_pool(pool), sha256)

    async def import_image(self, pool: str, sha256: str, open_source: ImageOpener,
                           room_bytes: int | None) -> host_images.ImageVolume:
        async with self._operation("import_image", pool, sha256, open_source, room_bytes):
            target = self._active_pool(pool)
            found = self._found_image(target, sha256)
            if found is not None:
                return found
            data = await asyncio.to_thread(_read_all, open_source, room_bytes, target.available, pool)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise host_images.ChecksumMismatch(sha256, hashlib.sha256(data).hexdigest(), len(data))
            try:
                shape = images.inspect_header(data[:images.HEADER_BYTES])
            except images.ImageRefused as error:
                raise host_images.ImageRefused(str(error)) from None
            name = images.image_volume_name(sha256)
            target.volumes.pop(name, None)
            self._create(target, Volume(name, shape.virtual_size or len(data), len(data), shape.format, data))
            self._create(target, Volume(images.verified_marker_name(sha256), 0, 0))
            return host_images.ImageVolume(name, target.path_of(name), shape.format, len(data))


def _read_all(open_source: ImageOpener, room_bytes: int | None, available: int, pool: str) -> bytes:
    """The source's bytes, refused as the libvirt import refuses them when its length says it cannot fit."""
    with open_source() as source:
        if source.length is not None and room_bytes is not None and source.length > room_bytes:
            raise host_images.InsufficientStorage(images.storage_message(source.length, room_bytes, pool,
                                                                         promised=True))
        if source.length is not None and source.length > available:
            raise host_images.InsufficientStorage(images.storage_message(source.length, available, pool))
        return b"".join(iter(lambda: source.read(1 << 20), b""))


class MemoryHosts:
    """The in-memory hosts of a test, by name: a HostRegistry's factory (hypervisor.host.HostRegistry(factory=...))
    that hands out the same host for a name, as a re-configured LibvirtHost still reaches the same machine."""

    def __init__(self, *hosts: MemoryHost, make: Callable[[str], MemoryHost] = MemoryHost) -> None:
        """`hosts` known from the start; `make(name)`: a host asked for by a name not known yet."""
        self.hosts = {host.host: host for host in hosts}
        self.make = make

    def __call__(self, name: str, uri: str, secret: credentials.Credentials | None,
                 observe: connection.CallObserver | None) -> MemoryHost:
        if name not in self.hosts:
            self.hosts[name] = self.make(name)
        host = self.hosts[name]
        host.uri, host.credentials, host.observe = uri, secret, observe
        return host

    def __getitem__(self, name: str) -> MemoryHost:
        return self.hosts[name]


def as_host(host: MemoryHost) -> Host:
    """The in-memory host where the provider wants a Host (and mypy's proof that it is one)."""
    return host
