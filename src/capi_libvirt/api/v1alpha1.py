"""The v1alpha1 kinds: LibvirtCluster, LibvirtClusterTemplate, LibvirtMachine and LibvirtMachineTemplate.

Field docstrings become the CRD's descriptions (what `kubectl explain` shows); bounds, patterns, enums and defaults
become its validation, so the API server refuses a bad object before the operator ever sees it.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

import pydantic

from capi_libvirt.api import meta

# Names that end up inside libvirt object names and XML: conservative characters only.
LIBVIRT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
# Names libvirt's domain schema restricts further (its machine type and bridge patterns): no '+'.
DEVICE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
CIDR = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"
IP = r"^[0-9a-fA-F:.]+$"
# Unicast only (the first octet even): libvirt refuses a multicast MAC when the domain is defined.
MAC = r"^[0-9a-fA-F][02468aceACE](:[0-9a-fA-F]{2}){5}$"
# Text that goes into the domain XML as it is (kernel, initrd, command line): no control characters (XML 1.0 cannot
# carry most of them, and a carriage return would read back as a newline) and none of XML's two noncharacters.
# Written in the syntax both Go's RE2 (the API server) and Rust's regex (pydantic) read.
XML_TEXT = r"^[^\x00-\x1f\x7f\x{FFFE}\x{FFFF}]*$"
ABSOLUTE_PATH = r"^/[^\x00-\x1f\x7f\x{FFFE}\x{FFFF}]*$"


def _is_ip(value: str) -> str:
    """An IPv4 or IPv6 address as the API server's CEL `isIP` reads it: no zone, no IPv4-mapped IPv6 form."""
    address = ipaddress.ip_address(value)
    if isinstance(address, ipaddress.IPv6Address) and (address.scope_id or address.ipv4_mapped):
        raise ValueError(f"{value!r} is not a plain IP address")
    return value


def _is_cidr(value: str) -> str:
    """An address with a prefix length in range (192.0.2.10/24, 2001:db8::10/64), as CEL `isCIDR` reads it."""
    address, _, length = value.partition("/")
    _is_ip(address)
    ipaddress.ip_interface(value)  # the prefix length: within the family's range, no leading zeros or sign
    if length != str(int(length)):
        raise ValueError(f"{value!r} has a malformed prefix length")
    return value


def _cel(rule: str, message: str) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": rule, "message": message}]}


Cidr = Annotated[str, pydantic.Field(pattern=CIDR, max_length=64,
                                     json_schema_extra=_cel("isCIDR(self)", "must be an address in CIDR form")),
                 pydantic.AfterValidator(_is_cidr)]
IPAddress = Annotated[str, pydantic.Field(pattern=IP, max_length=64,
                                          json_schema_extra=_cel("isIP(self)", "must be an IP address")),
                      pydantic.AfterValidator(_is_ip)]


# An image URL: http or https, a host without user info, a path; no fragment, space or control characters (written out:
# `\s` means ASCII whitespace to the API server's RE2 but Unicode whitespace to pydantic's regex).
IMAGE_URL = r"^https?://[^/?#@ \x00-\x1f\x7f]+/[^# \x00-\x1f\x7f]*$"
# What LibvirtHost spec.access.imageURLPrefixes lists: scheme, host and the start of a path (at least its first /),
# so a prefix can never be extended into another host name.
IMAGE_URL_PREFIX = r"^https?://[^/?#@ \x00-\x1f\x7f]+/[^?# \x00-\x1f\x7f]*$"
SHA256 = r"^[0-9a-f]{64}$"
IMAGE_SOURCE_ONE = "set exactly one of volume or url"
IMAGE_URL_NEEDS_SHA256 = "url needs sha256 (and sha256 is only for url)"


class ImageSource(meta.Model):
    """The base image every machine's disk is a copy-on-write overlay of: a volume an admin put into the pool, or an
    image the provider imports into the pool from a URL once per host, checked against its sha256."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.volume) != has(self.url)", "message": IMAGE_SOURCE_ONE},
                {"rule": "has(self.url) == has(self.sha256)", "message": IMAGE_URL_NEEDS_SHA256},
            ]
        }
    )

    volume: str | None = pydantic.Field(default=None, min_length=1, max_length=255, pattern=LIBVIRT_NAME)
    """Name of the base image volume in the storage pool (a qcow2 or raw image with cloud-init)."""
    url: str | None = pydantic.Field(default=None, min_length=10, max_length=2048, pattern=IMAGE_URL)
    """http(s) URL of a qcow2 or raw image, imported into the pool once per host (streamed, never whole in memory)
    and shared by every machine using it. The host must list a prefix of it in spec.access.imageURLPrefixes."""
    sha256: str | None = pydantic.Field(default=None, min_length=64, max_length=64, pattern=SHA256)
    """sha256 of the image at `url` (64 lowercase hex digits): the image is used only once its bytes match it, and
    its volume is named after it, so one checksum is one image on a host, imported once."""
    pool: str | None = pydantic.Field(default=None, min_length=1, max_length=255, pattern=LIBVIRT_NAME)
    """Storage pool holding (or receiving) the base image; defaults to the machine's storage pool."""

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> ImageSource:
        if (self.volume is None) == (self.url is None):
            raise ValueError(IMAGE_SOURCE_ONE)
        if (self.url is None) != (self.sha256 is None):
            raise ValueError(IMAGE_URL_NEEDS_SHA256)
        return self


class StaticAddressing(meta.Model):
    """Fixed addresses for one interface, written into the NoCloud network-config."""

    addresses: list[Cidr] = pydantic.Field(min_length=1, max_length=8)
    """Addresses in CIDR form (192.0.2.10/24, 2001:db8::10/64)."""
    gateway: IPAddress | None = None
    """Default gateway."""
    nameservers: list[IPAddress] | None = pydantic.Field(default=None, max_length=3)
    """DNS servers."""


# Cluster API's IPPoolReference (ipam.cluster.x-k8s.io/v1beta2 IPAddressClaim spec.poolRef): its bounds and patterns.
POOL_API_GROUP = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
POOL_KIND = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
STATIC_OR_POOLS = "set at most one of static or addressesFromPools"


class IPPoolReference(meta.Model):
    """An IP address pool of a Cluster API IPAM provider, in the machine's namespace (an IPAddressClaim's poolRef)."""

    api_group: str = pydantic.Field(min_length=1, max_length=253, pattern=POOL_API_GROUP)
    """API group of the pool (ipam.cluster.x-k8s.io for the in-cluster provider's InClusterIPPool)."""
    kind: str = pydantic.Field(min_length=1, max_length=63, pattern=POOL_KIND)
    """Kind of the pool (InClusterIPPool, ...)."""
    name: str = pydantic.Field(min_length=1, max_length=253, pattern=meta.DNS_SUBDOMAIN)
    """Name of the pool."""


class NetworkInterface(meta.Model):
    """One network interface of the machine: on a libvirt network or on a host bridge, never both."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.network) != has(self.bridge)", "message": "set exactly one of network or bridge"},
                {"rule": "!has(self.static) || !has(self.addressesFromPools)", "message": STATIC_OR_POOLS},
            ]
        }
    )

    network: str | None = pydantic.Field(default=None, min_length=1, max_length=255, pattern=LIBVIRT_NAME)
    """A libvirt network on the host (for example `default`)."""
    bridge: str | None = pydantic.Field(default=None, min_length=1, max_length=15, pattern=DEVICE_NAME)
    """A Linux bridge on the host (for example `br0`)."""
    model: Literal["virtio", "e1000", "rtl8139"] = "virtio"
    """Emulated NIC model."""
    mac_address: str | None = pydantic.Field(default=None, max_length=17, pattern=MAC)  # bounded: CEL's cost estimate
    """Fixed MAC address; derived from the machine's identity when unset."""
    static: StaticAddressing | None = None
    """Static addressing; DHCP when unset (and no addressesFromPools)."""
    allowed_addresses: list[IPAddress] | None = pydantic.Field(default=None, min_length=1, max_length=8)
    """IPv4 addresses the guest may also send from on this interface, besides its own: a virtual IP it takes over,
    such as the control-plane endpoint kube-vip holds. Every NIC carries libvirt's anti-spoofing filter
    (clean-traffic), which drops anything else; the host's admin must grant each of these addresses to the machine's
    namespace (LibvirtHost spec.access.allowedAddresses)."""
    addresses_from_pools: list[IPPoolReference] | None = pydantic.Field(default=None, min_length=1, max_length=2)
    """IP pools of a Cluster API IPAM provider (for example one IPv4 and one IPv6 pool): the provider claims an
    address from each (an IPAddressClaim) and writes it, with the pool's prefix and gateway, into the network-config
    before the guest boots. Not together with static. (The anti-spoofing filter every NIC carries passes IPv4 and ARP
    only: an IPv6 address is configured but its traffic is dropped.)"""

    @pydantic.model_validator(mode="after")
    def _exactly_one_attachment(self) -> NetworkInterface:
        if (self.network is None) == (self.bridge is None):
            raise ValueError("set exactly one of network or bridge")
        if self.static is not None and self.addresses_from_pools is not None:
            raise ValueError(STATIC_OR_POOLS)
        return self


class KernelBoot(meta.Model):
    """Direct kernel boot: the host's kernel and initrd files are booted without a bootloader."""

    kernel: str = pydantic.Field(min_length=2, max_length=4096, pattern=ABSOLUTE_PATH)
    """Path of the kernel image on the host."""
    initrd: str | None = pydantic.Field(default=None, min_length=2, max_length=4096, pattern=ABSOLUTE_PATH)
    """Path of the initrd on the host."""
    cmdline: str = pydantic.Field(default="root=/dev/vda rw console=ttyS0", max_length=4096, pattern=XML_TEXT)
    """Kernel command line."""


def machine_spec_immutability(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """CEL rules for a LibvirtMachine's (structural) spec schema: fixed once created (a new spec means a new machine,
    as Cluster API rolls them), and providerID may be set once, never changed. Templates stay editable."""
    rules = []
    for name, field in schema["properties"].items():
        if name == "providerID":
            continue
        if name in schema.get("required", []) or "default" in field:  # always present once defaulted
            rules.append(f"self.{name} == oldSelf.{name}")
        else:
            rules.append(f"has(self.{name}) == has(oldSelf.{name}) && (!has(self.{name}) || self.{name} == oldSelf.{name})")
    return [
        {"rule": " && ".join(rules), "message": "the machine spec is immutable (only providerID may be set, once)"},
        # The host part may change, the domain UUID (after the last '/') never: a machine that never had a domain is
        # placed again when its host stays unreachable (the operator refuses a host change once a domain was defined).
        {"rule": "!has(oldSelf.providerID) || (has(self.providerID) && (self.providerID == oldSelf.providerID || "
                 "self.providerID.substring(self.providerID.lastIndexOf('/')) == "
                 "oldSelf.providerID.substring(oldSelf.providerID.lastIndexOf('/'))))",
         "message": "providerID cannot change once set, except its host (the domain UUID stays)"},
    ]


class DataDisk(meta.Model):
    """An extra, empty data disk: a qcow2 volume of its own in the machine's storage pool, deleted with the machine."""

    size_gib: int = pydantic.Field(alias="sizeGiB", ge=1, le=65536)
    """Size in GiB (thin: the volume grows as the guest writes)."""
    bus: Literal["virtio", "scsi", "sata"] = "virtio"
    """Bus the disk is attached to (virtio: /dev/vdb, vdc, ... after the root disk)."""


MAX_DATA_DISKS = 8


class CPUTopology(meta.Model):
    """How the vCPUs are laid out for the guest: sockets x cores x threads, which must equal `cpus`."""

    sockets: int = pydantic.Field(ge=1, le=512)
    """CPU sockets."""
    cores: int = pydantic.Field(ge=1, le=512)
    """Cores per socket."""
    threads: int = pydantic.Field(ge=1, le=512)
    """Threads per core."""


HOST_PASSTHROUGH_NEEDS_KVM = "cpuMode host-passthrough needs domainType kvm (QEMU's emulation cannot pass the host CPU)"
MACS_UNIQUE = "interfaces must not share a macAddress"
TOPOLOGY_MATCHES_CPUS = "cpuTopology sockets x cores x threads must equal cpus"
MODEL_OR_MODE = "set at most one of cpuModel and cpuMode"


class LibvirtMachineSpec(meta.Model):
    """The desired VM: its size, image, hardware and network."""

    # What libvirt would refuse at every start, refused once at admission instead of retried with backoff forever.
    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!has(self.cpuMode) || self.cpuMode != 'host-passthrough' || self.domainType == 'kvm'",
                 "message": HOST_PASSTHROUGH_NEEDS_KVM},
                # Two NICs with one MAC: the network-config matches both with one entry, and the guest's network breaks.
                {"rule": "self.interfaces.all(i, !has(i.macAddress) || self.interfaces.exists_one(j, "
                         "has(j.macAddress) && j.macAddress.lowerAscii() == i.macAddress.lowerAscii()))",
                 "message": MACS_UNIQUE},
                {"rule": "!has(self.cpuTopology) || "
                         "self.cpuTopology.sockets * self.cpuTopology.cores * self.cpuTopology.threads == self.cpus",
                 "message": TOPOLOGY_MATCHES_CPUS},
                {"rule": "!has(self.cpuModel) || !has(self.cpuMode)", "message": MODEL_OR_MODE},
            ]
        }
    )

    provider_id: str | None = pydantic.Field(default=None, alias="providerID", min_length=1, max_length=512)
    """libvirt://<host>/<domain-uuid>, set by the provider once the domain exists."""
    host: str | None = pydantic.Field(default=None, min_length=1, max_length=63, pattern=meta.DNS_LABEL)
    """Pin the machine to this host; chosen by placement when unset."""
    cpus: int = pydantic.Field(default=2, ge=1, le=512)
    """Number of virtual CPUs."""
    memory_mib: int = pydantic.Field(default=2048, alias="memoryMiB", ge=128, le=16 * 1024 * 1024)
    """Memory in MiB."""
    disk_gib: int = pydantic.Field(default=20, alias="diskGiB", ge=1, le=65536)
    """Size of the root disk in GiB; the overlay is grown to it."""
    image: ImageSource
    """The base image the root disk is an overlay of."""
    storage_pool: str = pydantic.Field(default="default", min_length=1, max_length=255, pattern=LIBVIRT_NAME)
    """Storage pool the overlay and the NoCloud ISO are created in."""
    domain_type: Literal["kvm", "qemu"] = "kvm"
    """`kvm` on hosts with hardware virtualization; `qemu` (software emulation) elsewhere."""
    machine_type: str = pydantic.Field(default="q35", min_length=1, max_length=64, pattern=DEVICE_NAME)
    """QEMU machine type (q35, pc, ...)."""
    cpu_mode: Literal["host-passthrough", "host-model", "maximum"] | None = None
    """libvirt CPU mode; the hypervisor's default when unset."""
    disk_bus: Literal["virtio", "scsi", "sata"] = "virtio"
    """Bus of the root disk."""
    interfaces: list[NetworkInterface] = pydantic.Field(
        default=[NetworkInterface(network="default")], min_length=1, max_length=8
    )
    """Network interfaces, in order."""
    guest_agent: bool = True
    """Add the QEMU guest agent channel (addresses are then also read from the agent)."""
    serial_log: bool = True
    """Log the serial console to a file on the host (cloud-init output is there)."""
    kernel_boot: KernelBoot | None = None
    """Boot a kernel directly instead of the disk's bootloader."""
    firmware: Literal["bios", "uefi"] = "bios"
    """`bios` (SeaBIOS) or `uefi`: the host's OVMF, chosen by libvirt (Secure Boot off), with a variable store of the
    machine's own that is deleted with it. Direct kernel boot under uefi boots the kernel through the EFI stub."""
    data_disks: list[DataDisk] = pydantic.Field(default=[], max_length=MAX_DATA_DISKS)
    """Extra empty disks after the root disk, in order; made in the machine's storage pool, deleted with it."""
    cpu_topology: CPUTopology | None = None
    """Sockets, cores and threads of the vCPUs (their product must equal cpus); libvirt's default (one socket per
    vCPU) when unset."""
    cpu_model: str | None = pydantic.Field(default=None, min_length=1, max_length=64, pattern=DEVICE_NAME)
    """A named CPU model (libvirt's `<cpu mode='custom'>`: Skylake-Client, EPYC, qemu64, ...), exactly, with no
    fallback. A host that cannot run it refuses the machine with CPUModelNotSupported before anything is made.
    Exclusive with cpuMode."""
    keep_nocloud_iso: bool = pydantic.Field(default=False, alias="keepNoCloudISO", description=(
        "Keep the NoCloud ISO (the bootstrap data: cloud-init's user-data, with the kubeadm join token) attached and "
        "on the host for the machine's whole life, for debugging. By default it is ejected from the VM's CD-ROM drive "
        "(no reboot) and deleted from the host's storage pool once the owner Machine has a nodeRef (the node joined, "
        "so cloud-init ran the bootstrap data). The same goes for an Ignition config: by default taken out of the "
        "domain's definition once the node joined, and its file emptied (deleted with the machine; deleted at once when "
        "the VM is not running); kept with this set."))

    @pydantic.model_validator(mode="after")
    def _cpu_mode_fits_domain_type(self) -> LibvirtMachineSpec:
        if self.cpu_mode == "host-passthrough" and self.domain_type != "kvm":
            raise ValueError(HOST_PASSTHROUGH_NEEDS_KVM)
        if self.cpu_topology is not None and \
                self.cpu_topology.sockets * self.cpu_topology.cores * self.cpu_topology.threads != self.cpus:
            raise ValueError(TOPOLOGY_MATCHES_CPUS)
        if self.cpu_model is not None and self.cpu_mode is not None:
            raise ValueError(MODEL_OR_MODE)
        macs = [nic.mac_address.lower() for nic in self.interfaces if nic.mac_address]
        if len(macs) != len(set(macs)):
            raise ValueError(MACS_UNIQUE)
        return self


class LibvirtMachineStatus(meta.Model):
    """What the provider observed of the machine."""

    ready: bool | None = None
    """v1beta1 contract: true once the VM is provisioned."""
    initialization: meta.Initialization | None = None
    """v1beta2 contract: initialization.provisioned is true once the VM is provisioned."""
    addresses: list[meta.MachineAddress] | None = None
    """Addresses: the static (or IP pool) ones at once, then discovered ones; the last discovered kept if none now."""
    failure_domain: str | None = pydantic.Field(default=None, max_length=256)
    """Failure domain the machine was placed in."""
    host: str | None = pydantic.Field(default=None, max_length=63)
    """Host the domain lives on."""
    domain_uuid: str | None = pydantic.Field(default=None, alias="domainUUID", max_length=36)
    """UUID of the libvirt domain, fixed before anything is created."""
    state: str | None = pydantic.Field(default=None, max_length=64)
    """Domain state as libvirt reports it (running, shutoff, ...)."""
    no_cloud_iso_removed: bool | None = pydantic.Field(default=None, alias="noCloudISORemoved", description=(
        "True once the NoCloud ISO (the bootstrap data) was ejected from the VM and deleted from the host; false when "
        "the node joined but spec.keepNoCloudISO keeps it; unset before the node joined."))
    ignition_config_removed: bool | None = pydantic.Field(default=None, description=(
        "For Ignition bootstrap data: true once its config file (with the join token) was taken out of the domain's "
        "definition and deleted from the host; false when the node joined but spec.keepNoCloudISO keeps it; unset "
        "before the node joined."))
    observed_generation: int | None = pydantic.Field(default=None, ge=0)
    """The .metadata.generation last reconciled."""
    conditions: list[meta.Condition] | None = pydantic.Field(
        default=None, max_length=32, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    """Conditions: Ready, and the provisioning condition whose reason says what the machine waits for."""


class LibvirtMachineTemplateResource(meta.Model):
    """The machine spec stamped out for every machine made from the template."""

    spec: LibvirtMachineSpec


class LibvirtMachineTemplateSpec(meta.Model):
    """A template of LibvirtMachines, as MachineDeployments and control planes refer to it."""

    template: LibvirtMachineTemplateResource


class NodeInfo(meta.Model):
    """What a node made from the template runs, for cluster-autoscaler's scale-from-zero."""

    architecture: Literal["amd64", "arm64", "s390x", "ppc64le"] | None = None
    """CPU architecture."""
    operating_system: Literal["linux", "windows"] | None = None
    """Operating system."""


class LibvirtMachineTemplateStatus(meta.Model):
    """Capacity of a machine made from the template, read by cluster-autoscaler to scale from zero."""

    capacity: dict[str, str] | None = None
    """One machine's ResourceList (cpu, memory, ephemeral-storage), quantities as strings for cluster-autoscaler."""
    node_info: NodeInfo | None = None
    """Architecture and operating system of the nodes."""
    conditions: list[meta.Condition] | None = pydantic.Field(
        default=None, max_length=32, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    """Conditions of the template."""


class LibvirtClusterSpec(meta.Model):
    """The cluster-wide infrastructure: where the control plane is reached and where machines may go."""

    control_plane_endpoint: meta.APIEndpoint | None = None
    """The workload cluster's API endpoint; taken from Cluster.spec.controlPlaneEndpoint when unset."""


class LibvirtClusterStatus(meta.Model):
    """What the provider observed of the cluster infrastructure."""

    ready: bool | None = None
    """v1beta1 contract: true once the cluster infrastructure is provisioned."""
    initialization: meta.Initialization | None = None
    """v1beta2 contract: initialization.provisioned."""
    failure_domains: list[meta.FailureDomain] | None = pydantic.Field(
        default=None, max_length=64, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )
    """Failure domains machines of this cluster can be spread over."""
    observed_generation: int | None = pydantic.Field(default=None, ge=0)
    """The .metadata.generation last reconciled."""
    conditions: list[meta.Condition] | None = pydantic.Field(
        default=None, max_length=32, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    """Conditions: Ready and what the cluster waits for."""


class LibvirtClusterTemplateResource(meta.Model):
    """The cluster spec stamped out by a ClusterClass."""

    spec: LibvirtClusterSpec


class LibvirtClusterTemplateSpec(meta.Model):
    """A template of LibvirtClusters, for ClusterClass."""

    template: LibvirtClusterTemplateResource


# A LibvirtMachineTemplate's spec may change (Cluster API's topology controller dry-runs its desired template onto the
# current one to decide whether to make a new one, so an immutability rule the API server enforces breaks ClusterClass
# rollouts), but a change in place rolls nothing: the template's EditedInPlace condition says so.
def template_edited_message(generation: int) -> str:
    return (f"spec.template was edited in place (generation {generation}): machines made from it keep the shape they "
            "were made with, and Cluster API rolls machines only when their MachineDeployment or KubeadmControlPlane "
            "points at a new template (a ClusterClass's topology makes one itself); create a new "
            "LibvirtMachineTemplate and point them at it")
