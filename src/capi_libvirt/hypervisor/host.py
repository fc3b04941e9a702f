"""What the reconciles ask of a hypervisor host: the `Host` protocol, and `LibvirtHost`, its implementation over
libvirt.

Every reconcile reaches a host only through these methods (its machines' volumes, domains and addresses, the host's
probe, its orphans, its images), so a host is one interface with two implementations, as Cluster API's Docker
provider has one backend with a real and an in-memory side: `LibvirtHost` here runs each operation of
hypervisor.machines, hypervisor.images, hypervisor.host_domains, hypervisor.networks and hypervisor.traffic_filters
in its connection's thread pool (hypervisor.connection), its libvirt errors translated (hypervisor.errors); the
development environment's in-memory host (devenv/memory_host.py) keeps the same state in memory for the fast test
tier and the scale bench. Both raise the same hypervisor errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from capi_libvirt.core import domain_owner
from capi_libvirt.core.address_conflicts import Segment, SegmentFacts
from capi_libvirt.core.orphans import HostDomain
from capi_libvirt.hypervisor import (
    connection,
    errors,
    host_domains,
    images,
    machines,
    networks,
    probe,
    serial_log,
    traffic_filters,
)
from capi_libvirt.hypervisor import credentials as creds

ImageOpener = Callable[[], contextlib.AbstractContextManager[images.Source]]


class Host(Protocol):
    """One hypervisor host, by its LibvirtHost name. Every method may raise a hypervisor.errors.HypervisorError (an
    unreachable host: HostUnreachable)."""

    host: str  # the LibvirtHost's name
    uri: str
    credentials: creds.Credentials | None
    opened: int  # connections opened to it (its metric)
    calls: int  # operations run on it (its metric, and the numbers of docs/book/src/development/numbers.md)

    @property
    def connected(self) -> bool:
        """Whether a live connection to the host is open (a slow answer on it is a busy host, not a lost one)."""

    def close(self) -> None:
        """Blocking: release the host's connections (call it off the event loop)."""

    # The host as a whole
    async def probe(self, pool: str, management_cluster: str | None, pool_patterns: Sequence[str],
                    refresh_pools: bool) -> probe.HostProbe: ...

    async def machine_types(self, domain_type: str) -> frozenset[str]: ...

    async def cpu_models(self, model: str, domain_type: str, machine_type: str) -> machines.CPUModels: ...

    async def segment_facts(self, segments: Sequence[Segment], own_uuid: str) -> dict[Segment, SegmentFacts]: ...

    async def ensure_filters(self) -> None: ...

    # A machine's volumes
    async def pool_path(self, pool: str) -> str: ...

    async def ensure_overlay(self, volumes: machines.MachineVolumes, base_pool: str, base_volume: str,
                             disk_gib: int) -> machines.Overlay: ...

    async def ensure_data_disks(self, volumes: machines.MachineVolumes, sizes_gib: list[int]) -> list[str]: ...

    async def replace_nocloud(self, volumes: machines.MachineVolumes, iso: bytes) -> str: ...

    async def replace_ignition(self, volumes: machines.MachineVolumes, config: bytes) -> str: ...

    async def ensure_serial_log(self, volumes: machines.MachineVolumes) -> str: ...

    async def read_serial_log(self, pool: str, log_volume: str, start: int, tail: int | None) -> serial_log.LogChunk: ...

    # A machine's domain
    async def domain_info(self, uuid: str) -> machines.DomainInfo | None: ...

    async def define_domain(self, uuid: str, xml: str) -> machines.DomainInfo: ...

    async def start_domain(self, uuid: str) -> bool: ...

    async def domain_addresses(self, uuid: str) -> machines.Discovery: ...

    async def pin_leased_addresses(self, uuid: str, allowed: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]: ...

    async def set_owner(self, uuid: str, owner: domain_owner.Owner, expected: domain_owner.Owner | None) -> None: ...

    async def eject_nocloud(self, uuid: str, iso_volume: str) -> list[str]: ...

    async def delete_nocloud(self, volumes: machines.MachineVolumes) -> bool: ...

    async def drop_ignition(self, uuid: str, volumes: machines.MachineVolumes) -> list[str]: ...

    async def delete_machine(self, uuid: str, machine_uid: str, volumes: machines.MachineVolumes,
                             namespace: str | None, name: str | None) -> list[str]: ...

    # The host's domains as the orphan collector sees them
    async def list_domains(self, pool: str) -> tuple[list[HostDomain], list[str]]: ...

    async def remove_orphan(self, orphan: HostDomain, paths: frozenset[str]) -> list[str]: ...

    # Base images imported from a URL
    async def find_image(self, pool: str, sha256: str) -> images.ImageVolume | None: ...

    async def import_image(self, pool: str, sha256: str, open_source: ImageOpener,
                           room_bytes: int | None) -> images.ImageVolume: ...


class LibvirtHost(connection.HostConnection):
    """A host reached over libvirt: each operation one call of a hypervisor module in the connection's pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.readings = probe.DomainXMLReadings()  # what the last probe read in the domains' XML

    async def probe(self, pool: str, management_cluster: str | None, pool_patterns: Sequence[str],
                    refresh_pools: bool) -> probe.HostProbe:
        return await self.call(probe.probe_host, pool, management_cluster, pool_patterns, refresh_pools,
                               self.readings, doing="probe host")

    async def machine_types(self, domain_type: str) -> frozenset[str]:
        return await self.call(machines.machine_types, domain_type, doing="read capabilities")

    async def cpu_models(self, model: str, domain_type: str, machine_type: str) -> machines.CPUModels:
        return await self.call(machines.cpu_models, model, domain_type, machine_type,
                               doing="read domain capabilities")

    async def segment_facts(self, segments: Sequence[Segment], own_uuid: str) -> dict[Segment, SegmentFacts]:
        return await self.call(networks.segment_facts, segments, own_uuid, doing="look up networks")

    async def ensure_filters(self) -> None:
        await self.call(traffic_filters.ensure_filters, doing="look up traffic filters")

    async def pool_path(self, pool: str) -> str:
        return await self.call(machines.pool_path, pool, doing="read pool path")

    async def ensure_overlay(self, volumes: machines.MachineVolumes, base_pool: str, base_volume: str,
                             disk_gib: int) -> machines.Overlay:
        return await self.call(machines.ensure_overlay, volumes, base_pool, base_volume, disk_gib,
                               doing="create overlay volume")

    async def ensure_data_disks(self, volumes: machines.MachineVolumes, sizes_gib: list[int]) -> list[str]:
        return await self.call(machines.ensure_data_disks, volumes, sizes_gib, doing="create data disk volumes")

    async def replace_nocloud(self, volumes: machines.MachineVolumes, iso: bytes) -> str:
        return await self.call(machines.replace_nocloud, volumes, iso, doing="upload NoCloud ISO")

    async def replace_ignition(self, volumes: machines.MachineVolumes, config: bytes) -> str:
        return await self.call(machines.replace_ignition, volumes, config, doing="upload Ignition config")

    async def ensure_serial_log(self, volumes: machines.MachineVolumes) -> str:
        return await self.call(machines.ensure_serial_log, volumes, doing="create serial log")

    async def read_serial_log(self, pool: str, log_volume: str, start: int, tail: int | None) -> serial_log.LogChunk:
        return await self.call(serial_log.read_serial_log, pool, log_volume, start, tail, doing="read serial log")

    async def domain_info(self, uuid: str) -> machines.DomainInfo | None:
        return await self.call(machines.domain_info, uuid, doing="look up domain")

    async def define_domain(self, uuid: str, xml: str) -> machines.DomainInfo:
        return await self.call(machines.define_domain, uuid, xml, doing="define domain")

    async def start_domain(self, uuid: str) -> bool:
        return await self.call(machines.start_domain, uuid, doing="start domain")

    async def domain_addresses(self, uuid: str) -> machines.Discovery:
        return await self.call(machines.domain_addresses, uuid, doing="read addresses")

    async def pin_leased_addresses(self, uuid: str, allowed: dict[str, tuple[str, ...]]) -> list[tuple[str, str]]:
        return await self.call(traffic_filters.pin_leased_addresses, uuid, allowed, doing="pin traffic filters")

    async def set_owner(self, uuid: str, owner: domain_owner.Owner, expected: domain_owner.Owner | None) -> None:
        await self.call(host_domains.set_owner, uuid, owner, expected, doing="set owner metadata")

    async def eject_nocloud(self, uuid: str, iso_volume: str) -> list[str]:
        return await self.call(machines.eject_nocloud, uuid, iso_volume, doing="eject NoCloud ISO")

    async def delete_nocloud(self, volumes: machines.MachineVolumes) -> bool:
        return await self.call(machines.delete_nocloud, volumes, doing="delete NoCloud ISO")

    async def drop_ignition(self, uuid: str, volumes: machines.MachineVolumes) -> list[str]:
        return await self.call(machines.drop_ignition, uuid, volumes, doing="remove Ignition config")

    async def delete_machine(self, uuid: str, machine_uid: str, volumes: machines.MachineVolumes,
                             namespace: str | None, name: str | None) -> list[str]:
        return await self.call(machines.delete_machine, uuid, machine_uid, volumes, namespace, name,
                               doing="delete machine")

    async def list_domains(self, pool: str) -> tuple[list[HostDomain], list[str]]:
        return await self.call(host_domains.list_domains, pool, doing="list domains")

    async def remove_orphan(self, orphan: HostDomain, paths: frozenset[str]) -> list[str]:
        return await self.call(host_domains.remove_orphan, orphan, paths, doing="remove orphan")

    async def find_image(self, pool: str, sha256: str) -> images.ImageVolume | None:
        return await self.call(images.find_image, pool, sha256, doing="look up image")

    async def import_image(self, pool: str, sha256: str, open_source: ImageOpener,
                           room_bytes: int | None) -> images.ImageVolume:
        return await self.call(images.import_image, pool, sha256, open_source, room_bytes, doing="import image",
                               transfer=True)


# How a registry makes a host from its name, URI and credentials (a LibvirtHost; the in-memory host in tests).
HostFactory = Callable[[str, str, "creds.Credentials | None", "connection.CallObserver | None"], Host]


def libvirt_host(name: str, uri: str, credentials: creds.Credentials | None,
                 observe: connection.CallObserver | None) -> Host:
    connection.ensure_libvirt_event_loop()
    return LibvirtHost(name, uri, credentials, observe)


class HostRegistry:
    """Every known host, in the order they were configured or added."""

    def __init__(self, hosts: dict[str, str], observe: connection.CallObserver | None = None,
                 factory: HostFactory = libvirt_host) -> None:
        self.observe = observe
        self._factory = factory
        self._hosts = {name: factory(name, uri, None, observe) for name, uri in hosts.items()}

    def names(self) -> list[str]:
        return list(self._hosts)

    def upsert(self, host: str, uri: str, credentials: creds.Credentials | None) -> Host | None:
        """Add a host or change how it is reached; returns a replaced host, which the caller closes off-loop."""
        current = self._hosts.get(host)
        if current is not None and current.uri == uri and current.credentials == credentials:
            return None
        self._hosts[host] = self._factory(host, uri, credentials, self.observe)
        return current

    def remove(self, host: str) -> Host | None:
        return self._hosts.pop(host, None)

    def get(self, host: str) -> Host:
        try:
            return self._hosts[host]
        except KeyError:
            raise errors.HostUnreachable("not a configured host", host) from None

    def close(self) -> None:
        for host in self._hosts.values():
            host.close()
