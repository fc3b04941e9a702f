"""Tenant boundaries: may a machine of a namespace use a host, and the host's pools, networks, bridges, images and files
its spec names? Pure: a host's access rules and a machine spec in, the first refusal (or None) out.

Whoever may create a LibvirtMachine in a namespace is a tenant, not the hypervisor's admin. The admin says on each
LibvirtHost (spec.access) what tenants may use; anything else is refused before the host is touched. The defaults
keep a single-tenant first day working (every namespace; the host's storage pool; the `default` NAT network) while
nothing that reaches beyond the host's provider-managed resources is allowed unless listed: no bridge, no base image,
no image URL, no host file as kernel or initrd. The provider's own machine volumes (another machine's disk, its NoCloud ISO with its
bootstrap data, its serial log) are never a base image, whatever the lists say.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
import posixpath
from collections.abc import Sequence

from capi_libvirt.api import v1alpha1, v1alpha1_host
from capi_libvirt.core import images, naming


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a host refuses a machine: `field` is the LibvirtHost's spec.access list the admin would extend."""

    host: str
    field: str
    message: str

    def __str__(self) -> str:
        return self.message


def matches(name: str, patterns: Sequence[str]) -> bool:
    """`name` is one of `patterns` (shell-style, case-sensitive: `team-*`, `ubuntu-??.qcow2`)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def allowed_pools(access: v1alpha1_host.HostAccess, host_pool: str) -> list[str]:
    """The pools machines may use: the listed ones, or only the host's own storage pool when none are listed."""
    return list(access.storage_pools) if access.storage_pools is not None else [host_pool]


def is_machine_volume(volume: str) -> bool:
    """A volume this provider makes for a machine (overlay, data disk, NoCloud ISO, Ignition config, serial log): never
    a base image."""
    return volume.startswith(naming.PREFIX + "-") and volume.endswith(
        (naming.OVERLAY_SUFFIX, naming.NOCLOUD_SUFFIX, naming.SERIAL_LOG_SUFFIX, naming.IGNITION_SUFFIX))


def path_under(path: str, folders: Sequence[str]) -> bool:
    """`path` is a file inside one of `folders` (absolute, ending in /). A path with `..`, `.` or `//` in it is never
    inside anything: it is compared as written, not resolved (the host's symlinks are the admin's business)."""
    if not path.startswith("/") or posixpath.normpath(path) != path or path.endswith("/"):
        return False
    return any(path.startswith(folder) and len(path) > len(folder) for folder in folders)


def namespace_refusal(host: str, access: v1alpha1_host.HostAccess, namespace: str) -> Refusal | None:
    if access.namespaces is not None and not matches(namespace, access.namespaces):
        # The other tenants' namespaces are not named: a tenant learns only that this host is not theirs.
        return Refusal(host, "namespaces", f"host {host} does not allow machines of namespace {namespace} "
                                           "(LibvirtHost spec.access.namespaces)")
    return None


def refusal(host: str, access: v1alpha1_host.HostAccess, host_pool: str, namespace: str,
            spec: v1alpha1.LibvirtMachineSpec) -> Refusal | None:
    """The first thing `spec` (of a machine in `namespace`) asks of `host` that its access rules do not allow."""
    denied = namespace_refusal(host, access, namespace)
    if denied is not None:
        return denied
    pools = allowed_pools(access, host_pool)
    for what, pool in (("storagePool", spec.storage_pool), ("image.pool", spec.image.pool or spec.storage_pool)):
        if not matches(pool, pools):
            return Refusal(host, "storagePools", f"{what} {pool!r} is not allowed on host {host} "
                                                 f"(allowed: {_listed(pools)}; LibvirtHost spec.access.storagePools)")
    denied = image_refusal(host, access, spec.image)
    if denied is not None:
        return denied
    for index, nic in enumerate(spec.interfaces):
        if nic.network is not None and not matches(nic.network, access.networks):
            return Refusal(host, "networks", f"interfaces[{index}].network {nic.network!r} is not allowed on host "
                                             f"{host} (allowed: {_listed(access.networks)}; LibvirtHost "
                                             "spec.access.networks)")
        if nic.bridge is not None and not matches(nic.bridge, access.bridges):
            return Refusal(host, "bridges", f"interfaces[{index}].bridge {nic.bridge!r} is not allowed on host "
                                            f"{host} (allowed: {_listed(access.bridges)}; LibvirtHost "
                                            "spec.access.bridges)")
    for index, nic in enumerate(spec.interfaces):
        for address in nic.allowed_addresses or []:
            if not address_granted(access, namespace, address):
                return Refusal(host, "allowedAddresses", f"interfaces[{index}].allowedAddresses {address!r} is not "
                                                         f"granted to namespace {namespace} on host {host} "
                                                         "(LibvirtHost spec.access.allowedAddresses)")
    if spec.kernel_boot is not None:
        for what, path in (("kernel", spec.kernel_boot.kernel), ("initrd", spec.kernel_boot.initrd)):
            if path is not None and not path_under(path, access.host_paths):
                return Refusal(host, "hostPaths", f"kernelBoot.{what} {path!r} is not under a folder host {host} "
                                                  f"allows (allowed: {_listed(access.host_paths)}; LibvirtHost "
                                                  "spec.access.hostPaths)")
    return None


def address_granted(access: v1alpha1_host.HostAccess, namespace: str, address: str) -> bool:
    """`address` is in a range the host grants `namespace` to send from besides its own addresses."""
    ip = ipaddress.ip_address(address)
    return any(matches(namespace, grant.namespaces) and
               any(ip in ipaddress.ip_network(cidr, strict=False) for cidr in grant.cidrs)
               for grant in access.allowed_addresses)


def image_refusal(host: str, access: v1alpha1_host.HostAccess, image: v1alpha1.ImageSource) -> Refusal | None:
    """A volume must be on the host's image list (and never a machine's own volume, nor an imported image, which is
    named by its URL and sha256 instead); a URL must start with one of the host's image URL prefixes."""
    if image.url is not None:
        if not images.url_allowed(image.url, access.image_url_prefixes):
            return Refusal(host, "imageURLPrefixes", f"image.url {image.url!r} is not under a prefix host {host} "
                                                     f"allows (allowed: {_listed(access.image_url_prefixes)}; "
                                                     "LibvirtHost spec.access.imageURLPrefixes)")
        return None
    volume = image.volume or ""
    if is_machine_volume(volume):
        return Refusal(host, "images", f"image.volume {volume!r} is a machine's own volume, never a base image")
    if images.is_image_volume(volume):
        return Refusal(host, "images", f"image.volume {volume!r} is an imported image: name it by image.url and "
                                       "image.sha256")
    if not matches(volume, access.images):
        return Refusal(host, "images", f"image.volume {volume!r} is not allowed on host {host} "
                                       f"(allowed: {_listed(access.images)}; LibvirtHost spec.access.images)")
    return None


@dataclasses.dataclass(frozen=True)
class Holding:
    """What a namespace holds on a host, or what a machine adds to it."""

    machines: int = 0
    cpus: int = 0
    memory_mib: int = 0
    disk_gib: int = 0

    def __add__(self, other: Holding) -> Holding:
        return Holding(self.machines + other.machines, self.cpus + other.cpus, self.memory_mib + other.memory_mib,
                       self.disk_gib + other.disk_gib)


QUOTA_UNITS = (("machines", "machines"), ("cpus", "vCPUs"), ("memory_mib", "MiB of memory"),
               ("disk_gib", "GiB of disk"))


def quota_excess(host: str, access: v1alpha1_host.HostAccess, namespace: str, held: Holding,
                 wanted: Holding) -> str | None:
    """Why one more machine (`wanted`) would put `namespace`, which holds `held` on `host`, over its quota there (the
    first of the host's quotas that lists the namespace); None when it fits or no quota applies."""
    for index, quota in enumerate(access.quotas):
        if not matches(namespace, quota.namespaces):
            continue
        after = held + wanted
        for field, unit in QUOTA_UNITS:
            limit = getattr(quota, field)
            if limit is not None and getattr(after, field) > limit:
                return (f"namespace {namespace} may hold {limit} {unit} on host {host} (LibvirtHost "
                        f"spec.access.quotas[{index}].{v1alpha1_host.NamespaceQuota.model_fields[field].alias or field}); "
                        f"it holds {getattr(held, field)} and this machine needs {getattr(wanted, field)} more")
        return None
    return None


def _listed(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "none"


# For hosts given on the operator's command line (--host, development only): the operator's own admin named them.
UNRESTRICTED = v1alpha1_host.HostAccess.model_construct(
    namespaces=None, storage_pools=["*"], networks=["*"], bridges=["*"], images=["*"], host_paths=["/"],
    image_url_prefixes=["http://", "https://"], quotas=[],
    allowed_addresses=[v1alpha1_host.AddressGrant(namespaces=["*"], cidrs=["0.0.0.0/0", "::/0"])])
