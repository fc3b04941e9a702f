"""The v1alpha1 LibvirtHost kind: a hypervisor the provider may place machines on, what its admin lets tenants use of
it (access rules, quotas, address grants, overcommit), and what the operator last read of it (pools, orphans).

Field docstrings become the CRD's descriptions, bounds and patterns its validation, as in capi_libvirt.api.v1alpha1
(whose patterns and types it shares).
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic

from capi_libvirt.api import meta
from capi_libvirt.api.v1alpha1 import IMAGE_URL_PREFIX, LIBVIRT_NAME, Cidr


class SecretReference(meta.Model):
    """A Secret in a namespace."""

    name: str = pydantic.Field(min_length=1, max_length=253, pattern=meta.DNS_SUBDOMAIN)
    """Name of the Secret."""
    namespace: str = pydantic.Field(min_length=1, max_length=63, pattern=meta.DNS_LABEL)
    """Namespace of the Secret."""


class Overcommit(meta.Model):
    """How much of a host's CPUs and memory the provider may hand out to guests."""

    cpu: float = pydantic.Field(default=4.0, gt=0, le=64)
    """vCPUs per host CPU."""
    memory: float = pydantic.Field(default=1.0, gt=0, le=4)
    """Guest memory per unit of host memory (above 1 relies on ballooning or unused guest memory)."""
    storage: float = pydantic.Field(default=1.0, gt=0, le=64)
    """Machine disk per unit of storage pool capacity, in every pool not listed in storagePools. Disks count at
    their full size (root and data disks, thin or not): 1.0 never promises more than a pool holds; above 1, guests
    pause when a pool fills up."""
    storage_pools: dict[Annotated[str, pydantic.Field(max_length=255)], Annotated[float, pydantic.Field(gt=0, le=64)]] \
        = pydantic.Field(default={}, max_length=64)
    """The storage ratio of individual pools (pool name: ratio), overriding `storage`."""

    def storage_ratio(self, pool: str) -> float:
        return self.storage_pools.get(pool, self.storage)


NAME_PATTERN = r"^[A-Za-z0-9*?\[\]][A-Za-z0-9_.+*?\[\]-]*$"  # a libvirt name, or a shell-style pattern of names
HOST_PATH_PREFIX = r"^/([^/]+/)*$"  # an absolute folder, ending in /

Patterns = Annotated[list[Annotated[str, pydantic.Field(min_length=1, max_length=255, pattern=NAME_PATTERN)]],
                     pydantic.Field(max_length=64)]


class AddressGrant(meta.Model):
    """Addresses the machines of some namespaces may send from besides their own (interfaces[].allowedAddresses)."""

    namespaces: Annotated[Patterns, pydantic.Field(min_length=1)]
    """Namespaces (or shell-style patterns) granted the ranges."""
    cidrs: list[Cidr] = pydantic.Field(min_length=1, max_length=16)
    """Address ranges (a virtual IP: 192.168.122.250/32)."""


class NamespaceQuota(meta.Model):
    """What one namespace may hold on the host: every namespace matching `namespaces` has these limits of its own
    (the first quota listing a namespace applies to it). Counted from the LibvirtMachines placed on the host,
    including those being deleted, which still hold their share until they are gone. Unset: no limit."""

    namespaces: Annotated[Patterns, pydantic.Field(min_length=1)]
    """Namespaces (or shell-style patterns) this quota applies to, each on its own."""
    machines: int | None = pydantic.Field(default=None, ge=0)
    """Machines."""
    cpus: int | None = pydantic.Field(default=None, ge=0)
    """vCPUs."""
    memory_mib: int | None = pydantic.Field(default=None, alias="memoryMiB", ge=0)
    """Memory in MiB."""
    disk_gib: int | None = pydantic.Field(default=None, alias="diskGiB", ge=0)
    """Disk in GiB: root and data disks at their full size."""


class HostAccess(meta.Model):
    """What tenants (whoever may create LibvirtMachines in a namespace) may use of this host. Checked before the host
    is touched; anything else ends in a TenantNotAllowed condition. Names may be shell-style patterns (`team-*`)."""

    namespaces: Patterns | None = None
    """Namespaces whose machines may use the host; every namespace when unset."""
    storage_pools: Patterns | None = None
    """Pools machines may put their disks in and take base images from; only the host's storagePool when unset."""
    networks: Patterns = ["default"]
    """libvirt networks machines may attach to (NAT networks libvirt runs)."""
    bridges: Patterns = []
    """Host bridges machines may attach to (a bridge puts the guest on the host's LAN); none by default."""
    images: Patterns = []
    """Base image volumes (in an allowed pool) machines may boot from; none by default (pools hold other disks).
    Machine volumes the provider made (overlays, NoCloud ISOs, serial logs) are never allowed."""
    host_paths: list[Annotated[str, pydantic.Field(min_length=2, max_length=4096, pattern=HOST_PATH_PREFIX)]] = \
        pydantic.Field(default=[], max_length=16)
    """Folders (absolute, ending in /) whose files may be a kernelBoot kernel or initrd; none by default."""
    image_url_prefixes: list[Annotated[str, pydantic.Field(min_length=9, max_length=2048, pattern=IMAGE_URL_PREFIX)]] \
        = pydantic.Field(default=[], max_length=16, alias="imageURLPrefixes")
    """URL prefixes (`https://images.example.com/capi/`: scheme, host and a path, best ending in /) machines may
    import base images from (image.url); none by default, so tenants cannot make the operator fetch arbitrary URLs
    onto the host. A redirect must stay under a listed prefix too. Compared as written: URLs with `.` or `..` path
    segments (also percent-encoded) or backslashes are never under a prefix."""
    allowed_addresses: list[AddressGrant] = pydantic.Field(default=[], max_length=32)
    """Addresses machines may send from besides their own (a control-plane virtual IP), per namespace; none by
    default. Every NIC carries an anti-spoofing filter: a machine's interfaces[].allowedAddresses outside what its
    namespace is granted here are refused (TenantNotAllowed)."""
    quotas: list[NamespaceQuota] = pydantic.Field(default=[], max_length=32)
    """Limits on what one namespace may hold on this host (machines, vCPUs, memory, disk); a machine over its
    namespace's quota waits with QuotaExceeded naming the quota and the usage, and goes on when room is freed."""


class LibvirtHostSpec(meta.Model):
    """A KVM/libvirt hypervisor machines can be placed on, and how to reach it."""

    uri: str = pydantic.Field(min_length=3, max_length=2048, pattern=r"^qemu(\+(unix|ssh|libssh|tls))?://[^?]*$")
    """libvirt URI, without query parameters (the operator adds its own): qemu+ssh://user@host/system,
    qemu+libssh://user@host/system, qemu+tls://host/system, or qemu:///system on the operator's own host.
    Immutable: machines on the host are identified by its name, so another hypervisor needs another LibvirtHost."""
    credentials_secret_ref: SecretReference | None = None
    """Secret with the transport's credentials: for qemu+ssh `ssh-privatekey` and `known_hosts`; for qemu+tls
    `ca.crt`, `tls.crt` and `tls.key`. Written to private files only while connecting, then removed."""
    access: HostAccess = HostAccess()
    """Which namespaces may use the host, and which of its pools, networks, bridges, images, image URLs and files."""
    failure_domain: str | None = pydantic.Field(default=None, min_length=1, max_length=256)
    """Failure domain of the host (a rack, a room); machines of one group are spread over failure domains."""
    control_plane: bool = True
    """Whether control-plane machines may be placed here."""
    overcommit: Overcommit = Overcommit()
    """CPU and memory overcommit ratios placement applies."""
    storage_pool: str = pydantic.Field(default="default", min_length=1, max_length=255, pattern=LIBVIRT_NAME)
    """Storage pool whose capacity the health probe reports."""
    unschedulable: bool = False
    """Place no new machines here (existing ones stay)."""
    decommissioned: bool = False
    """The host is gone for good (lost, or retired without draining): the operator stops talking to it, places
    nothing here, moves machines that never had a domain here to another host, and releases the finalizers of
    machines being deleted with a Warning event naming what may remain on the host. Machines whose domain may be
    here are not moved: they report HostDecommissioned until they are deleted (a MachineHealthCheck replaces them)."""


class PoolStatus(meta.Model):
    name: str
    """Pool name."""
    capacity_bytes: int | None = pydantic.Field(default=None, ge=0)
    """Pool capacity."""
    available_bytes: int | None = pydantic.Field(default=None, ge=0)
    """Free space in the pool."""


class PoolUsage(meta.Model):
    """One storage pool machines may use on the host (the host's access rules allow it), as placement counts it."""

    name: str = pydantic.Field(max_length=255)
    """Pool name."""
    capacity_bytes: int = pydantic.Field(ge=0)
    """Pool capacity."""
    allocation_bytes: int = pydantic.Field(ge=0)
    """What the pool's volumes (and, for a folder pool, its file system) take now."""
    available_bytes: int = pydantic.Field(ge=0)
    """Free space in the pool now."""
    machine_disks_bytes: int = pydantic.Field(ge=0)
    """The full size of this provider's machine volumes in the pool (root and data disks, NoCloud ISOs), thin or
    not: what has been promised to machines."""
    other_bytes: int = pydantic.Field(ge=0)
    """What everything else in the pool takes now (base images, other tools' volumes): counted against it."""
    overcommit: float = pydantic.Field(gt=0)
    """The storage overcommit ratio placement applies to the pool."""
    room_bytes: int
    """What may still be promised in the pool as the probe sees it: capacity (or allocation + available, when less:
    blocks a file system reserves) x overcommit - machine disks - other (negative: over-promised, for example after
    the ratio was lowered). Placement computes the same from the machines' specs, so machines placed a moment ago,
    whose volumes are not made yet, count there too."""


class OrphanStatus(meta.Model):
    """Domains on the host that carry this provider's owner metadata but that no LibvirtMachine here claims."""

    count: int | None = pydantic.Field(default=None, ge=0)
    """Orphans of this management cluster (their LibvirtMachine is gone): removed after the grace period."""
    domains: list[Annotated[str, pydantic.Field(max_length=255)]] | None = pydantic.Field(default=None,
                                                                                              max_length=10)
    """Their domain names (at most 10)."""
    removed: int | None = pydantic.Field(default=None, ge=0)
    """Orphans removed from the host since the operator started."""
    kept_count: int | None = pydantic.Field(default=None, ge=0)
    """Domains of this provider no LibvirtMachine here claims, but not provably this management cluster's (another
    management cluster's, an older release's, or moved away by clusterctl move): reported, never removed."""
    kept: list[Annotated[str, pydantic.Field(max_length=300)]] | None = pydantic.Field(default=None,
                                                                                           max_length=10)
    """Their names, each with the reason it is kept (at most 10)."""
    stray_volumes: int | None = pydantic.Field(default=None, ge=0)
    """Volumes in the host's pool named as this provider names volumes that no domain uses: never removed (a name is
    no proof of whose they are)."""
    grace_period_seconds: int | None = pydantic.Field(default=None, ge=0)
    """How long an orphan is kept before it is removed (absent: never removed, report only)."""


class LibvirtHostStatus(meta.Model):
    """What the last health probe saw."""

    reachable: bool | None = None
    """Whether the last probe reached the host's libvirt daemon."""
    last_probe_time: str | None = pydantic.Field(default=None, json_schema_extra={"format": "date-time"})
    """When the probe last wrote this status: at once when anything in it changed, else at least every 5 minutes
    (the host is probed more often; see --host-probe-interval)."""
    libvirt_version: str | None = pydantic.Field(default=None, max_length=64)
    """libvirt version of the daemon."""
    hypervisor_version: str | None = pydantic.Field(default=None, max_length=64)
    """QEMU version."""
    cpus: int | None = pydantic.Field(default=None, ge=0)
    """CPUs of the host."""
    memory_mib: int | None = pydantic.Field(default=None, alias="memoryMiB", ge=0)
    """Memory of the host."""
    free_memory_mib: int | None = pydantic.Field(default=None, alias="freeMemoryMiB", ge=0)
    """Free memory of the host (libvirt's free memory: without the page cache)."""
    machines: int | None = pydantic.Field(default=None, ge=0)
    """Domains of this provider on the host."""
    allocated_cpus: int | None = pydantic.Field(default=None, alias="allocatedCPUs", ge=0)
    """vCPUs of this provider's domains on the host."""
    allocated_memory_mib: int | None = pydantic.Field(default=None, alias="allocatedMemoryMiB", ge=0)
    """Memory of this provider's domains on the host."""
    available_memory_mib: int | None = pydantic.Field(default=None, alias="availableMemoryMiB", ge=0)
    """Memory the host can give a new guest, as libvirt reports it (free + buffers + cached): placement never puts a
    machine with more memory than this on the host."""
    foreign_vms: int | None = pydantic.Field(default=None, alias="foreignVMs", ge=0)
    """Running domains on the host that are not this provider's (no owner metadata of this provider, or another
    management cluster's): placement subtracts their vCPUs and memory from the host's capacity."""
    foreign_cpus: int | None = pydantic.Field(default=None, alias="foreignCPUs", ge=0)
    """vCPUs of the running foreign domains."""
    foreign_memory_mib: int | None = pydantic.Field(default=None, alias="foreignMemoryMiB", ge=0)
    """Memory of the running foreign domains (their current memory, as declared: QEMU allocates lazily)."""
    foreign_vms_shut_off: int | None = pydantic.Field(default=None, alias="foreignVMsShutOff", ge=0)
    """Foreign domains defined but shut off: they take nothing now and are not counted."""
    pool: PoolStatus | None = None
    """The storage pool's capacity."""
    pools: list[PoolUsage] | None = pydantic.Field(default=None, max_length=64)
    """Every active storage pool machines may use on the host (the first 64 by name), with what is promised in it."""
    orphans: OrphanStatus | None = None
    """What the orphan collector found on the host in its last round."""
    conditions: list[meta.Condition] | None = pydantic.Field(
        default=None, max_length=32, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    """Conditions: Ready (reachable and probed)."""


def host_spec_immutability(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """CEL: a host's URI never changes under the machines placed on it."""
    del schema
    return [{"rule": "self.uri == oldSelf.uri", "message": "uri is immutable: create another LibvirtHost"}]
