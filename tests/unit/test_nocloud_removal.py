"""The NoCloud ISO leaves the host once the node joined: the eject's device XML (pure), the reconcile phase's decisions
with the in-memory host (when it asks the host, what it records, that a crash between eject and delete converges, that a
failure is no provisioning failure), and the orphan rules for a domain whose CD-ROM is already empty."""

from __future__ import annotations

import types
import xml.etree.ElementTree as ET

import pytest

from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core import (
    capi_objects,
    cloud_init,
    domain_xml_edits,
    naming,
    nocloud,
    orphans,
    outage,
)
from capi_libvirt.core.domain_owner import Owner
from capi_libvirt.hypervisor import errors, machines
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv.memory_host import MemoryHost, MemoryHosts
from devenv.memory_state import Domain

pytestmark = pytest.mark.unit

UID = "0b3c3f4e-8f0e-4d7a-9a51-2f1c1c7e5d10"
POOL = "/var/lib/libvirt/images"
ISO = naming.nocloud_volume_name("ns", "m0", UID)
OVERLAY = naming.overlay_volume_name("ns", "m0", UID)


def domain(cdrom_source: str | None, *, live: bool = False) -> str:
    """A domain XML as libvirt returns it, its CD-ROM holding `cdrom_source` (None: empty); `live` adds what only a
    running domain's XML has (alias, an empty backingStore)."""
    source = f"<source file='{cdrom_source}'/>" if cdrom_source else ""
    extras = "<backingStore/><alias name='scsi0-0-0-0'/>" if live else ""
    return (f"<domain type='qemu'><name>d</name><devices>"
            f"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{POOL}/{OVERLAY}'/>"
            f"<target dev='vda' bus='virtio'/></disk>"
            f"<disk type='file' device='cdrom'><driver name='qemu' type='raw'/>{source}{extras}"
            f"<target dev='sda' bus='scsi'/><readonly/><address type='drive' controller='0' bus='0' target='0' "
            f"unit='0'/></disk></devices></domain>")


# -- the eject's device XML -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("live", [False, True])
def test_the_eject_is_the_cdrom_itself_without_its_source_so_libvirt_finds_the_same_device(live: bool) -> None:
    ejected = domain_xml_edits.ejected_cdrom_xml(domain(f"{POOL}/{ISO}", live=live), ISO)
    assert ejected is not None
    disk = ET.fromstring(ejected)
    assert (disk.tag, disk.get("device"), disk.get("type")) == ("disk", "cdrom", "file")
    assert disk.find("source") is None and disk.find("backingStore") is None and disk.find("alias") is None
    assert disk.find("target").attrib == {"dev": "sda", "bus": "scsi"}
    assert disk.find("readonly") is not None and disk.find("driver").get("type") == "raw"
    assert disk.find("address").get("unit") == "0"


def test_nothing_to_eject_when_the_drive_is_empty_or_holds_another_file() -> None:
    assert domain_xml_edits.ejected_cdrom_xml(domain(None), ISO) is None
    assert domain_xml_edits.ejected_cdrom_xml(domain(f"{POOL}/someone-elses.iso"), ISO) is None
    assert domain_xml_edits.ejected_cdrom_xml(domain(f"{POOL}/{ISO}.bak"), ISO) is None  # the exact name, not a prefix


def test_cdrom_sources_lists_the_files_in_the_drives_only() -> None:
    assert domain_xml_edits.cdrom_sources(domain(f"{POOL}/{ISO}")) == [f"{POOL}/{ISO}"]
    assert domain_xml_edits.cdrom_sources(domain(None)) == []
    # A running domain's drive after a forced eject: libvirt keeps a <source> without a file.
    emptied = domain(f"{POOL}/{ISO}", live=True).replace(f"<source file='{POOL}/{ISO}'/>", "<source index='2'/>")
    assert domain_xml_edits.cdrom_sources(emptied) == [] and domain_xml_edits.ejected_cdrom_xml(emptied, ISO) is None


# -- the phase, on the in-memory host ------------------------------------------------------------------------------------------

def phase_pass(*, node_ref: bool = True, keep: bool = False, inserted: bool = True, recorded: bool = False,
               deleted: bool = True, error: errors.HypervisorError | None = None):
    """The phase's pass over the in-memory host kvm1, whose running domain's CD-ROM holds the ISO (`inserted`), whose
    pool still has the ISO's volume (`deleted`: there to delete), and whose eject raises `error`."""
    host, events = MemoryHost("kvm1"), []
    host.pools["default"].path = POOL
    host.add_volume("default", OVERLAY)
    if deleted:
        host.add_volume("default", ISO, b"seed")
    info = machines.DomainInfo(uuid=naming.domain_uuid(UID), name="d", state="running",
                               xml=domain(f"{POOL}/{ISO}" if inserted else None, live=True))
    host.domains[info.uuid] = Domain(info.uuid, info.name, info.xml, info.state)
    if error is not None:
        host.fail("eject_nocloud", error)
    registry = host_api.HostRegistry({"kvm1": "memory:///system"}, factory=MemoryHosts(host))
    deps = machine_reconcile.Dependencies(
        kube=None, inventory=types.SimpleNamespace(registry=registry, hosts={}, state=lambda n: outage.HostState()),
        post_event=lambda body, kind, reason, message: events.append((kind, reason, message)))
    body = {"metadata": {"namespace": "ns", "name": "m0", "uid": UID, "annotations": {}},
            "spec": {"image": {"volume": "base.qcow2"}, "keepNoCloudISO": keep}}
    machine = {"metadata": {"name": "m0"}, "status": {"nodeRef": {"name": "m0"}} if node_ref else {}}
    p = machine_reconcile.MachinePass(body=body, spec=v1alpha1.LibvirtMachineSpec.model_validate(body["spec"]),
                                      status={"noCloudISORemoved": True} if recorded else {}, machine=capi_objects.MachineView.of(machine),
                                      host="kvm1", domain=info)
    return deps, p, host, events


def asked(host: MemoryHost) -> list[str]:
    return [name for name, _ in host.asked]


async def test_once_the_machine_has_a_node_ref_the_iso_is_removed_recorded_and_a_normal_event_says_so() -> None:
    deps, p, host, events = phase_pass()
    await machine_reconcile.remove_nocloud_iso(deps, p)
    assert asked(host) == ["eject_nocloud", "delete_nocloud"]  # in this order: never a domain pointing at no file
    assert p.status["noCloudISORemoved"] is True
    assert ISO not in host.volume_names("default") and OVERLAY in host.volume_names("default")
    assert domain_xml_edits.cdrom_sources(host.domains[naming.domain_uuid(UID)].xml) == []
    [(kind, reason, message)] = events
    assert (kind, reason) == ("Normal", reasons.NOCLOUD_ISO_REMOVED)
    assert "ejected from the domain (live and persistent)" in message and f"volume {ISO} deleted" in message
    assert "kvm1" in message


@pytest.mark.parametrize("case", [{"node_ref": False}, {"inserted": False, "recorded": True}])
async def test_the_host_is_not_asked_before_the_node_joined_nor_once_done(case) -> None:
    deps, p, host, events = phase_pass(**case)
    before = dict(p.status)
    await machine_reconcile.remove_nocloud_iso(deps, p)
    assert asked(host) == [] and events == [] and p.status == before


async def test_keep_nocloud_iso_keeps_it_and_says_so_once_the_node_joined() -> None:
    deps, p, host, events = phase_pass(keep=True)
    await machine_reconcile.remove_nocloud_iso(deps, p)
    assert asked(host) == [] and events == [] and p.status == {"noCloudISORemoved": False}


async def test_an_iso_put_back_after_it_was_recorded_removed_is_removed_again() -> None:
    deps, p, host, _ = phase_pass(inserted=True, recorded=True)  # the domain was defined anew, with a fresh ISO
    await machine_reconcile.remove_nocloud_iso(deps, p)
    assert asked(host) == ["eject_nocloud", "delete_nocloud"]


async def test_a_crash_between_eject_and_delete_converges_ejected_but_unrecorded_asks_the_host_again() -> None:
    deps, p, host, events = phase_pass(inserted=False, recorded=False)
    await machine_reconcile.remove_nocloud_iso(deps, p)
    assert asked(host) == ["eject_nocloud", "delete_nocloud"] and p.status["noCloudISORemoved"] is True
    [(_, reason, message)] = events
    assert reason == reasons.NOCLOUD_ISO_REMOVED and "ejected" not in message and "deleted" in message
    # A moved copy (no status) whose ISO is long gone: the host has nothing to do, so no event either.
    deps, p, host, events = phase_pass(inserted=False, recorded=False, deleted=False)
    await machine_reconcile.remove_nocloud_iso(deps, p)
    assert len(host.asked) == 2 and p.status["noCloudISORemoved"] is True and events == []


async def test_a_refused_eject_is_a_warning_and_no_provisioning_failure_the_next_pass_tries_again() -> None:
    deps, p, host, events = phase_pass(error=errors.HypervisorError("update device: tray locked", "kvm1"))
    await machine_reconcile.remove_nocloud_iso(deps, p)  # no Wait, no HypervisorError: Provisioned stays True
    assert "noCloudISORemoved" not in p.status
    [(kind, reason, message)] = events
    assert (kind, reason) == ("Warning", reasons.NOCLOUD_ISO_NOT_REMOVED) and "tray locked" in message


async def test_an_unreachable_host_is_the_passes_problem_as_for_every_phase() -> None:
    deps, p, _, _ = phase_pass(error=errors.HostUnreachable("connection refused", "kvm1"))
    with pytest.raises(errors.HostUnreachable):
        await machine_reconcile.remove_nocloud_iso(deps, p)


def test_the_phase_runs_after_the_address_is_known() -> None:
    phases = machine_reconcile.PHASES
    assert phases.index(machine_reconcile.remove_nocloud_iso) > phases.index(machine_reconcile.observe_addresses)


def test_keep_nocloud_iso_is_false_unless_set() -> None:
    spec = v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "b"}})
    assert spec.keep_nocloud_iso is False
    assert v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "b"}, "keepNoCloudISO": True}).keep_nocloud_iso


# -- orphans of a machine whose ISO is gone -------------------------------------------------------------------------

def test_an_orphan_with_an_empty_cdrom_takes_its_overlay_along_and_an_iso_left_behind_is_only_reported() -> None:
    owner = Owner(namespace="ns", name="m0", uid=UID, management_cluster="me")
    orphan = orphans.HostDomain(uuid=naming.domain_uuid(UID), name=naming.domain_name("ns", "m0", UID), owner=owner,
                                paths=domain_xml_edits.disk_paths(domain(None)))
    found = orphans.find([orphan], "me", orphans.Claims(), volume_names=[OVERLAY, ISO])
    [(domain_found, paths)] = found.orphans
    assert domain_found == orphan and paths == {f"{POOL}/{OVERLAY}"}
    assert found.stray_volumes == (ISO,)  # ejected, not yet deleted: reported, never removed without proof


# -- cloud-init stays off once its seed is gone ------------------------------------------------------------------

def test_the_vendor_data_is_a_shell_script_that_disables_cloud_init_from_the_next_boot() -> None:
    script = cloud_init.DISABLE_AFTER_FIRST_BOOT.decode()
    assert script.startswith("#!/bin/sh\n")  # cloud-init runs a vendor-data script once per instance (scripts-vendor)
    commands = [line for line in script.splitlines()[1:] if line and not line.startswith("#")]
    assert commands == ["touch /etc/cloud/cloud-init.disabled"]  # the file cloud-init's systemd generator checks


def test_the_seed_carries_the_vendor_data_when_given_and_none_otherwise() -> None:
    import io

    import pycdlib

    def files(image: bytes) -> dict[str, bytes]:
        iso = pycdlib.PyCdlib()
        iso.open_fp(io.BytesIO(image))
        found = {}
        for child in iso.list_children(rr_path="/"):
            if child.is_file():
                out = io.BytesIO()
                iso.get_file_from_iso_fp(out, rr_path="/" + child.rock_ridge.name().decode())
                found[child.rock_ridge.name().decode()] = out.getvalue()
        return found

    with_it = files(nocloud.build_nocloud_iso(b"#cloud-config\n", b"instance-id: x\n",
                                              vendor_data=cloud_init.DISABLE_AFTER_FIRST_BOOT))
    assert with_it["vendor-data"] == cloud_init.DISABLE_AFTER_FIRST_BOOT
    assert "vendor-data" not in files(nocloud.build_nocloud_iso(b"#cloud-config\n", b"instance-id: x\n"))
