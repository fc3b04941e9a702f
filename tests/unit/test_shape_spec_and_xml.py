"""A machine's shape: firmware, data disks, CPU topology and model, and Ignition bootstrap data through fw_cfg. The
model's validation, the domain XML they become, the names of their volumes (which teardown, tenancy and the orphan
collector know), and the reconcile phases that make them, against a fake host. The XML is also checked against
libvirt's schema in tests/integration/test_domain_xml_schema.py."""

from __future__ import annotations

import dataclasses
import types
import xml.etree.ElementTree as ET

import pydantic
import pytest

from capi_libvirt.api import crd, kinds, reasons, v1alpha1, v1alpha1_host
from capi_libvirt.core import capi_objects, domain_owner, domain_xml, domain_xml_edits, naming, orphans, tenancy
from capi_libvirt.kube import api
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv.memory_host import MemoryHost

pytestmark = pytest.mark.unit

UID = "0b3c3f4e-8f0e-4d7a-9a51-2f1c1c7e5d10"
OWNER = domain_owner.Owner(namespace="ns", name="m0", uid=UID, cluster="c1")


def spec(**fields: object) -> v1alpha1.LibvirtMachineSpec:
    return v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}, **fields})


def config(machine_spec: v1alpha1.LibvirtMachineSpec, **extra: object) -> domain_xml.DomainConfig:
    arguments: dict = {"name": "capi-ns-m0-1a2b3c4d", "uuid": naming.domain_uuid(UID), "disk_path": "/pool/d.qcow2",
                       "iso_path": "/pool/d-cidata.iso", "serial_log_path": "/pool/d.serial.log", "owner": OWNER,
                       "data_disk_paths": tuple(f"/pool/d-data-{i}.qcow2" for i in range(len(machine_spec.data_disks)))}
    return domain_xml.from_spec(machine_spec, **{**arguments, **extra})


def parse(machine_spec: v1alpha1.LibvirtMachineSpec, **extra: object) -> ET.Element:
    return ET.fromstring(domain_xml.domain_xml(config(machine_spec, **extra)))


# --- the model -----------------------------------------------------------------------------------------------------


def test_defaults_are_bios_no_data_disks_and_no_cpu_shape() -> None:
    model = spec()
    assert (model.firmware, model.data_disks, model.cpu_topology, model.cpu_model) == ("bios", [], None, None)
    root = parse(model)
    assert root.find("os").get("firmware") is None and root.find("os/firmware") is None
    assert root.find("cpu") is None and root.find("sysinfo") is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"cpus": 4, "cpuTopology": {"sockets": 1, "cores": 2, "threads": 1}}, v1alpha1.TOPOLOGY_MATCHES_CPUS),
    ({"cpuModel": "qemu64", "cpuMode": "host-model"}, v1alpha1.MODEL_OR_MODE),
    ({"firmware": "efi"}, "firmware"),
    ({"dataDisks": [{"sizeGiB": 1}] * (v1alpha1.MAX_DATA_DISKS + 1)}, "dataDisks"),
    ({"dataDisks": [{"sizeGiB": 0}]}, "sizeGiB"),
    ({"dataDisks": [{"sizeGiB": 1, "bus": "ide"}]}, "bus"),
    ({"cpuModel": "Sky lake"}, "cpuModel"),
    ({"cpuTopology": {"sockets": 0, "cores": 2, "threads": 1}, "cpus": 0}, "sockets"),
], ids=["topology-not-cpus", "model-and-mode", "unknown-firmware", "too-many-disks", "empty-disk", "ide-disk",
        "model-with-space", "zero-sockets"])
def test_the_model_refuses_shapes_no_domain_can_have(fields: dict, message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        spec(**fields)
    assert message in str(caught.value)


def test_the_crd_carries_the_same_rules_as_cel() -> None:
    schema = crd.custom_resource_definition(kinds.LIBVIRT_MACHINE)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    machine_spec = schema["properties"]["spec"]
    rules = {rule["message"]: rule["rule"] for rule in machine_spec["x-kubernetes-validations"]}
    assert "self.cpuTopology.sockets * self.cpuTopology.cores * self.cpuTopology.threads == self.cpus" in \
        rules[v1alpha1.TOPOLOGY_MATCHES_CPUS]
    assert rules[v1alpha1.MODEL_OR_MODE] == "!has(self.cpuModel) || !has(self.cpuMode)"
    assert machine_spec["properties"]["dataDisks"]["maxItems"] == v1alpha1.MAX_DATA_DISKS
    assert machine_spec["properties"]["firmware"]["enum"] == ["bios", "uefi"]


# --- the domain XML ------------------------------------------------------------------------------------------------


def test_uefi_is_libvirt_firmware_autoselection_without_secure_boot_and_names_no_host_file() -> None:
    root = parse(spec(firmware="uefi"))
    os_ = root.find("os")
    assert os_.get("firmware") == "efi"
    assert {(f.get("name"), f.get("enabled")) for f in os_.findall("firmware/feature")} == \
        {("secure-boot", "no"), ("enrolled-keys", "no")}
    assert os_.find("loader") is None and os_.find("nvram") is None, "libvirt picks the host's OVMF and NVRAM"
    assert root.find("features/acpi") is not None, "libvirt refuses UEFI without ACPI on x86"


def test_uefi_with_kernel_boot_keeps_the_kernel() -> None:
    root = parse(spec(firmware="uefi", kernelBoot={"kernel": "/k/vmlinuz", "initrd": "/k/initrd.img"}))
    assert root.findtext("os/kernel") == "/k/vmlinuz" and root.find("os").get("firmware") == "efi"


def test_data_disks_follow_the_root_disk_in_order_with_their_own_names() -> None:
    root = parse(spec(dataDisks=[{"sizeGiB": 1}, {"sizeGiB": 2, "bus": "scsi"}, {"sizeGiB": 3}]))
    disks = [(d.get("device"), d.find("source").get("file"), d.find("target").get("dev"), d.find("target").get("bus"))
             for d in root.findall("devices/disk")]
    assert disks == [("disk", "/pool/d.qcow2", "vda", "virtio"), ("disk", "/pool/d-data-0.qcow2", "vdb", "virtio"),
                     ("disk", "/pool/d-data-1.qcow2", "sda", "scsi"), ("disk", "/pool/d-data-2.qcow2", "vdc", "virtio"),
                     ("cdrom", "/pool/d-cidata.iso", "sdb", "scsi")]
    assert [c.get("model") for c in root.findall("devices/controller[@type='scsi']")] == ["virtio-scsi"]
    assert all(d.find("driver").get("type") == "qcow2" for d in root.findall("devices/disk[@device='disk']"))


def test_a_scsi_data_disk_alone_brings_its_controller() -> None:
    root = parse(spec(dataDisks=[{"sizeGiB": 1, "bus": "scsi"}]), iso_path=None)
    assert root.find("devices/controller[@type='scsi']") is not None


def test_data_disk_paths_must_match_the_spec() -> None:
    with pytest.raises(ValueError, match="data disks"):
        config(spec(dataDisks=[{"sizeGiB": 1}]), data_disk_paths=())


@pytest.mark.parametrize(("fields", "expected"), [
    ({"cpus": 4, "cpuTopology": {"sockets": 1, "cores": 2, "threads": 2}},
     ({}, None, {"sockets": "1", "cores": "2", "threads": "2"})),
    ({"cpus": 2, "cpuModel": "Skylake-Client", "cpuTopology": {"sockets": 2, "cores": 1, "threads": 1}},
     ({"mode": "custom", "match": "exact"}, ("Skylake-Client", "forbid"), {"sockets": "2", "cores": "1", "threads": "1"})),
    ({"cpuModel": "qemu64"}, ({"mode": "custom", "match": "exact"}, ("qemu64", "forbid"), None)),
    ({"cpus": 2, "cpuMode": "host-model", "cpuTopology": {"sockets": 1, "cores": 1, "threads": 2}},
     ({"mode": "host-model"}, None, {"sockets": "1", "cores": "1", "threads": "2"})),
], ids=["topology", "model-and-topology", "model", "mode-and-topology"])
def test_cpu_model_and_topology(fields: dict, expected: tuple) -> None:
    cpu = parse(spec(**fields)).find("cpu")
    attributes, model, topology = expected
    assert cpu.attrib == attributes
    assert (None if cpu.find("model") is None else (cpu.findtext("model"), cpu.find("model").get("fallback"))) == model
    assert (None if cpu.find("topology") is None else cpu.find("topology").attrib) == topology


def test_domain_config_refuses_a_topology_that_is_not_its_vcpus() -> None:
    with pytest.raises(ValueError, match="does not make 4 vcpus"):
        dataclasses.replace(config(spec(cpus=4)), cpu_topology=domain_xml.CPUTopology(1, 1, 2))


def test_ignition_becomes_the_fw_cfg_file_ignition_reads() -> None:
    root = parse(spec(), iso_path=None, ignition_path="/pool/d.ign")
    assert [(e.get("name"), e.get("file")) for e in root.findall("sysinfo[@type='fwcfg']/entry")] == \
        [("opt/com.coreos/config", "/pool/d.ign")]
    assert root.find("devices/disk[@device='cdrom']") is None
    assert "/pool/d.ign" in domain_xml_edits.disk_paths(domain_xml.domain_xml(config(spec(), ignition_path="/pool/d.ign")))


@pytest.mark.parametrize("name", ["com.coreos/config", "opt/" + "x" * 52])
def test_fw_cfg_names_are_under_opt_and_fit_qemu(name: str) -> None:
    with pytest.raises(ValueError, match="fw_cfg"):
        domain_xml.FwCfgEntry(name, "/f")


# --- names, tenancy, orphans ---------------------------------------------------------------------------------------


def test_volume_names_of_data_disks_and_the_ignition_config() -> None:
    domain = naming.domain_name("ns", "m0", UID)
    assert naming.data_disk_volume_name("ns", "m0", UID, 2) == f"{domain}-data-2.qcow2"
    assert naming.ignition_volume_name("ns", "m0", UID) == f"{domain}.ign"
    volumes = machine_reconcile.machine_volumes("ns", "m0", UID, "default", 2)
    assert volumes.all_names() == [f"{domain}.qcow2", f"{domain}-data-0.qcow2", f"{domain}-data-1.qcow2",
                                   f"{domain}-cidata.iso", f"{domain}.ign", f"{domain}.serial.log"]
    for name in volumes.all_names():
        assert tenancy.is_machine_volume(name), f"{name} must never be a tenant's base image"
        assert orphans.stray_volumes([name], []) == [name], f"{name} in the orphan collector's naming scheme"
        assert name in orphans.owned_volume_names(OWNER)


def test_an_orphans_data_disks_and_ignition_config_go_with_it() -> None:
    domain = naming.domain_name("ns", "m0", UID)
    xml = domain_xml.domain_xml(config(spec(dataDisks=[{"sizeGiB": 1}]), iso_path=None,
                                       name=domain, data_disk_paths=(f"/pool/{domain}-data-0.qcow2",),
                                       ignition_path=f"/pool/{domain}.ign"))
    orphan = orphans.HostDomain(uuid=naming.domain_uuid(UID), name=domain, owner=OWNER,
                                paths=domain_xml_edits.disk_paths(xml))
    assert {f"/pool/{domain}-data-0.qcow2", f"/pool/{domain}.ign"} <= orphans.removable_paths(orphan, [])


# --- the reconcile phases, against the in-memory host ---------------------------------------------------------------


def fake_host(cpu_models: dict[str, bool] | None = None) -> MemoryHost:
    """kvm1 in memory: its pool's folder /pool with the base image, its QEMU's machine types, the CPU models it lists
    (name -> usable)."""
    host = MemoryHost("kvm1", machine_types=("q35", "pc", "pc-q35-7.2"), cpu_models=cpu_models or {})
    host.pools["default"].path = "/pool"
    host.add_volume("default", "base.qcow2", capacity=1 << 30, fmt="qcow2")
    return host


def machine_pass(host: MemoryHost, bootstrap: api.BootstrapData | None, **fields: object):
    body = {"metadata": {"namespace": "ns", "name": "m0", "uid": UID, "resourceVersion": "1",
                         "annotations": {machine_reconcile.DOMAIN_RECORD_ANNOTATION: "kvm1"}},
            "spec": {"image": {"volume": "base.qcow2"}, **fields}}
    events: list[tuple[str, str, str]] = []
    deps = types.SimpleNamespace(
        hosts=types.SimpleNamespace(get=lambda name: host), management_cluster="mc",
        inventory=types.SimpleNamespace(refusal=lambda *args: None),
        post_event=lambda body, kind, reason, message: events.append((kind, reason, message)))
    p = machine_reconcile.MachinePass(body=body, spec=spec(**fields), status={}, bootstrap=bootstrap, host="kvm1",
                                      cluster=capi_objects.ClusterView(name="c1"))
    return deps, p, events


async def test_ignition_bootstrap_data_is_uploaded_as_is_and_handed_over_by_fw_cfg_not_nocloud() -> None:
    host = fake_host()
    deps, p, _ = machine_pass(host, api.BootstrapData(value=b'{"ignition":{"version":"3.4.0"}}', format="ignition"))
    await machine_reconcile.ensure_domain(deps, p)
    names = [name for name, _ in host.asked]
    assert "replace_ignition" in names and "replace_nocloud" not in names
    (uploaded,) = [args for name, args in host.asked if name == "replace_ignition"]
    assert uploaded[1] == b'{"ignition":{"version":"3.4.0"}}'
    (defined,) = [args for name, args in host.asked if name == "define_domain"]
    root = ET.fromstring(defined[1])
    assert root.find("sysinfo/entry").get("file") == f"/pool/{naming.ignition_volume_name('ns', 'm0', UID)}"
    assert "3.4.0" not in defined[1], "the config itself stays in its file, never in the domain XML"


async def test_cloud_config_still_rides_the_nocloud_iso() -> None:
    host = fake_host()
    deps, p, _ = machine_pass(host, api.BootstrapData(value=b"#cloud-config\n", format="cloud-config"))
    await machine_reconcile.ensure_domain(deps, p)
    names = [name for name, _ in host.asked]
    assert "replace_nocloud" in names and "replace_ignition" not in names


async def test_data_disks_are_made_with_the_root_disk() -> None:
    host = fake_host()
    deps, p, _ = machine_pass(host, None, dataDisks=[{"sizeGiB": 3}, {"sizeGiB": 5, "bus": "sata"}])
    await machine_reconcile.ensure_overlay(deps, p)
    (made,) = [args for name, args in host.asked if name == "ensure_data_disks"]
    assert made[0].data_disks == (naming.data_disk_volume_name("ns", "m0", UID, 0),
                                  naming.data_disk_volume_name("ns", "m0", UID, 1))
    assert made[1] == [3, 5]


async def test_a_shareable_base_is_named_in_the_domain_with_libvirts_labelling_off() -> None:
    host = fake_host()
    deps, p, events = machine_pass(host, api.BootstrapData(value=b"#cloud-config\n", format="cloud-config"))
    await machine_reconcile.ensure_overlay(deps, p)
    await machine_reconcile.ensure_domain(deps, p)
    (defined,) = [args for name, args in host.asked if name == "define_domain"]
    source = ET.fromstring(defined[1]).find("devices/disk/backingStore/source")
    assert source is not None and source.get("file") == "/pool/base.qcow2"
    assert source.find("seclabel").attrib == {"model": "dac", "relabel": "no"}
    assert not [e for e in events if e[1] == reasons.BASE_IMAGE_LABELLED]


async def test_a_base_that_cannot_be_shared_as_it_is_is_left_to_libvirt_with_a_warning() -> None:
    host = fake_host()
    host.add_volume("default", "layered.qcow2", capacity=1 << 30, fmt="qcow2").backing = "/pool/base.qcow2"
    deps, p, events = machine_pass(host, api.BootstrapData(value=b"#cloud-config\n", format="cloud-config"))
    p.spec = spec(image={"volume": "layered.qcow2"})
    await machine_reconcile.ensure_overlay(deps, p)
    await machine_reconcile.ensure_domain(deps, p)
    (defined,) = [args for name, args in host.asked if name == "define_domain"]
    assert ET.fromstring(defined[1]).find("devices/disk/backingStore") is None
    [(kind, _reason, message)] = [e for e in events if e[1] == reasons.BASE_IMAGE_LABELLED]
    assert kind == "Warning" and "'layered.qcow2'" in message and "0644" in message


async def test_a_cpu_model_the_host_cannot_run_is_refused_by_name_and_not_retried() -> None:
    host = fake_host({"Skylake-Client": False, "qemu64": True, "Nehalem": True})
    deps, p, _ = machine_pass(host, None, cpuModel="Skylake-Client", domainType="qemu")
    with pytest.raises(machine_reconcile.Wait) as caught:
        await machine_reconcile.check_networks(deps, p)
    wait = caught.value
    assert wait.reason == reasons.CPU_MODEL_NOT_SUPPORTED and wait.retry_after is None and wait.failure
    assert "'Skylake-Client'" in wait.message and "kvm1 cannot run it" in wait.message and "qemu64" in wait.message
    assert ("cpu_models", ("Skylake-Client", "qemu", "q35")) in host.asked


async def test_an_unknown_cpu_model_says_so_and_a_usable_one_passes() -> None:
    unknown = fake_host({})
    deps, p, _ = machine_pass(unknown, None, cpuModel="NoSuchCPU")
    with pytest.raises(machine_reconcile.Wait, match="does not know it"):
        await machine_reconcile.check_networks(deps, p)
    usable = fake_host({"qemu64": True})
    deps, p, _ = machine_pass(usable, None, cpuModel="qemu64")
    await machine_reconcile.check_networks(deps, p)


def test_the_shape_names_nothing_of_the_host_a_tenant_could_reach_past_its_pool() -> None:
    """Data disks live in the machine's storagePool (the pool tenancy checks), UEFI names no firmware or NVRAM file,
    the Ignition file is the provider's own volume: a machine whose pool is not allowed is refused as before."""
    access = v1alpha1_host.HostAccess(images=["base.qcow2"])
    shaped = spec(firmware="uefi", dataDisks=[{"sizeGiB": 1}], cpuModel="qemu64", storagePool="other")
    refused = tenancy.refusal("kvm1", access, "default", "ns", shaped)
    assert refused is not None and refused.field == "storagePools"
    assert tenancy.refusal("kvm1", access, "default", "ns", spec(firmware="uefi", dataDisks=[{"sizeGiB": 1}],
                                                                   cpuModel="qemu64")) is None
    xml = domain_xml.domain_xml(config(spec(firmware="uefi", dataDisks=[{"sizeGiB": 1}]), iso_path=None,
                                       ignition_path="/pool/d.ign"))
    assert domain_xml_edits.disk_paths(xml) <= {"/pool/d.qcow2", "/pool/d-data-0.qcow2", "/pool/d.ign",
                                          "/pool/d.serial.log"}
    assert "/usr/share" not in xml and "nvram" not in xml
