"""Placement: which host a new machine goes to. Pure: hosts and their load in, a decision (or why none) out.

A decommissioned host (LibvirtHost.spec.decommissioned) is never a candidate and never named in a refusal. Only
hosts whose access rules allow the machine (core.tenancy; the caller puts each host's refusal in its HostLoad) are
considered; a pinned host that refuses it is a TenantNotAllowed answer, checked before HostDecommissioned, health and
capacity. A pinned host is taken as it is (if in service, healthy and with room). Otherwise: healthy hosts in the
requested failure domain (control-plane machines only where the host allows them), with room after overcommit:
capacity x ratio minus what the provider's machines are allocated there (the caller counts machines placed a moment
ago) minus what the host's foreign VMs take (see `foreign_usage`), and whose free memory (as libvirt reports it) holds
the machine's whole memory on its own, and whose pool has room for the machine's disks (see `fits`, `PoolRoom`), within
the machine's namespace's quota there (core.tenancy.quota_excess: a host over it is a QuotaExceeded answer when no
other host is left); spread so that a group (a MachineDeployment, the control plane) lands in the failure domain and on the host
where it has the fewest machines, then the most memory room; ties broken by name, so the same inputs always give the
same host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from capi_libvirt.api import reasons
from capi_libvirt.core.domain_owner import Owner
from capi_libvirt.core.tenancy import Holding

# Machines being created on one host at once (overlay, ISO upload, define, start): a burst queues behind this instead
# of swamping the hypervisor, and stays within libvirtd's default of 5 requests in flight per client.
DEFAULT_CREATES_PER_HOST = 4


GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class PoolRoom:
    """One storage pool of a host as placement sees it. Disk is counted like memory: what the provider's machines on
    the host were promised there (their root and data disks at full size, thin or not, from the API, so machines placed
    a moment ago count) plus what everything else in the pool takes now, against its capacity x the overcommit."""

    capacity_bytes: int  # what the pool can hold (PoolUsage.usable_bytes)
    claimed_bytes: int = 0  # root and data disks of the machines placed on the host in this pool
    other_bytes: int = 0  # what the pool holds besides this management cluster's machine volumes (core: PoolUsage)
    overcommit: float = 1.0

    @property
    def room_bytes(self) -> float:
        return self.capacity_bytes * self.overcommit - self.claimed_bytes - self.other_bytes


@dataclasses.dataclass(frozen=True)
class PoolUsage:
    """What a probe reads of one active pool: its numbers, and the full size and the allocation of the volumes this
    management cluster's domains use (their disks and ISOs)."""

    name: str
    capacity_bytes: int
    allocation_bytes: int
    available_bytes: int
    machine_disks_bytes: int = 0
    machine_allocation_bytes: int = 0

    @property
    def usable_bytes(self) -> int:
        """What the pool can hold: its capacity, or what it holds plus what is free when that is less (a file system
        that reserves blocks for root reports them in its capacity but never as free)."""
        return min(self.capacity_bytes, self.allocation_bytes + self.available_bytes)

    @property
    def other_bytes(self) -> int:
        """What the pool holds besides the machines' volumes (base images, other tools' volumes, and for a folder
        pool whatever else fills its file system)."""
        return max(self.allocation_bytes - self.machine_allocation_bytes, 0)


@dataclasses.dataclass(frozen=True)
class HostLoad:
    """One host as placement sees it."""

    name: str
    healthy: bool
    cpus: int  # the host's CPUs
    memory_mib: int  # the host's memory
    allocated_cpus: int = 0  # vCPUs of the provider's domains on it, plus machines being placed there
    allocated_memory_mib: int = 0
    cpu_overcommit: float = 4.0  # vCPUs allowed per CPU
    memory_overcommit: float = 1.0  # guest memory allowed per MiB of host memory
    failure_domain: str | None = None
    control_plane: bool = True  # control-plane machines may go here
    decommissioned: bool = False  # gone for good (LibvirtHost.spec.decommissioned): never a candidate
    refusal: str | None = None  # why the host's access rules refuse this machine (core.tenancy), or None
    foreign_vms: int = 0  # running domains on the host that are not this provider's (see foreign_usage)
    foreign_cpus: int = 0  # their vCPUs
    foreign_memory_mib: int = 0  # their memory
    available_memory_mib: int | None = None  # free memory libvirt reports (free + buffers + cached); None: unknown
    pools: Mapping[str, PoolRoom] | None = None  # the active pools machines may use; None: storage not counted
    over_quota: str | None = None  # why the machine would put its namespace over its quota here (core.tenancy)

    @property
    def cpu_room(self) -> float:
        return self.cpus * self.cpu_overcommit - self.allocated_cpus - self.foreign_cpus

    @property
    def memory_room_mib(self) -> float:
        return self.memory_mib * self.memory_overcommit - self.allocated_memory_mib - self.foreign_memory_mib


@dataclasses.dataclass(frozen=True)
class Request:
    cpus: int
    memory_mib: int
    pinned_host: str | None = None
    failure_domain: str | None = None
    control_plane: bool = False  # the machine is a control-plane machine
    pool: str | None = None  # the pool its disks go to
    disk_bytes: int = 0  # its root and data disks at full size


@dataclasses.dataclass(frozen=True)
class Placed:
    host: str
    failure_domain: str | None


@dataclasses.dataclass(frozen=True)
class NoHost:
    """No host fits: `reason` is a condition reason, `message` has the numbers."""

    reason: str
    message: str


def fits_free_memory(host: HostLoad, request: Request) -> bool:
    """The machine's whole memory fits in what the host has free right now (unknown: no check).

    A per-machine floor, not a budget: QEMU allocates guest memory lazily (and TCG guests touch little of it), so the
    free memory does not drop when a machine is placed, nor even when it starts; summing machines against it would
    count nothing. The budget is the overcommit accounting (`memory_room_mib`); this rule only keeps a machine off a
    host that could not give it its memory even if it were the only newcomer, whatever the ratio allows, which is
    what an overcommit above 1, or guests and processes the accounting does not see, would otherwise let through.
    """
    return host.available_memory_mib is None or request.memory_mib <= host.available_memory_mib


def lacks_pool(host: HostLoad, request: Request) -> bool:
    """The host's probe saw no active pool of the machine's (unknown pools: not counted, so not lacking)."""
    return request.pool is not None and host.pools is not None and request.pool not in host.pools


def fits_storage(host: HostLoad, request: Request) -> bool:
    """The machine's disks fit in the room of its pool on the host (a pool the host does not have active: never)."""
    if request.pool is None or host.pools is None:
        return True
    pool = host.pools.get(request.pool)
    return pool is not None and pool.room_bytes >= request.disk_bytes


def fits(host: HostLoad, request: Request) -> bool:
    return host.cpu_room >= request.cpus and host.memory_room_mib >= request.memory_mib and \
        fits_free_memory(host, request) and fits_storage(host, request)


def gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _shortfall(host: HostLoad, request: Request) -> str:
    """Why `host` cannot take `request`, with the numbers placement used."""
    text = f"{host.name}: {max(host.cpu_room, 0):g} vCPU and {max(host.memory_room_mib, 0):g} MiB free"
    if host.foreign_vms:
        text += (f" after {_plural(host.foreign_vms, 'foreign VM')} ({host.foreign_memory_mib} MiB, "
                 f"{_plural(host.foreign_cpus, 'vCPU')})")
    text += f" (overcommit cpu {host.cpu_overcommit:g}, memory {host.memory_overcommit:g})"
    if not fits_free_memory(host, request):
        text += f", but the host has only {host.available_memory_mib} MiB of memory free"
    if request.pool is not None and host.pools is not None:
        pool = host.pools.get(request.pool)
        if pool is None:
            text += f"; it has no active storage pool {request.pool}"
        else:
            text += (f"; pool {request.pool}: {gib(max(pool.room_bytes, 0))} left of {gib(pool.capacity_bytes)} x "
                     f"{pool.overcommit:g} (machine disks {gib(pool.claimed_bytes)}, other volumes "
                     f"{gib(pool.other_bytes)})")
    return text


def _wanted(request: Request) -> str:
    text = f"{request.cpus} vCPU and {request.memory_mib} MiB"
    if request.pool is not None:
        text += f" and {gib(request.disk_bytes)} of disk in pool {request.pool}"
    return text


def choose_host(request: Request, hosts: Sequence[HostLoad],
                group_per_host: Mapping[str, int] | None = None) -> Placed | NoHost:
    """The host for `request`; `group_per_host` counts machines of the request's group already on each host."""
    group_per_host = group_per_host or {}
    by_name = {host.name: host for host in hosts}
    wanted = _wanted(request)
    if request.pinned_host is not None:
        host = by_name.get(request.pinned_host)
        if host is None:
            return NoHost(reasons.HOST_NOT_FOUND, f"pinned host {request.pinned_host} is not in the inventory")
        if host.refusal is not None:  # first: a tenant learns nothing more of a host it may not use
            return NoHost(reasons.TENANT_NOT_ALLOWED, f"pinned host refuses this machine: {host.refusal}")
        if host.decommissioned:
            return NoHost(reasons.HOST_DECOMMISSIONED, f"pinned host {host.name} is decommissioned")
        if not host.healthy:
            return NoHost(reasons.HOST_UNREACHABLE, f"pinned host {host.name} is not reachable")
        if request.control_plane and not host.control_plane:
            return NoHost(reasons.HOST_NOT_FOUND, f"pinned host {host.name} does not take control-plane machines")
        if host.over_quota is not None:
            return NoHost(reasons.QUOTA_EXCEEDED, host.over_quota)
        if lacks_pool(host, request):
            return NoHost(reasons.POOL_NOT_FOUND, f"pinned host {host.name} has no active storage pool {request.pool}")
        if not fits(host, request):
            return NoHost(reasons.INSUFFICIENT_CAPACITY, f"pinned host cannot take {wanted}: {_shortfall(host, request)}")
        return Placed(host.name, host.failure_domain)

    in_service = [h for h in hosts if not h.decommissioned]  # a decommissioned host is out of placement entirely
    allowed = [h for h in in_service if h.refusal is None]
    if in_service and not allowed:
        return NoHost(reasons.TENANT_NOT_ALLOWED, "no host allows this machine: " + "; ".join(
            str(h.refusal) for h in sorted(in_service, key=lambda h: h.name)))
    candidates = [h for h in allowed if h.healthy and (h.control_plane or not request.control_plane)]
    if request.failure_domain is not None:
        candidates = [h for h in candidates if h.failure_domain == request.failure_domain]
        if not candidates:
            return NoHost(reasons.NO_HOST_IN_FAILURE_DOMAIN, f"no healthy host in failure domain {request.failure_domain}")
    if not candidates:
        return NoHost(reasons.HOST_UNREACHABLE, "no healthy host in the inventory")
    within_quota = [h for h in candidates if h.over_quota is None]
    if not within_quota:
        return NoHost(reasons.QUOTA_EXCEEDED, "; ".join(str(h.over_quota) for h in sorted(candidates, key=lambda h: h.name)))
    candidates = within_quota
    if all(lacks_pool(h, request) for h in candidates):
        return NoHost(reasons.POOL_NOT_FOUND, f"no host has an active storage pool {request.pool}: " + ", ".join(
            sorted(h.name for h in candidates)))
    roomy = [h for h in candidates if fits(h, request)]
    if not roomy:
        return NoHost(reasons.INSUFFICIENT_CAPACITY,
                      f"no host can take {wanted}: " + "; ".join(_shortfall(h, request) for h in candidates))

    group_per_domain: dict[str | None, int] = {}
    for host in hosts:
        group_per_domain[host.failure_domain] = group_per_domain.get(host.failure_domain, 0) + \
            group_per_host.get(host.name, 0)
    best = min(roomy, key=lambda h: (group_per_domain.get(h.failure_domain, 0), group_per_host.get(h.name, 0),
                                     -h.memory_room_mib, h.name))
    return Placed(best.name, best.failure_domain)


@dataclasses.dataclass(frozen=True)
class DomainUsage:
    """One domain of a host as the probe reads it: its owner metadata (None: none of ours), whether it runs (any
    state but shut off: a paused or suspended domain keeps its memory), and its memory and vCPUs."""

    owner: Owner | None
    active: bool
    memory_mib: int
    vcpus: int
    disk_paths: frozenset[str] = frozenset()  # its disks' and CD-ROMs' source files
    running: bool = True  # running, not paused, crashed or shut off: what a provisioned machine's pass keeps so


@dataclasses.dataclass(frozen=True)
class HostUsage:
    """What the domains of a host take: this provider's (every state) and the foreign ones."""

    machines: int = 0  # this provider's domains, running or not
    allocated_cpus: int = 0
    allocated_memory_mib: int = 0
    foreign_vms: int = 0  # foreign domains that run: they count against the host's capacity
    foreign_cpus: int = 0
    foreign_memory_mib: int = 0
    foreign_shut_off: int = 0  # foreign domains defined but shut off: reported, not counted
    volume_paths: frozenset[str] = frozenset()  # the files this provider's domains use (disks, CD-ROMs)
    # This provider's domains by their machine (namespace, name, UID) and whether each runs: a machine whose entry
    # changes between two probes (its domain stopped, paused, came back, or is gone) is looked at again at once.
    machine_domains: frozenset[tuple[str, str, str, bool]] = frozenset()


def is_foreign(owner: Owner | None, management_cluster: str | None) -> bool:
    """Not this provider's: no owner metadata of ours, or metadata naming another management cluster.

    Owner metadata that names no management cluster counts as ours: written by a release before management cluster
    identities, by an operator that could not read its identity, or released by a clusterctl move for the target to
    adopt; in each case a LibvirtMachine counts it already (placement counts machines from the API), so counting it
    as foreign too would count it twice."""
    if owner is None:
        return True
    return owner.management_cluster is not None and owner.management_cluster != management_cluster


def host_usage(domains: Iterable[DomainUsage], management_cluster: str | None) -> HostUsage:
    """Sum a host's domains into this provider's allocation and the foreign load.

    A foreign domain counts only while it runs: a shut-off one takes no memory and no CPU now, and counting it would
    keep capacity free for VMs that may never start again (a host with a few stale definitions would be full
    forever). When one does start, it shows up at the next probe, and the free-memory rule holds meanwhile."""
    usage = HostUsage()
    for domain in domains:
        if not is_foreign(domain.owner, management_cluster):
            owner = domain.owner
            seen = frozenset() if owner is None else {(owner.namespace, owner.name, owner.uid, domain.running)}
            usage = dataclasses.replace(usage, machines=usage.machines + 1,
                                        allocated_cpus=usage.allocated_cpus + domain.vcpus,
                                        allocated_memory_mib=usage.allocated_memory_mib + domain.memory_mib,
                                        volume_paths=usage.volume_paths | domain.disk_paths,
                                        machine_domains=usage.machine_domains | seen)
        elif domain.active:
            usage = dataclasses.replace(usage, foreign_vms=usage.foreign_vms + 1,
                                        foreign_cpus=usage.foreign_cpus + domain.vcpus,
                                        foreign_memory_mib=usage.foreign_memory_mib + domain.memory_mib)
        else:
            usage = dataclasses.replace(usage, foreign_shut_off=usage.foreign_shut_off + 1)
    return usage


def disk_bytes(spec: Mapping[str, Any]) -> int:
    """A machine's root and data disks at full size, from its spec as the API holds it (defaults filled in)."""
    gibs = int(spec.get("diskGiB", 0)) + sum(int(disk.get("sizeGiB", 0)) for disk in spec.get("dataDisks") or [])
    return gibs * GIB


@dataclasses.dataclass(frozen=True)
class Claim:
    """What one placed machine claims on its host, from its spec as the API holds it (defaults filled in)."""

    namespace: str
    cpus: int
    memory_mib: int
    pool: str
    disk_bytes: int

    @classmethod
    def of(cls, namespace: str, spec: Mapping[str, Any]) -> Claim:
        return cls(namespace, int(spec.get("cpus", 0)), int(spec.get("memoryMiB", 0)), str(spec.get("storagePool", "")),
                   disk_bytes(spec))


@dataclasses.dataclass
class HostClaims:
    """What the LibvirtMachines placed on one host claim there, from their specs: vCPUs, memory, and each pool's
    disk; and what they hold there per namespace (for the quotas)."""

    cpus: int = 0
    memory_mib: int = 0
    pool_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    by_namespace: dict[str, Holding] = dataclasses.field(default_factory=dict)

    def add(self, claim: Claim, sign: int = 1) -> None:
        """Count one machine's claim in (sign 1) or out (sign -1)."""
        self.cpus += sign * claim.cpus
        self.memory_mib += sign * claim.memory_mib
        self.pool_bytes[claim.pool] = self.pool_bytes.get(claim.pool, 0) + sign * claim.disk_bytes
        held = self.by_namespace.get(claim.namespace, Holding()) + \
            Holding(sign, sign * claim.cpus, sign * claim.memory_mib, sign * (claim.disk_bytes // GIB))
        if held.machines:
            self.by_namespace[claim.namespace] = held
        else:  # the namespace's last machine here counted out
            self.by_namespace.pop(claim.namespace, None)

    def without(self, claim: Claim) -> HostClaims:
        """A copy with one machine's claim counted out."""
        copy = HostClaims(self.cpus, self.memory_mib, dict(self.pool_bytes), dict(self.by_namespace))
        copy.add(claim, -1)
        return copy


def claims_by_host(machines: Iterable[tuple[str, str, Mapping[str, Any]]]) -> dict[str, HostClaims]:
    """Tally (host, namespace, spec) of every placed machine into each host's claims."""
    claims: dict[str, HostClaims] = {}
    for host, namespace, spec in machines:
        claims.setdefault(host, HostClaims()).add(Claim.of(namespace, spec))
    return claims
