"""The libvirt domain XML of a machine, built with ElementTree from a frozen `DomainConfig`.

Two layers, as in nova's libvirt config: `from_spec` holds the policy (which bus, which MAC, how big the TCG cache) and
turns a LibvirtMachineSpec into a `DomainConfig`; the small `_element` builders below turn the config into XML and
decide nothing. Values only ever enter the document as element text or attribute values (core.xml_text), so
ElementTree escapes them: a hostile name cannot break out of its element. The owner is stored in the domain's
`<metadata>` (core.domain_owner); what the provider reads and changes in a defined domain's XML is
core.domain_xml_edits.

The machine's shape: BIOS or UEFI (libvirt's firmware autoselection, `<os firmware='efi'>` with Secure Boot off: the
host's own OVMF and a variable store of the domain's own, so no host file is ever named here), extra data disks after
the root disk, a CPU topology and a named CPU model, and fw_cfg entries (`<sysinfo type='fwcfg'>`: the Ignition config
a guest reads at `opt/com.coreos/config`, from a file the provider uploaded into the machine's pool).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from capi_libvirt.api import v1alpha1
from capi_libvirt.core import naming
from capi_libvirt.core.domain_owner import Owner, metadata_element
from capi_libvirt.core.traffic_filter import TrafficFilter, filterref_element, ipv4_only
from capi_libvirt.core.xml_text import check_xml_text, text_element

GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
# Where Ignition (Fedora CoreOS, Flatcar) reads its config on QEMU: a fw_cfg file of this name.
IGNITION_FW_CFG = "opt/com.coreos/config"
# QEMU >= 5.0 gives every TCG guest a 1 GiB translation cache by default; a few emulated guests on a small host then
# run it out of memory. So a qemu domain gets half its memory, between these bounds: 256 MiB boots the node image
# fastest (cloud-init final 45-48 s alone, against 54-60 s with 64 MiB and 52 s with the 1 GiB default; two side by
# side on 2 cores 52-54 s against 59 s), but a control-plane machine (etcd, kube-apiserver, the controller manager and
# the scheduler at once) filled 256 MiB and flushed it 37 times before its API server first answered, which then
# never did within its own one-minute start-up check. Only as much of the cache as the guest's code fills is touched.
DEFAULT_TCG_TB_CACHE_MIB = 256
MAX_TCG_TB_CACHE_MIB = 1024


def tcg_tb_cache_mib(memory_mib: int) -> int:
    """The translation cache of a qemu (TCG) domain of `memory_mib`: half of it, within the bounds above."""
    return max(DEFAULT_TCG_TB_CACHE_MIB, min(MAX_TCG_TB_CACHE_MIB, memory_mib // 2))

DomainType = Literal["kvm", "qemu"]
DiskBus = Literal["virtio", "scsi", "sata"]
CdromBus = Literal["scsi", "ide"]
Firmware = Literal["bios", "uefi"]

@dataclass(frozen=True)
class Interface:
    """One NIC: on a libvirt network or on a host bridge (exactly one of them), with its model and MAC."""

    mac: str
    network: str | None = None
    bridge: str | None = None
    model: str = "virtio"
    traffic: TrafficFilter | None = None  # the anti-spoofing filter (core.traffic_filter); None: none

    def __post_init__(self) -> None:
        if (self.network is None) == (self.bridge is None):
            raise ValueError("an interface needs exactly one of network or bridge")
        for name in ("mac", "network", "bridge", "model"):
            check_xml_text(f"interface {name}", getattr(self, name))


@dataclass(frozen=True)
class KernelBoot:
    """Direct kernel boot: host paths of the kernel and initrd, and the command line."""

    kernel: str
    initrd: str | None = None
    cmdline: str = ""

    def __post_init__(self) -> None:
        for name in ("kernel", "initrd", "cmdline"):
            check_xml_text(f"kernel boot {name}", getattr(self, name))


@dataclass(frozen=True)
class DataDisk:
    """An extra file-backed disk after the root disk."""

    path: str
    bus: DiskBus = "virtio"
    format: str = "qcow2"

    def __post_init__(self) -> None:
        if self.bus not in ("virtio", "scsi", "sata"):
            raise ValueError(f"data disk bus must be virtio, scsi or sata, not {self.bus!r}")
        for name in ("path", "format"):
            check_xml_text(f"data disk {name}", getattr(self, name))


@dataclass(frozen=True)
class BackingFile:
    """The base image under the root disk's overlay, written into the disk's `<backingStore>` with libvirt's DAC
    relabelling off: libvirt then uses this chain as it is, QEMU opens the base read-only, and the file stays as the
    admin made it (root's, world-readable) instead of being given to the QEMU user for good (libvirt never gives a
    backing file back). Only for a base without a backing file of its own that any user may read (see
    core.volume_xml.shareable_base); otherwise libvirt finds and labels the chain itself."""

    path: str
    format: str = "qcow2"

    def __post_init__(self) -> None:
        for name in ("path", "format"):
            check_xml_text(f"backing file {name}", getattr(self, name))


@dataclass(frozen=True)
class CPUTopology:
    """sockets x cores x threads vCPUs."""

    sockets: int
    cores: int
    threads: int

    @property
    def vcpus(self) -> int:
        return self.sockets * self.cores * self.threads


@dataclass(frozen=True)
class FwCfgEntry:
    """A fw_cfg file the guest sees under `name` (QEMU wants user entries under opt/), read from a host file."""

    name: str
    file: str

    def __post_init__(self) -> None:
        if not self.name.startswith("opt/") or len(self.name) > 55:  # FW_CFG_MAX_FILE_PATH is 56 with its NUL
            raise ValueError(f"fw_cfg entry name must start with opt/ and fit 55 characters, not {self.name!r}")
        for name in ("name", "file"):
            check_xml_text(f"fw_cfg entry {name}", getattr(self, name))


@dataclass(frozen=True)
class DomainConfig:
    """Everything the domain XML says, already decided: the builders only write it down."""

    name: str
    uuid: str
    vcpus: int
    memory_mib: int
    disk_path: str
    owner: Owner
    interfaces: tuple[Interface, ...] = ()
    domain_type: DomainType = "kvm"
    machine_type: str = "q35"
    cpu_mode: str | None = None
    disk_format: str = "qcow2"
    disk_bus: DiskBus = "virtio"
    disk_backing: BackingFile | None = None
    cdrom_path: str | None = None
    cdrom_bus: CdromBus = "scsi"
    guest_agent: bool = True
    serial_log_path: str | None = None
    kernel_boot: KernelBoot | None = None
    tcg_tb_cache_mib: int | None = None
    title: str | None = None
    description: str | None = None
    firmware: Firmware = "bios"
    data_disks: tuple[DataDisk, ...] = ()
    cpu_model: str | None = None
    cpu_topology: CPUTopology | None = None
    fw_cfg: tuple[FwCfgEntry, ...] = ()

    def __post_init__(self) -> None:
        # Only what libvirt would refuse later anyway (with a worse message) or what would make the XML unreadable.
        if self.vcpus < 1:
            raise ValueError(f"vcpus must be >= 1, not {self.vcpus}")
        if self.memory_mib < 1:
            raise ValueError(f"memory_mib must be >= 1, not {self.memory_mib}")
        if self.domain_type not in ("kvm", "qemu"):
            raise ValueError(f"domain_type must be kvm or qemu, not {self.domain_type!r}")
        if self.disk_bus not in ("virtio", "scsi", "sata"):
            raise ValueError(f"disk_bus must be virtio, scsi or sata, not {self.disk_bus!r}")
        if self.cdrom_bus not in ("scsi", "ide"):
            raise ValueError(f"cdrom_bus must be scsi or ide, not {self.cdrom_bus!r}")
        if self.cdrom_bus == "ide" and not self.machine_type.startswith("pc"):
            raise ValueError(f"an IDE CD-ROM needs a pc machine type; {self.machine_type!r} has no IDE bus")
        if self.tcg_tb_cache_mib is not None:
            if self.domain_type != "qemu":
                raise ValueError("tcg_tb_cache_mib applies to domain_type 'qemu' only (libvirt refuses it for kvm)")
            if self.tcg_tb_cache_mib < 1:
                raise ValueError(f"tcg_tb_cache_mib must be >= 1, not {self.tcg_tb_cache_mib}")
        if self.firmware not in ("bios", "uefi"):
            raise ValueError(f"firmware must be bios or uefi, not {self.firmware!r}")
        if self.cpu_model is not None and self.cpu_mode is not None:
            raise ValueError("set at most one of cpu_model and cpu_mode")
        if self.cpu_topology is not None and self.cpu_topology.vcpus != self.vcpus:
            raise ValueError(f"cpu topology {self.cpu_topology.sockets}x{self.cpu_topology.cores}x"
                             f"{self.cpu_topology.threads} does not make {self.vcpus} vcpus")
        if self.cpu_topology is not None and min(self.cpu_topology.sockets, self.cpu_topology.cores,
                                                 self.cpu_topology.threads) < 1:
            raise ValueError("cpu topology sockets, cores and threads must be >= 1")
        if len({entry.name for entry in self.fw_cfg}) != len(self.fw_cfg):
            raise ValueError("fw_cfg entry names must be unique")
        if self.title is not None and "\n" in self.title:
            raise ValueError("title must be a single line (libvirt refuses newlines in it)")
        for name in ("name", "uuid", "machine_type", "cpu_mode", "cpu_model", "disk_path", "disk_format", "cdrom_path",
                     "serial_log_path", "title", "description"):
            check_xml_text(name, getattr(self, name))


def from_spec(
    spec: v1alpha1.LibvirtMachineSpec,
    *,
    name: str,
    uuid: str,
    disk_path: str,
    iso_path: str | None,
    serial_log_path: str | None,
    owner: Owner,
    data_disk_paths: tuple[str, ...] = (),
    ignition_path: str | None = None,
    known_addresses: Mapping[int, Sequence[str]] | None = None,
    disk_backing: BackingFile | None = None,
) -> DomainConfig:
    """The domain config of a machine: the spec's hardware plus the names and paths the caller created or chose.

    Policy lives here: MACs not fixed in the spec come from `naming.mac_address` (stable across retries), emulated
    (qemu) domains get a 64 MiB TCG cache, the NoCloud CD-ROM sits on virtio-scsi (no SATA driver needed in the guest,
    valid on q35 and pc), and the serial log is only kept when the spec asks for it. `data_disk_paths` are the spec's
    data disks' volumes, in order; `disk_backing` the overlay's base when it is shareable as it is (BackingFile);
    `ignition_path` (Ignition bootstrap data) becomes the fw_cfg file Ignition reads.
    Every NIC carries the anti-spoofing filter (core.traffic_filter): held to its IPv4 addresses known up front
    (`known_addresses`, by interface index) and its allowedAddresses; without any, on a libvirt network, to a DHCP
    client's traffic until the host's lease pins it; on a bridge, to its MAC.
    """
    if len(data_disk_paths) != len(spec.data_disks):
        raise ValueError(f"{len(spec.data_disks)} data disks in the spec, {len(data_disk_paths)} volumes given")
    interfaces = tuple(
        Interface(
            mac=(nic.mac_address or naming.mac_address(owner.uid, index)).lower(),
            network=nic.network,
            bridge=nic.bridge,
            model=nic.model,
            traffic=TrafficFilter(addresses=ipv4_only(list((known_addresses or {}).get(index, ()))),
                                  allowed=ipv4_only(nic.allowed_addresses or []),
                                  awaiting_lease=nic.network is not None),
        )
        for index, nic in enumerate(spec.interfaces)
    )
    kernel_boot = (
        KernelBoot(kernel=spec.kernel_boot.kernel, initrd=spec.kernel_boot.initrd, cmdline=spec.kernel_boot.cmdline)
        if spec.kernel_boot is not None
        else None
    )
    cluster = f" of cluster {owner.cluster}" if owner.cluster else ""
    return DomainConfig(
        name=name,
        uuid=uuid,
        title=f"{owner.namespace}/{owner.name}",
        description=f"Cluster API machine {owner.namespace}/{owner.name}{cluster}, managed by capi-libvirt",
        vcpus=spec.cpus,
        memory_mib=spec.memory_mib,
        domain_type=spec.domain_type,
        machine_type=spec.machine_type,
        cpu_mode=spec.cpu_mode,
        disk_path=disk_path,
        disk_format="qcow2",
        disk_bus=spec.disk_bus,
        disk_backing=disk_backing,
        cdrom_path=iso_path,
        cdrom_bus="scsi",
        interfaces=interfaces,
        guest_agent=spec.guest_agent,
        serial_log_path=serial_log_path if spec.serial_log else None,
        kernel_boot=kernel_boot,
        tcg_tb_cache_mib=tcg_tb_cache_mib(spec.memory_mib) if spec.domain_type == "qemu" else None,
        owner=owner,
        firmware=spec.firmware,
        data_disks=tuple(DataDisk(path=path, bus=disk.bus) for path, disk in zip(data_disk_paths, spec.data_disks, strict=True)),
        cpu_model=spec.cpu_model,
        cpu_topology=CPUTopology(spec.cpu_topology.sockets, spec.cpu_topology.cores, spec.cpu_topology.threads)
        if spec.cpu_topology is not None else None,
        fw_cfg=(FwCfgEntry(IGNITION_FW_CFG, ignition_path),) if ignition_path is not None else (),
    )


def domain_xml(config: DomainConfig) -> str:
    """The domain XML as text, ready for virDomainDefineXML."""
    root = domain_element(config)
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


# --- builders: one per element, config in, element out, no decisions ------------------------------------------------


def domain_element(config: DomainConfig) -> ET.Element:
    """The whole <domain>."""
    domain = ET.Element("domain", type=config.domain_type)
    text_element(domain, "name", config.name)
    text_element(domain, "uuid", config.uuid)
    if config.title is not None:
        text_element(domain, "title", config.title)
    if config.description is not None:
        text_element(domain, "description", config.description)
    domain.append(metadata_element(config.owner))
    text_element(domain, "memory", str(config.memory_mib), unit="MiB")
    text_element(domain, "vcpu", str(config.vcpus))
    domain.append(os_element(config))
    domain.append(features_element(config.tcg_tb_cache_mib))
    cpu = cpu_element(config.cpu_mode, config.cpu_model, config.cpu_topology)
    if cpu is not None:
        domain.append(cpu)
    if config.fw_cfg:
        domain.append(fw_cfg_element(config.fw_cfg))
    ET.SubElement(domain, "clock", offset="utc")
    # A guest that powers off or crashes stays off (the reconciler sees it); a reboot is just a reboot.
    text_element(domain, "on_poweroff", "destroy")
    text_element(domain, "on_reboot", "restart")
    text_element(domain, "on_crash", "destroy")
    domain.append(devices_element(config))
    return domain


def os_element(config: DomainConfig) -> ET.Element:
    """<os>: hvm on the machine type; for UEFI libvirt's firmware autoselection without Secure Boot (it picks the host's
    OVMF and gives the domain its own variable store, which undefine removes with VIR_DOMAIN_UNDEFINE_NVRAM); the
    kernel, initrd and cmdline for direct boot, else boot from the disk."""
    element = ET.Element("os", firmware="efi") if config.firmware == "uefi" else ET.Element("os")
    text_element(element, "type", "hvm", machine=config.machine_type)
    if config.firmware == "uefi":
        # Without these, libvirt may pick a Secure Boot build with enrolled keys (it needs SMM, and refuses unsigned
        # kernels): plain OVMF boots on pc and q35 alike.
        firmware = ET.SubElement(element, "firmware")
        ET.SubElement(firmware, "feature", enabled="no", name="secure-boot")
        ET.SubElement(firmware, "feature", enabled="no", name="enrolled-keys")
    if config.kernel_boot is not None:
        text_element(element, "kernel", config.kernel_boot.kernel)
        if config.kernel_boot.initrd is not None:
            text_element(element, "initrd", config.kernel_boot.initrd)
        text_element(element, "cmdline", config.kernel_boot.cmdline)
    else:
        ET.SubElement(element, "boot", dev="hd")
    return element


def features_element(tcg_tb_cache_mib: int | None) -> ET.Element:
    """<features>: ACPI (so a shutdown request reaches the guest) and the APIC; the TCG cache size when given."""
    features = ET.Element("features")
    ET.SubElement(features, "acpi")
    ET.SubElement(features, "apic")
    if tcg_tb_cache_mib is not None:
        tcg = ET.SubElement(features, "tcg")
        text_element(tcg, "tb-cache", str(tcg_tb_cache_mib), unit="MiB")
    return features


def cpu_element(mode: str | None, model: str | None, topology: CPUTopology | None) -> ET.Element | None:
    """<cpu>: a mode (host-passthrough, ...), or a named model exactly (mode custom, no fallback to another model),
    with the topology when given; None when there is nothing to say."""
    if mode is None and model is None and topology is None:
        return None
    if model is not None:
        cpu = ET.Element("cpu", mode="custom", match="exact")
        text_element(cpu, "model", model, fallback="forbid")
    else:
        cpu = ET.Element("cpu", mode=mode) if mode is not None else ET.Element("cpu")
    if topology is not None:
        ET.SubElement(cpu, "topology", sockets=str(topology.sockets), cores=str(topology.cores),
                      threads=str(topology.threads))
    return cpu


def fw_cfg_element(entries: tuple[FwCfgEntry, ...]) -> ET.Element:
    """<sysinfo type='fwcfg'>: each entry a host file QEMU reads at start and the guest sees under its name."""
    sysinfo = ET.Element("sysinfo", type="fwcfg")
    for entry in entries:
        ET.SubElement(sysinfo, "entry", name=entry.name, file=entry.file)
    return sysinfo


def devices_element(config: DomainConfig) -> ET.Element:
    """<devices>: root disk, data disks, optional CD-ROM, the SCSI controller they need, NICs, serial log and agent
    channel. Guest device names are handed out in that order, per name prefix (vd*, sd*, hd*)."""
    devices = ET.Element("devices")
    used: dict[str, int] = {}

    def next_dev(bus: str) -> str:
        index = used.get(_dev_prefix(bus), 0)
        used[_dev_prefix(bus)] = index + 1
        return disk_target_dev(bus, index)

    devices.append(disk_element(config.disk_path, config.disk_format, config.disk_bus, next_dev(config.disk_bus),
                                config.disk_backing))
    for disk in config.data_disks:
        devices.append(disk_element(disk.path, disk.format, disk.bus, next_dev(disk.bus)))
    if config.cdrom_path is not None:
        devices.append(cdrom_element(config.cdrom_path, config.cdrom_bus, next_dev(config.cdrom_bus)))
    if "scsi" in (config.disk_bus, *(disk.bus for disk in config.data_disks)) or \
            (config.cdrom_path is not None and config.cdrom_bus == "scsi"):
        devices.append(scsi_controller_element())
    for interface in config.interfaces:
        devices.append(interface_element(interface))
    if config.serial_log_path is not None:
        devices.append(serial_log_element(config.serial_log_path))
    if config.guest_agent:
        devices.append(guest_agent_element())
    return devices


def disk_element(path: str, disk_format: str, bus: str, dev: str, backing: BackingFile | None = None) -> ET.Element:
    """A file-backed <disk device='disk'> on `bus` as `dev`, with its whole backing chain when `backing` is given:
    the base, its DAC label left alone, and the empty <backingStore/> that says the chain ends there."""
    disk = ET.Element("disk", type="file", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type=disk_format)
    ET.SubElement(disk, "source", file=path)
    if backing is not None:
        store = ET.SubElement(disk, "backingStore", type="file")
        ET.SubElement(store, "format", type=backing.format)
        source = ET.SubElement(store, "source", file=backing.path)
        ET.SubElement(source, "seclabel", model="dac", relabel="no")
        ET.SubElement(store, "backingStore")
    ET.SubElement(disk, "target", dev=dev, bus=bus)
    return disk


def cdrom_element(path: str, bus: str, dev: str) -> ET.Element:
    """A read-only raw <disk device='cdrom'> (the NoCloud seed ISO)."""
    cdrom = ET.Element("disk", type="file", device="cdrom")
    ET.SubElement(cdrom, "driver", name="qemu", type="raw")
    ET.SubElement(cdrom, "source", file=path)
    ET.SubElement(cdrom, "target", dev=dev, bus=bus)
    ET.SubElement(cdrom, "readonly")
    return cdrom


def scsi_controller_element() -> ET.Element:
    """A virtio-scsi controller: without it libvirt picks an LSI controller, which q35 guests and QEMU often lack."""
    return ET.Element("controller", type="scsi", index="0", model="virtio-scsi")


def interface_element(interface: Interface) -> ET.Element:
    """<interface type='network'|'bridge'> with its MAC, source and model."""
    if interface.network is not None:
        element = ET.Element("interface", type="network")
        source = {"network": interface.network}
    else:
        element = ET.Element("interface", type="bridge")
        source = {"bridge": str(interface.bridge)}
    ET.SubElement(element, "mac", address=interface.mac)
    ET.SubElement(element, "source", source)
    ET.SubElement(element, "model", type=interface.model)
    if interface.traffic is not None:
        element.append(filterref_element(interface.traffic))
    return element


def serial_log_element(path: str) -> ET.Element:
    """Serial port 0 written to a file; appending keeps earlier boots' output (cloud-init's) across power cycles.

    No <console> is written: libvirt derives one from serial port 0 itself, and a console of another type would
    contradict it.
    """
    serial = ET.Element("serial", type="file")
    ET.SubElement(serial, "source", path=path, append="on")
    ET.SubElement(serial, "target", port="0")
    return serial


def guest_agent_element() -> ET.Element:
    """The virtio-serial channel of the QEMU guest agent; libvirt chooses the host-side socket path."""
    channel = ET.Element("channel", type="unix")
    ET.SubElement(channel, "target", type="virtio", name=GUEST_AGENT_CHANNEL)
    return channel


def disk_target_dev(bus: str, index: int) -> str:
    """The guest device name of the `index`-th disk on `bus`: vda, sda, sdb, hda, ..."""
    if not 0 <= index < 26:
        raise ValueError(f"disk index must be within 0..25, not {index}")
    return _dev_prefix(bus) + chr(ord("a") + index)


def _dev_prefix(bus: str) -> str:
    prefixes = {"virtio": "vd", "scsi": "sd", "sata": "sd", "ide": "hd"}
    if bus not in prefixes:
        raise ValueError(f"unknown disk bus {bus!r}")
    return prefixes[bus]
