"""The host inventory: every host the operator may place machines on, how it is reached, and what its last probe saw.

Hosts come from LibvirtHost objects (and, for development, from `--host name=uri`). A probe reads each host's size,
free memory, this provider's domains and the foreign ones (not this management cluster's: core.placement.is_foreign);
placement (core.placement) decides from those numbers plus what the LibvirtMachines recorded in the API say is
allocated, which counts machines placed a moment ago that have no domain yet.

A busy host is not a lost one. A host is unreachable when its connection is dead (a call failed in the transport,
libvirt's keepalive closed it, a reconnect was refused) or when a probe goes unanswered with no live connection to the
host at all (the only one being opened hangs); a host that was unreachable is back when a probe answers. A probe that is merely slow (not answered within PROBE_TIMEOUT_S while the connection
lives) leaves the host reachable with the last probe's figures, so placement goes on; it is reported as slow, and
it is awaited, not asked again, until it answers or PROBE_GIVE_UP_S pass (a daemon that answers keepalives but
nothing else: unreachable).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from capi_libvirt.api import v1alpha1, v1alpha1_host
from capi_libvirt.core import orphans, outage, placement, tenancy
from capi_libvirt.hypervisor import credentials, errors, probe
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.hypervisor.probe import HostProbe

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 20.0  # a probe unanswered by then is slow (the connection lives) or the host unreachable (none)
PROBE_GIVE_UP_S = 120.0  # a probe unanswered this long: unreachable, though the connection lives
PROBE_INTERVAL_S = 30.0  # the host prober's period (the operator's --host-probe-interval)
POOL_REFRESH_S = 300.0  # how often a probe refreshes the pools it reads (a refresh locks a pool while it reads)


@dataclasses.dataclass
class InventoryHost:
    name: str
    spec: v1alpha1_host.LibvirtHostSpec
    probe: probe.HostProbe | None = None
    reachable: bool = False
    problem: str | None = None  # why the last probe failed (safe text: no URI, no credentials)
    unreachable_since: float | None = None  # the inventory's clock at the first failed probe of this outage
    pools_refreshed_at: float | None = None  # the inventory's clock at the last probe that refreshed the pools
    probing: asyncio.Future[tuple[HostProbe, bool]] | None = None  # the probe sent and not read yet
    probing_since: float | None = None  # the inventory's clock when it was sent
    slow: bool = False  # the probe in flight outlasted PROBE_TIMEOUT_S while the connection lived


@dataclasses.dataclass
class OrphanRecord:
    """What the orphan collector (reconcile.orphans) knows of one host between rounds."""

    first_seen: dict[str, float] = dataclasses.field(default_factory=dict)  # orphan domain UUID -> monotonic time
    pending: int = 0  # orphans waiting for the grace period
    kept: int = 0  # of our scheme but not provably this management cluster's: reported, never removed
    stray_volumes: int = 0
    removed_domains: int = 0
    removed_volumes: int = 0
    published: dict[str, Any] | None = None  # the last status.orphans written


class Inventory:
    def __init__(self, registry: host_api.HostRegistry, clock: Callable[[], float] = time.monotonic,
                 management_cluster: str | None = None, probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.registry = registry
        self.clock = clock
        self.management_cluster = management_cluster  # tells this provider's domains from foreign ones in a probe
        self.probe_timeout_s = min(probe_timeout_s, PROBE_GIVE_UP_S)
        self.hosts: dict[str, InventoryHost] = {}
        self.orphans: dict[str, OrphanRecord] = {}
        self.static = set(registry.names())  # from --host: no LibvirtHost object to publish on
        self.conditions: dict[str, list[dict[str, Any]]] = {}  # last published on each LibvirtHost
        # The last status written on each LibvirtHost (but its lastProbeTime) and when (this clock): the same status
        # again is written only as a heartbeat (reconcile.hosts).
        self.published: dict[str, tuple[dict[str, Any], float]] = {}
        # Each LibvirtMachine's orphan claim, with the body it was read from (reconcile.orphans reads a body once).
        self.machine_claims: dict[tuple[str, str], tuple[Mapping[str, Any], orphans.MachineClaim]] = {}
        for name in registry.names():  # static hosts (--host): default spec, probed like the others
            # Not validated as an object's spec: a local URI may carry ?socket=, which LibvirtHost objects may not.
            # Unrestricted access: whoever runs the operator with --host (development) is the host's admin.
            self.hosts[name] = InventoryHost(name, v1alpha1_host.LibvirtHostSpec.model_construct(
                uri=registry.get(name).uri, access=tenancy.UNRESTRICTED))

    def upsert(self, name: str, spec: v1alpha1_host.LibvirtHostSpec,
               secret: credentials.Credentials | None) -> host_api.Host | None:
        """Add or update a host; returns a replaced connection for the caller to close off the event loop."""
        current = self.hosts.get(name)
        if current is None:  # a new object (or one made again): its status is written at once
            self.published.pop(name, None)
        replaced = self.registry.upsert(name, spec.uri, secret)
        same_connection = current is not None and replaced is None  # a probe in flight on it still counts
        self.hosts[name] = InventoryHost(name, spec, current.probe if current else None,
                                         current.reachable if current else False,
                                         unreachable_since=current.unreachable_since if current else None,
                                         probing=current.probing if current and same_connection else None,
                                         probing_since=current.probing_since if current and same_connection else None,
                                         slow=current.slow if current and same_connection else False)
        return replaced

    def remove(self, name: str) -> host_api.Host | None:
        self.hosts.pop(name, None)
        self.orphans.pop(name, None)
        self.published.pop(name, None)
        return self.registry.remove(name)

    async def probe(self, name: str) -> InventoryHost | None:
        """Probe one host (None when it left the inventory meanwhile), or wait again for the probe in flight. Only an
        unreachable host counts as down, a slow one as busy (see the module doc); a decommissioned one is not asked
        at all (it is gone: no connection attempts, no timeouts)."""
        host = self.hosts.get(name)
        if host is None:
            return None
        if host.spec.decommissioned:
            host.reachable, host.problem = False, "decommissioned: not probed"
            host.probing, host.probing_since, host.slow = None, None, False  # an answer on its way is not read
            return host
        connection = self.registry.get(name)
        if host.probing is None:
            refresh = host.pools_refreshed_at is None or self.clock() - host.pools_refreshed_at >= POOL_REFRESH_S
            host.probing, host.probing_since = asyncio.ensure_future(self._read(connection, host, refresh)), self.clock()
            host.probing.add_done_callback(_seen)  # a probe whose host left meanwhile ends unread, and unlogged
        probing = host.probing
        await asyncio.wait({probing}, timeout=self.probe_timeout_s)
        if not probing.done():
            self._overdue(host, connection.connected)
            return host
        if host.probing is probing:  # (another caller may have read it, and sent the next, meanwhile)
            host.probing, host.probing_since, host.slow = None, None, False
        if probing.cancelled():  # its connection was replaced under it: the next round asks the new one
            return host
        try:
            host.probe, refreshed = probing.result()
            host.reachable, host.problem, host.unreachable_since = True, None, None
            if refreshed:
                host.pools_refreshed_at = self.clock()
        except errors.HostUnreachable as error:
            self._down(host, error.message)
        except errors.HypervisorError as error:  # reachable, but the probe failed: keep the last numbers
            log.warning("probe of host %s failed: %s", name, error)
        return host

    async def _read(self, connection: host_api.Host, host: InventoryHost,
                    refresh: bool) -> tuple[HostProbe, bool]:
        spec = host.spec
        return await connection.probe(spec.storage_pool, self.management_cluster,
                                      tenancy.allowed_pools(spec.access, spec.storage_pool), refresh), refresh

    def _overdue(self, host: InventoryHost, connected: bool) -> None:
        """The probe in flight has not answered yet: busy while a connection lives, else (or at last) unreachable."""
        waited = self.clock() - (host.probing_since or self.clock())
        if not connected:
            host.slow = False
            self._down(host, f"no live connection, and no answer within {self.probe_timeout_s:.0f}s")
        elif waited >= PROBE_GIVE_UP_S:
            host.slow = False
            self._down(host, f"the probe has not answered in {PROBE_GIVE_UP_S:.0f}s, though the connection is "
                       "alive")
        elif host.unreachable_since is not None:  # down before: back when a probe answers, not when it connects
            host.slow = False
            self._down(host, f"connected again, but the probe has not answered within {self.probe_timeout_s:.0f}s")
        else:
            if not host.slow:
                log.warning("host %s: the probe has not answered in %.0fs, but the connection is alive: busy, not "
                            "lost; placement goes on with the last probe's figures", host.name, waited)
            host.slow = True

    def _down(self, host: InventoryHost, problem: str) -> None:
        host.reachable, host.problem = False, problem
        if host.unreachable_since is None:
            host.unreachable_since = self.clock()

    def state(self, name: str) -> outage.HostState:
        """What re-placement needs to know of a host: decommissioned, and how long the prober has found it
        unreachable. A host gone from the inventory counts as reachable: its calls fail on their own."""
        host = self.hosts.get(name)
        if host is None:
            return outage.HostState()
        since = host.unreachable_since
        return outage.HostState(decommissioned=host.spec.decommissioned,
                                unreachable_for=None if since is None else self.clock() - since)

    def refusal(self, name: str, namespace: str, spec: v1alpha1.LibvirtMachineSpec) -> tenancy.Refusal | None:
        """Why host `name` refuses a machine of `namespace` with `spec` (core.tenancy), or None."""
        host = self.hosts.get(name)
        if host is None:
            return None
        return tenancy.refusal(name, host.spec.access, host.spec.storage_pool, namespace, spec)

    def loads(self, claims: Mapping[str, placement.HostClaims], namespace: str | None = None,
              spec: v1alpha1.LibvirtMachineSpec | None = None) -> list[placement.HostLoad]:
        """Placement's view: capacity from the probe, what the machines placed on each host claim from the API, and
        each host's refusal of the machine (`namespace`, `spec`) by its access rules, and by its namespace's quota."""
        loads = []
        for host in self.hosts.values():
            refused = self.refusal(host.name, namespace, spec) if namespace is not None and spec is not None else None
            claim = claims.get(host.name) or placement.HostClaims()
            cpus, memory = claim.cpus, claim.memory_mib
            probe = host.probe
            over_quota = None
            if namespace is not None and spec is not None:
                over_quota = tenancy.quota_excess(host.name, host.spec.access, namespace,
                                                  claim.by_namespace.get(namespace, tenancy.Holding()),
                                                  machine_holding(spec))
            pools = None if probe is None else {
                pool.name: placement.PoolRoom(pool.usable_bytes, claim.pool_bytes.get(pool.name, 0),
                                              pool.other_bytes, host.spec.overcommit.storage_ratio(pool.name))
                for pool in probe.pools}
            loads.append(placement.HostLoad(
                name=host.name,
                healthy=host.reachable and host.probe is not None and not host.spec.unschedulable,
                cpus=host.probe.cpus if host.probe else 0,
                memory_mib=host.probe.memory_mib if host.probe else 0,
                allocated_cpus=cpus, allocated_memory_mib=memory,
                cpu_overcommit=host.spec.overcommit.cpu, memory_overcommit=host.spec.overcommit.memory,
                failure_domain=host.spec.failure_domain, control_plane=host.spec.control_plane,
                decommissioned=host.spec.decommissioned,
                refusal=str(refused) if refused is not None else None,
                foreign_vms=probe.foreign_vms if probe else 0, foreign_cpus=probe.foreign_cpus if probe else 0,
                foreign_memory_mib=probe.foreign_memory_mib if probe else 0,
                available_memory_mib=probe.available_memory_mib if probe else None,
                pools=pools, over_quota=over_quota))
        return loads

    def pool_room(self, name: str, pool: str, claim: placement.HostClaims | None) -> int | None:
        """What placement may still promise in `pool` on host `name`, given what the machines placed there claim
        (`claim`); None when the last probe did not see the pool."""
        host = self.hosts.get(name)
        usage = next((u for u in host.probe.pools if u.name == pool), None) if host and host.probe else None
        if host is None or usage is None:
            return None
        claimed = (claim or placement.HostClaims()).pool_bytes.get(pool, 0)
        return int(placement.PoolRoom(usage.usable_bytes, claimed, usage.other_bytes,
                                      host.spec.overcommit.storage_ratio(pool)).room_bytes)

    def failure_domains(self) -> list[dict[str, Any]]:
        """LibvirtCluster.status.failureDomains: one per failure domain of the inventory."""
        domains: dict[str, bool] = {}
        for host in self.hosts.values():
            if host.spec.failure_domain:
                domains[host.spec.failure_domain] = domains.get(host.spec.failure_domain, False) or host.spec.control_plane
        return [{"name": name, "controlPlane": control_plane} for name, control_plane in sorted(domains.items())]


def _seen(probing: asyncio.Future[tuple[HostProbe, bool]]) -> None:
    """Mark the probe's error as retrieved: whoever waits for it reads it; nobody must log it."""
    if not probing.cancelled():
        probing.exception()


def machine_holding(spec: v1alpha1.LibvirtMachineSpec) -> tenancy.Holding:
    """What one machine adds to its namespace's holding on a host (its disks at full size)."""
    return tenancy.Holding(1, spec.cpus, spec.memory_mib, spec.disk_gib + sum(d.size_gib for d in spec.data_disks))


MAX_POOLS_SHOWN = 64  # LibvirtHostStatus.pools' bound; placement counts every pool


def pools_status(host: InventoryHost) -> list[dict[str, Any]]:
    """LibvirtHost.status.pools: each active pool machines may use (the first MAX_POOLS_SHOWN by name), as the probe
    saw it, with its room."""
    assert host.probe is not None
    ratio = host.spec.overcommit.storage_ratio
    return [{"name": pool.name, "capacityBytes": pool.capacity_bytes, "allocationBytes": pool.allocation_bytes,
             "availableBytes": pool.available_bytes, "machineDisksBytes": pool.machine_disks_bytes,
             "otherBytes": pool.other_bytes, "overcommit": ratio(pool.name),
             "roomBytes": int(placement.PoolRoom(pool.usable_bytes, pool.machine_disks_bytes, pool.other_bytes,
                                                 ratio(pool.name)).room_bytes)}
            for pool in sorted(host.probe.pools, key=lambda pool: pool.name)[:MAX_POOLS_SHOWN]]


def host_status(host: InventoryHost, now: str) -> dict[str, Any]:
    """LibvirtHost.status from the last probe: with the numbers placement uses besides the LibvirtMachines (free
    memory, what foreign VMs take)."""
    # Unreachable: the numbers are cleared (null in a merge patch), not left stale.
    status: dict[str, Any] = {"reachable": host.reachable, "lastProbeTime": now, "libvirtVersion": None,
                    "hypervisorVersion": None, "cpus": None, "memoryMiB": None, "freeMemoryMiB": None,
                    "machines": None, "allocatedCPUs": None, "allocatedMemoryMiB": None, "pool": None,
                    "availableMemoryMiB": None, "foreignVMs": None, "foreignCPUs": None, "foreignMemoryMiB": None,
                    "foreignVMsShutOff": None, "pools": None}
    if host.probe is not None and host.reachable:
        p = host.probe
        status.update(libvirtVersion=p.libvirt_version, hypervisorVersion=p.hypervisor_version, cpus=p.cpus,
                      memoryMiB=p.memory_mib, freeMemoryMiB=p.free_memory_mib, machines=p.machines,
                      allocatedCPUs=p.allocated_cpus, allocatedMemoryMiB=p.allocated_memory_mib,
                      availableMemoryMiB=p.available_memory_mib, foreignVMs=p.foreign_vms, foreignCPUs=p.foreign_cpus,
                      foreignMemoryMiB=p.foreign_memory_mib, foreignVMsShutOff=p.foreign_shut_off,
                      pool={k: v for k, v in {"name": host.spec.storage_pool, "capacityBytes": p.pool_capacity_bytes,
                                              "availableBytes": p.pool_available_bytes}.items() if v is not None},
                      pools=pools_status(host))
    return status
