"""The domain XML: parsed back, it has every configured element; hostile values stay inside their elements."""

from __future__ import annotations

import dataclasses
import pathlib
import xml.etree.ElementTree as ET

import pytest

from capi_libvirt.api import v1alpha1
from capi_libvirt.core import domain_xml_edits, naming
from capi_libvirt.core.domain_owner import METADATA_NAMESPACE, Owner, parse_owner
from capi_libvirt.core.domain_xml import (
    DEFAULT_TCG_TB_CACHE_MIB,
    BackingFile,
    DomainConfig,
    Interface,
    KernelBoot,
    domain_xml,
    from_spec,
)
from capi_libvirt.core.traffic_filter import TrafficFilter

pytestmark = pytest.mark.unit

GOLDEN = pathlib.Path(__file__).parent / "golden" / "domain_basic.xml"
UID = "0b3c3f4e-8f0e-4d7a-9a51-2f1c1c7e5d10"
UUID = "5d64ece4-dc73-59e8-9624-de2ce4c5a35e"
OWNER = Owner(namespace="default", name="worker-0", uid=UID, cluster="demo")
HOSTILE = "x<y>&z\"q'a]]>b ünï 名前 <!-- -->"


def basic_config(**changes: object) -> DomainConfig:
    config = DomainConfig(
        name="capi-default-worker-0-1a2b3c4d",
        uuid=UUID,
        title="default/worker-0",
        description="Cluster API machine default/worker-0",
        vcpus=2,
        memory_mib=2048,
        domain_type="kvm",
        machine_type="q35",
        cpu_mode="host-passthrough",
        disk_path="/var/lib/libvirt/images/capi-default-worker-0-1a2b3c4d.qcow2",
        disk_format="qcow2",
        disk_bus="virtio",
        cdrom_path="/var/lib/libvirt/images/capi-default-worker-0-1a2b3c4d-cidata.iso",
        interfaces=(Interface(mac="52:54:00:12:34:56", network="default"),),
        guest_agent=True,
        serial_log_path="/var/log/libvirt/qemu/capi-default-worker-0-1a2b3c4d.serial.log",
        owner=OWNER,
    )
    return dataclasses.replace(config, **changes)


def spec(**fields: object) -> v1alpha1.LibvirtMachineSpec:
    return v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "ubuntu-24.04.qcow2"}, **fields})


def spec_config(machine_spec: v1alpha1.LibvirtMachineSpec, owner: Owner = OWNER, **paths: object) -> DomainConfig:
    return from_spec(
        machine_spec,
        name="capi-default-worker-0-1a2b3c4d",
        uuid=UUID,
        disk_path="/pool/d.qcow2",
        iso_path="/pool/d-cidata.iso",
        serial_log_path="/logs/d.serial.log",
        owner=owner,
        **paths,  # type: ignore[arg-type]
    )


def parse(config: DomainConfig) -> ET.Element:
    return ET.fromstring(domain_xml(config))


def child(element: ET.Element, path: str) -> ET.Element:
    """The sub-element at `path`, which must be there."""
    found = element.find(path)
    assert found is not None, f"no {path} in <{element.tag}>"
    return found


def disks(root: ET.Element, device: str) -> list[ET.Element]:
    return [disk for disk in root.findall("devices/disk") if disk.get("device") == device]


# --- the whole document --------------------------------------------------------------------------------------------


def test_basic_config_matches_the_golden_file() -> None:
    assert domain_xml(basic_config()) == GOLDEN.read_text(), f"domain XML changed; if on purpose, rewrite {GOLDEN}"


def test_identity_size_and_lifecycle_elements() -> None:
    root = parse(basic_config())
    assert root.tag == "domain" and root.get("type") == "kvm"
    assert root.findtext("name") == "capi-default-worker-0-1a2b3c4d"
    assert root.findtext("uuid") == UUID
    assert root.findtext("title") == "default/worker-0"
    assert child(root, "memory").get("unit") == "MiB" and root.findtext("memory") == "2048"
    assert root.findtext("vcpu") == "2"
    assert child(root, "cpu").get("mode") == "host-passthrough"
    assert (root.findtext("on_poweroff"), root.findtext("on_reboot"), root.findtext("on_crash")) == (
        "destroy",
        "restart",
        "destroy",
    )


def test_no_cpu_element_when_cpu_mode_is_unset() -> None:
    assert parse(basic_config(cpu_mode=None)).find("cpu") is None


# --- disks ---------------------------------------------------------------------------------------------------------


def test_root_disk_is_qcow2_on_virtio_as_vda() -> None:
    (disk,) = disks(parse(basic_config()), "disk")
    assert disk.get("type") == "file"
    assert child(disk, "driver").attrib == {"name": "qemu", "type": "qcow2"}
    assert child(disk, "source").get("file") == basic_config().disk_path
    assert child(disk, "target").attrib == {"dev": "vda", "bus": "virtio"}


def test_root_disk_names_no_backing_chain_unless_given_one() -> None:
    (disk,) = disks(parse(basic_config()), "disk")
    assert disk.find("backingStore") is None, "libvirt finds the chain itself"


def test_a_shared_base_is_the_whole_backing_chain_with_dac_relabelling_off() -> None:
    config = basic_config(disk_backing=BackingFile("/images/base.qcow2", "qcow2"))
    (disk,) = disks(parse(config), "disk")
    store = child(disk, "backingStore")
    assert store.get("type") == "file"
    assert child(store, "format").get("type") == "qcow2"
    source = child(store, "source")
    assert source.get("file") == "/images/base.qcow2"
    assert child(source, "seclabel").attrib == {"model": "dac", "relabel": "no"}
    end = child(store, "backingStore")
    assert len(end) == 0 and not end.attrib, "an empty <backingStore/>: the base has no backing file"
    assert child(disk, "source").get("file") == config.disk_path, "the overlay stays the disk's own source"


def test_from_spec_passes_the_backing_file_to_the_root_disk_only() -> None:
    backing = BackingFile("/images/base.img", "raw")
    config = spec_config(spec(dataDisks=[{"sizeGiB": 1}]), disk_backing=backing,
                         data_disk_paths=("/pool/d-data-0.qcow2",))
    assert config.disk_backing == backing
    root, data = disks(parse(config), "disk")
    assert child(child(root, "backingStore"), "format").get("type") == "raw"
    assert data.find("backingStore") is None


@pytest.mark.parametrize("bus", ["scsi", "sata"])
def test_root_disk_on_scsi_or_sata_is_sda_and_the_cdrom_moves_to_sdb(bus: str) -> None:
    root = parse(basic_config(disk_bus=bus))
    (disk,) = disks(root, "disk")
    (cdrom,) = disks(root, "cdrom")
    assert child(disk, "target").attrib == {"dev": "sda", "bus": bus}
    assert child(cdrom, "target").attrib == {"dev": "sdb", "bus": "scsi"}


def test_cdrom_is_a_readonly_raw_iso_on_a_virtio_scsi_controller() -> None:
    root = parse(basic_config())
    (cdrom,) = disks(root, "cdrom")
    assert child(cdrom, "source").get("file") == basic_config().cdrom_path
    assert child(cdrom, "driver").attrib == {"name": "qemu", "type": "raw"}
    assert child(cdrom, "target").attrib == {"dev": "sda", "bus": "scsi"}
    assert cdrom.find("readonly") is not None
    controllers = root.findall("devices/controller")
    assert [c.attrib for c in controllers] == [{"type": "scsi", "index": "0", "model": "virtio-scsi"}]


def test_ide_cdrom_is_allowed_on_pc_machines_only() -> None:
    root = parse(basic_config(machine_type="pc-i440fx-8.2", cdrom_bus="ide"))
    (cdrom,) = disks(root, "cdrom")
    assert child(cdrom, "target").attrib == {"dev": "hda", "bus": "ide"}
    assert root.find("devices/controller") is None
    with pytest.raises(ValueError, match="IDE"):
        basic_config(machine_type="q35", cdrom_bus="ide")


def test_no_cdrom_and_no_controller_without_an_iso() -> None:
    root = parse(basic_config(cdrom_path=None))
    assert disks(root, "cdrom") == []
    assert root.find("devices/controller") is None


# --- boot ----------------------------------------------------------------------------------------------------------


def test_disk_boot_has_hvm_on_the_machine_type_and_boot_dev_hd() -> None:
    os = child(parse(basic_config()), "os")
    assert child(os, "type").attrib == {"machine": "q35"} and os.findtext("type") == "hvm"
    assert child(os, "boot").get("dev") == "hd"
    assert os.find("kernel") is None


def test_kernel_boot_has_kernel_initrd_cmdline_and_no_boot_device() -> None:
    boot = KernelBoot(kernel="/boot/vmlinuz", initrd="/boot/initrd.img", cmdline="root=/dev/vda rw console=ttyS0")
    os = child(parse(basic_config(kernel_boot=boot)), "os")
    assert (os.findtext("kernel"), os.findtext("initrd"), os.findtext("cmdline")) == (
        "/boot/vmlinuz",
        "/boot/initrd.img",
        "root=/dev/vda rw console=ttyS0",
    )
    assert os.find("boot") is None


def test_kernel_boot_without_initrd_has_no_initrd_element() -> None:
    os = child(parse(basic_config(kernel_boot=KernelBoot(kernel="/boot/vmlinuz", cmdline="quiet"))), "os")
    assert os.find("initrd") is None


# --- features ------------------------------------------------------------------------------------------------------


def test_qemu_domain_gets_the_tcg_tb_cache() -> None:
    root = parse(basic_config(domain_type="qemu", tcg_tb_cache_mib=64))
    assert root.get("type") == "qemu"
    cache = child(root, "features/tcg/tb-cache")
    assert cache.get("unit") == "MiB" and cache.text == "64"


def test_kvm_domain_has_no_tcg_features_and_refuses_them() -> None:
    root = parse(basic_config())
    assert root.find("features/tcg") is None
    assert root.find("features/acpi") is not None and root.find("features/apic") is not None
    with pytest.raises(ValueError, match="qemu"):
        basic_config(tcg_tb_cache_mib=64)


# --- interfaces ----------------------------------------------------------------------------------------------------


def test_network_and_bridge_interfaces_in_order_with_mac_source_and_model() -> None:
    interfaces = (
        Interface(mac="52:54:00:00:00:01", network="default"),
        Interface(mac="52:54:00:00:00:02", bridge="br0", model="e1000"),
    )
    network, bridge = parse(basic_config(interfaces=interfaces)).findall("devices/interface")
    assert network.get("type") == "network"
    assert child(network, "source").attrib == {"network": "default"}
    assert child(network, "mac").get("address") == "52:54:00:00:00:01"
    assert child(network, "model").get("type") == "virtio"
    assert bridge.get("type") == "bridge"
    assert child(bridge, "source").attrib == {"bridge": "br0"}
    assert child(bridge, "mac").get("address") == "52:54:00:00:00:02"
    assert child(bridge, "model").get("type") == "e1000"


@pytest.mark.parametrize("attachment", [{}, {"network": "default", "bridge": "br0"}])
def test_interface_needs_exactly_one_of_network_or_bridge(attachment: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Interface(mac="52:54:00:00:00:01", **attachment)


# --- serial log and guest agent ------------------------------------------------------------------------------------


def test_serial_log_is_a_file_serial_appending_on_port_0() -> None:
    root = parse(basic_config())
    (serial,) = root.findall("devices/serial")
    assert serial.get("type") == "file"
    assert child(serial, "source").attrib == {"path": basic_config().serial_log_path, "append": "on"}
    assert child(serial, "target").get("port") == "0"


def test_guest_agent_is_a_unix_channel_with_the_qemu_agent_name() -> None:
    (channel,) = parse(basic_config()).findall("devices/channel")
    assert channel.get("type") == "unix"
    assert child(channel, "target").attrib == {"type": "virtio", "name": "org.qemu.guest_agent.0"}


def test_no_serial_and_no_channel_when_not_asked() -> None:
    root = parse(basic_config(serial_log_path=None, guest_agent=False))
    assert root.find("devices/serial") is None and root.find("devices/channel") is None


# --- owner metadata ------------------------------------------------------------------------------------------------


def test_owner_is_stored_in_our_metadata_namespace() -> None:
    machine = child(parse(basic_config()), f"metadata/{{{METADATA_NAMESPACE}}}machine")
    assert {child.tag.split("}")[1]: child.text for child in machine} == {
        "namespace": "default",
        "name": "worker-0",
        "uid": UID,
        "cluster": "demo",
    }


def test_parse_owner_reads_back_the_owner() -> None:
    assert parse_owner(domain_xml(basic_config())) == OWNER


def test_parse_owner_reads_an_owner_without_cluster() -> None:
    owner = Owner(namespace="default", name="worker-0", uid=UID)
    assert parse_owner(domain_xml(basic_config(owner=owner))) == owner


def test_parse_owner_does_not_depend_on_the_prefix_libvirt_keeps() -> None:
    text = domain_xml(basic_config()).replace("capi:", "other:").replace("xmlns:capi=", "xmlns:other=")
    assert parse_owner(text) == OWNER


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("<domain type='kvm'><name>foreign</name></domain>", id="no-metadata"),
        pytest.param("<domain><metadata><x:machine xmlns:x='urn:other'/></metadata></domain>", id="other-namespace"),
        pytest.param(
            f"<domain><metadata><c:machine xmlns:c='{METADATA_NAMESPACE}'><c:name>n</c:name></c:machine>"
            "</metadata></domain>",
            id="incomplete",
        ),
    ],
)
def test_parse_owner_is_none_for_domains_that_are_not_ours(text: str) -> None:
    assert parse_owner(text) is None


def test_parse_owner_refuses_malformed_xml() -> None:
    with pytest.raises(ValueError, match="well-formed"):
        parse_owner("<domain><metadata>")


# --- hostile values ------------------------------------------------------------------------------------------------


def test_hostile_values_stay_escaped_and_read_back_equal() -> None:
    owner = Owner(namespace=HOSTILE, name=HOSTILE, uid=HOSTILE, cluster=HOSTILE)
    config = basic_config(
        owner=owner,
        title=HOSTILE,
        description=HOSTILE + "\nsecond line",
        disk_path="/pool/" + HOSTILE,
        cdrom_path="/pool/" + HOSTILE + ".iso",
        serial_log_path="/logs/" + HOSTILE,
        kernel_boot=KernelBoot(kernel="/k" + HOSTILE, cmdline=HOSTILE),
    )
    text = domain_xml(config)
    assert "]]>" not in text and "<!-- -->" not in text and "<y>" not in text
    root = ET.fromstring(text)
    assert parse_owner(text) == owner
    assert root.findtext("title") == HOSTILE
    assert root.findtext("description") == HOSTILE + "\nsecond line"
    assert root.findtext("os/cmdline") == HOSTILE
    assert child(disks(root, "disk")[0], "source").get("file") == "/pool/" + HOSTILE
    assert child(root, "devices/serial/source").get("path") == "/logs/" + HOSTILE
    # Nothing was injected: the document has exactly the elements of the plain config.
    plain = parse(basic_config(kernel_boot=KernelBoot(kernel="/k", cmdline="c")))
    assert [element.tag for element in root.iter()] == [element.tag for element in plain.iter()]


@pytest.mark.parametrize("bad", ["nul\x00", "bell\x07", "esc\x1b[31m"])
def test_characters_xml_cannot_carry_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="XML"):
        basic_config(description=bad)
    with pytest.raises(ValueError, match="XML"):
        Owner(namespace="ns", name=bad, uid=UID)


def test_multiline_title_is_refused() -> None:
    with pytest.raises(ValueError, match="single line"):
        basic_config(title="a\nb")


# --- from_spec (policy) --------------------------------------------------------------------------------------------


def test_from_spec_maps_size_hardware_and_paths() -> None:
    config = spec_config(spec(cpus=4, memoryMiB=8192, machineType="pc", cpuMode="host-model", diskBus="scsi"))
    assert (config.vcpus, config.memory_mib, config.machine_type, config.cpu_mode, config.disk_bus) == (
        4,
        8192,
        "pc",
        "host-model",
        "scsi",
    )
    assert (config.disk_path, config.disk_format, config.cdrom_path, config.cdrom_bus) == (
        "/pool/d.qcow2",
        "qcow2",
        "/pool/d-cidata.iso",
        "scsi",
    )
    assert config.serial_log_path == "/logs/d.serial.log"
    assert config.guest_agent is True
    assert config.owner == OWNER and config.uuid == UUID


def test_from_spec_derives_unset_macs_from_the_uid_and_keeps_fixed_ones_lowercased() -> None:
    config = spec_config(
        spec(
            interfaces=[
                {"network": "default"},
                {"bridge": "br0", "macAddress": "AA:BB:CC:DD:EE:FF", "model": "e1000"},
            ]
        )
    )
    first, second = config.interfaces
    # Every NIC carries the filter; with no address known up front, on a network: a DHCP client's until its lease.
    assert first == Interface(mac=naming.mac_address(UID, 0), network="default",
                              traffic=TrafficFilter(awaiting_lease=True))
    assert second == Interface(mac="aa:bb:cc:dd:ee:ff", bridge="br0", model="e1000", traffic=TrafficFilter())


@pytest.mark.parametrize("memory_mib, cache_mib", [(256, 256), (1024, 512), (2048, 1024), (8192, 1024)])
def test_from_spec_gives_qemu_domains_half_their_memory_as_tcg_cache_and_kvm_none(memory_mib, cache_mib) -> None:
    assert DEFAULT_TCG_TB_CACHE_MIB == 256
    assert spec_config(spec(domainType="qemu", memoryMiB=memory_mib)).tcg_tb_cache_mib == cache_mib
    assert spec_config(spec(domainType="kvm", memoryMiB=memory_mib)).tcg_tb_cache_mib is None


def test_from_spec_drops_the_serial_log_and_agent_when_the_spec_turns_them_off() -> None:
    config = spec_config(spec(serialLog=False, guestAgent=False))
    assert config.serial_log_path is None and config.guest_agent is False


def test_from_spec_maps_kernel_boot() -> None:
    config = spec_config(spec(kernelBoot={"kernel": "/boot/vmlinuz", "initrd": "/boot/initrd"}))
    assert config.kernel_boot == KernelBoot(
        kernel="/boot/vmlinuz", initrd="/boot/initrd", cmdline="root=/dev/vda rw console=ttyS0"
    )


def test_from_spec_titles_the_domain_with_namespace_and_name() -> None:
    config = spec_config(spec())
    assert config.title == "default/worker-0"
    assert "demo" in (config.description or "")


def _devices_xml(*parts: str) -> str:
    return f"<domain><devices>{''.join(parts)}</devices></domain>"


NETWORK_NIC = "<interface type='network'><source network='default'/></interface>"
BRIDGE_NIC = "<interface type='bridge'><source bridge='br0'/></interface>"
AGENT = "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0' state='{}'/></channel>"


@pytest.mark.parametrize("parts, expected", [
    ((NETWORK_NIC, AGENT.format("disconnected")), ["lease"]),
    ((NETWORK_NIC, AGENT.format("connected")), ["lease", "agent"]),
    ((BRIDGE_NIC,), ["arp"]),
    ((BRIDGE_NIC, AGENT.format("disconnected")), ["arp"]),
    # A connected agent may still not answer (a guest-side allow-list, a hung agent): ARP is asked after it.
    ((BRIDGE_NIC, AGENT.format("connected")), ["agent", "arp"]),
    ((NETWORK_NIC, BRIDGE_NIC), ["lease", "arp"]),
    ((NETWORK_NIC, BRIDGE_NIC, AGENT.format("connected")), ["lease", "agent", "arp"]),
    ((), []),
])
def test_addresses_are_asked_only_of_sources_that_can_answer(parts, expected) -> None:
    from capi_libvirt.hypervisor import machines

    assert machines.address_sources(_devices_xml(*parts)) == expected


def test_an_ignition_config_leaves_the_definition_and_nothing_else_does() -> None:
    """The fw_cfg entry naming the Ignition volume goes (with its <sysinfo> when nothing is left in it); an XML
    without it is left alone (None), and another fw_cfg entry stays."""
    xml = ("<domain><name>d</name><sysinfo type='fwcfg'>"
           "<entry name='opt/com.coreos/config' file='/pool/capi-ns-m-1234.ign'/>"
           "<entry name='opt/other' file='/pool/other'/></sysinfo><devices/></domain>")
    assert domain_xml_edits.fw_cfg_files(xml) == ["/pool/capi-ns-m-1234.ign", "/pool/other"]
    without = domain_xml_edits.without_fw_cfg_file_xml(xml, "capi-ns-m-1234.ign")
    assert without is not None and domain_xml_edits.fw_cfg_files(without) == ["/pool/other"]
    assert domain_xml_edits.without_fw_cfg_file_xml(without, "capi-ns-m-1234.ign") is None
    only = domain_xml_edits.without_fw_cfg_file_xml(
        "<domain><sysinfo type='fwcfg'><entry name='opt/com.coreos/config' file='/p/x.ign'/></sysinfo></domain>",
        "x.ign")
    assert only is not None and "sysinfo" not in only
