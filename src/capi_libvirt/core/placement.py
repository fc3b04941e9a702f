"""Placement: which host a new machine goes to. Pure: hosts and their load in, a decision (or why none) out.

A decommissioned host (LibvirtHost.spec.decommissioned) is never a candidate and never named in a refusal. Only
hosts whose access rules allow the machine (core.tenancy; the caller puts each host's refusal in its HostLoad) are
considered; a pinned host that refuses it is a TenantNotAllowed answer, checked before HostDecommissioned, health and
capacity. A pinned host is taken as it is (if in service, healthy and with room). Otherwise: healthy hosts in the
requested failure domain (control-plane machines only where the host allows them), with room after overcommit:
capacity x ratio minus what the provider's machines are allocated there (the caller counts machines placed a moment
ago) minus what the host's foreign VMs take (see `foreign_usage`), and whose free memory (as libvirt reports it) holds
the machine's whole memory on its own (see `fits`); spread so that a group (a MachineDeployment, the control plane) lands in the failure domain and on the host
where it has the fewest machines, then the most memory room; ties broken by name, so the same inputs always give the
same host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from capi_libvirt.core.domain_xml import Owner

# Machines being created on one host at once (overlay, ISO upload, define, start): a burst queues behind this instead
# of swamping the hypervisor, and stays within libvirtd's default of 5 requests in flight per client.
DEFAULT_CREATES_PER_HOST = 4


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


@dataclasses.dataclass(frozen=True)
class Placed:
    host: str
    failure_domain: str | None


@dataclasses.dataclass(frozen=True)
class NoHost:
    """No host fits: `reason` is a condition reason, `message` has the numbers."""

    reason: str
    message: str


HOST_NOT_FOUND = "HostNotFound"
HOST_UNREACHABLE = "HostUnreachable"
HOST_DECOMMISSIONED = "HostDecommissioned"
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
NO_HOST_IN_FAILURE_DOMAIN = "NoHostInFailureDomain"
TENANT_NOT_ALLOWED = "TenantNotAllowed"


def fits_free_memory(host: HostLoad, request: Request) -> bool:
    """The machine's whole memory fits in what the host has free right now (unknown: no check).

    A per-machine floor, not a budget: QEMU allocates guest memory lazily (and TCG guests touch little of it), so the
    free memory does not drop when a machine is placed, nor even when it starts; summing machines against it would
    count nothing. The budget is the overcommit accounting (`memory_room_mib`); this rule only keeps a machine off a
    host that could not give it its memory even if it were the only newcomer, whatever the ratio allows, which is
    what an overcommit above 1, or guests and processes the accounting does not see, would otherwise let through.
    """
    return host.available_memory_mib is None or request.memory_mib <= host.available_memory_mib


def fits(host: HostLoad, request: Request) -> bool:
    return host.cpu_room >= request.cpus and host.memory_room_mib >= request.memory_mib and \
        fits_free_memory(host, request)


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
    return text


def choose_host(request: Request, hosts: Sequence[HostLoad],
                group_per_host: Mapping[str, int] | None = None) -> Placed | NoHost:
    """The host for `request`; `group_per_host` counts machines of the request's group already on each host."""
    group_per_host = group_per_host or {}
    by_name = {host.name: host for host in hosts}
    wanted = f"{request.cpus} vCPU and {request.memory_mib} MiB"
    if request.pinned_host is not None:
        host = by_name.get(request.pinned_host)
        if host is None:
            return NoHost(HOST_NOT_FOUND, f"pinned host {request.pinned_host} is not in the inventory")
        if host.refusal is not None:  # first: a tenant learns nothing more of a host it may not use
            return NoHost(TENANT_NOT_ALLOWED, f"pinned host refuses this machine: {host.refusal}")
        if host.decommissioned:
            return NoHost(HOST_DECOMMISSIONED, f"pinned host {host.name} is decommissioned")
        if not host.healthy:
            return NoHost(HOST_UNREACHABLE, f"pinned host {host.name} is not reachable")
        if request.control_plane and not host.control_plane:
            return NoHost(HOST_NOT_FOUND, f"pinned host {host.name} does not take control-plane machines")
        if not fits(host, request):
            return NoHost(INSUFFICIENT_CAPACITY, f"pinned host cannot take {wanted}: {_shortfall(host, request)}")
        return Placed(host.name, host.failure_domain)

    in_service = [h for h in hosts if not h.decommissioned]  # a decommissioned host is out of placement entirely
    allowed = [h for h in in_service if h.refusal is None]
    if in_service and not allowed:
        return NoHost(TENANT_NOT_ALLOWED, "no host allows this machine: " + "; ".join(
            str(h.refusal) for h in sorted(in_service, key=lambda h: h.name)))
    candidates = [h for h in allowed if h.healthy and (h.control_plane or not request.control_plane)]
    if request.failure_domain is not None:
        candidates = [h for h in candidates if h.failure_domain == request.failure_domain]
        if not candidates:
            return NoHost(NO_HOST_IN_FAILURE_DOMAIN, f"no healthy host in failure domain {request.failure_domain}")
    if not candidates:
        return NoHost(HOST_UNREACHABLE, "no healthy host in the inventory")
    roomy = [h for h in candidates if fits(h, request)]
    if not roomy:
        return NoHost(INSUFFICIENT_CAPACITY,
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
            usage = dataclasses.replace(usage, machines=usage.machines + 1,
                                        allocated_cpus=usage.allocated_cpus + domain.vcpus,
                                        allocated_memory_mib=usage.allocated_memory_mib + domain.memory_mib)
        elif domain.active:
            usage = dataclasses.replace(usage, foreign_vms=usage.foreign_vms + 1,
                                        foreign_cpus=usage.foreign_cpus + domain.vcpus,
                                        foreign_memory_mib=usage.foreign_memory_mib + domain.memory_mib)
        else:
            usage = dataclasses.replace(usage, foreign_shut_off=usage.foreign_shut_off + 1)
    return usage
