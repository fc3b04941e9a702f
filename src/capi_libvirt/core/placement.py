"""Placement: which host a new machine goes to. Pure: hosts and their load in, a decision (or why none) out.

A decommissioned host (LibvirtHost.spec.decommissioned) is never a candidate and never named in a refusal. Only
hosts whose access rules allow the machine (core.tenancy; the caller puts each host's refusal in its HostLoad) are
considered; a pinned host that refuses it is a TenantNotAllowed answer, checked before HostDecommissioned, health and
capacity. A pinned host is taken as it is (if in service, healthy and with room). Otherwise: healthy hosts in the
requested failure domain (control-plane machines only where the host allows them), with room after overcommit:
capacity x ratio minus what the provider's machines are allocated there (the caller counts machines placed a moment
ago), spread so that a group (a MachineDeployment, the control plane) lands in the failure domain and on the host
where it has the fewest machines, then the most memory room; ties broken by name, so the same inputs always give the
same host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

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

    @property
    def cpu_room(self) -> float:
        return self.cpus * self.cpu_overcommit - self.allocated_cpus

    @property
    def memory_room_mib(self) -> float:
        return self.memory_mib * self.memory_overcommit - self.allocated_memory_mib


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


def fits(host: HostLoad, request: Request) -> bool:
    return host.cpu_room >= request.cpus and host.memory_room_mib >= request.memory_mib


def _shortfall(host: HostLoad, request: Request) -> str:
    return (f"{host.name}: {max(host.cpu_room, 0):g} vCPU and {max(host.memory_room_mib, 0):g} MiB free "
            f"(overcommit cpu {host.cpu_overcommit:g}, memory {host.memory_overcommit:g})")


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
