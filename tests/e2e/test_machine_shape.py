"""A machine's shape on real parts, one booted guest proving it all: UEFI firmware, Ignition bootstrap data through
fw_cfg, a data disk, a CPU topology and a named CPU model, read back from inside the guest through its QEMU guest
agent; then deleted with nothing left on the host (domain, volumes, the UEFI variable store). Beside it, a machine
asking for a CPU model the host cannot run is refused by name before anything is made. Once the node joined (the
Machine's nodeRef, set by the test in Cluster API's place), the Ignition config leaves the domain's definition and
the host, the guest running on.

Real kube-apiserver, real libvirtd (a host of this test's own, in its network namespace), the cached minimal guest
image booted by OVMF through direct kernel boot (the kernel's EFI stub: a real UEFI boot), the operator in the test's
event loop.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import libvirt
import pytest
from kubernetes_asyncio import client

import guest_agent
from capi_libvirt.api import meta, reasons
from capi_libvirt.core import naming
from devenv import base_image, capi_objects
from devenv.guest_image import GuestImage
from devenv.libvirt_host import LibvirtHost
from guests import host_objects, machine_spec, provider_objects, read_volume

from fixtures_control_plane import operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require
from waiting import events_posted, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SUBNET = "192.168.188.0/24"
PROVISION_DEADLINE_S = 600.0  # TCG boot on a busy 2-core CI machine
DELETE_DEADLINE_S = 120.0
DATA_DISK_GIB = 1
TOPOLOGY = {"sockets": 1, "cores": 2, "threads": 1}  # libvirt's default for 2 vCPUs would be 2 sockets of 1 core
CPU_MODEL = "qemu64"  # usable under TCG
UNUSABLE_MODEL = "Skylake-Client"  # TCG lacks its features: the host cannot run it
FW_CFG_RAW = "/sys/firmware/qemu_fw_cfg/by_name/opt/com.coreos/config/raw"


@pytest.fixture(scope="module")
def shape_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibvirtHost]:
    require_libvirt_host_prerequisites()
    require(pathlib.Path("/usr/share/qemu/firmware").is_dir() and
            any(pathlib.Path("/usr/share/qemu/firmware").glob("*edk2-x86_64*.json")),
            "OVMF and its firmware descriptors (apt: ovmf)")
    with LibvirtHost("shape-e2e", SUBNET, log_dir=tmp_path_factory.mktemp("shape-host")) as host:
        yield host


def nvram_path(host: LibvirtHost, live_xml: str) -> pathlib.Path:
    """The domain's UEFI variable store, as the test sees it: libvirt's /var/lib/libvirt is the host's state folder."""
    nvram = ET.fromstring(live_xml).findtext("os/nvram")
    assert nvram and nvram.startswith("/var/lib/libvirt/"), live_xml
    return host.state_dir / "lib" / pathlib.PurePosixPath(nvram).relative_to("/var/lib/libvirt")


def cpu_layout(cpuinfo: str) -> dict[str, object]:
    """Processors, sockets, cores per socket, threads per core and model name, from /proc/cpuinfo."""
    blocks = [dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
              for block in cpuinfo.strip().split("\n\n")]
    blocks = [{key.strip(): value.strip() for key, value in block.items()} for block in blocks]
    cores, siblings = int(blocks[0]["cpu cores"]), int(blocks[0]["siblings"])
    return {"processors": len(blocks), "sockets": len({b["physical id"] for b in blocks}), "cores": cores,
            "threads": siblings // cores, "model": blocks[0]["model name"]}


async def test_uefi_ignition_data_disk_and_cpu_topology_in_one_guest_and_nothing_left(
        control_plane, api_client, namespace, shape_host, guest_image: GuestImage, caplog):
    objects = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    with shape_host.connect() as conn:
        base = base_image.upload_base_image(conn, shape_host.pool_name, guest_image)
    marker = f"marker-{uuid.uuid4().hex[:12]}"
    ignition = json.dumps({"ignition": {"version": "3.4.0"}, "storage": {"files": [
        {"path": "/etc/capi-marker", "contents": {"source": f"data:,{marker}"}}]}}, separators=(",", ":"))
    # domainType qemu: the CPU models are TCG's (this machine's /dev/kvm, which the default kvm domain type would ask,
    # reports a CPU that even qemu64 is blocked on).
    spec = {**machine_spec(shape_host, guest_image, base), "domainType": "qemu", "cpus": 2, "firmware": "uefi",
            "dataDisks": [{"sizeGiB": DATA_DISK_GIB}], "cpuTopology": TOPOLOGY, "cpuModel": CPU_MODEL}
    # An Ignition guest runs no cloud-init (there is no NoCloud seed to find): the minimal image's is turned off, which
    # spares a minute of Python under TCG.
    spec["kernelBoot"] = {**spec["kernelBoot"], "cmdline": spec["kernelBoot"]["cmdline"] + " cloud-init=disabled"}
    await capi_objects.create_cluster(api_client, namespace, "shape")
    made = await capi_objects.create_machine(api_client, namespace, "shape", f"uefi-{uuid.uuid4().hex[:6]}", ignition,
                                             spec, bootstrap_format="ignition")
    refused = await capi_objects.create_machine(api_client, namespace, "shape", f"skylake-{uuid.uuid4().hex[:6]}",
                                                capi_objects.marker_user_data(marker),
                                                {**spec, "cpuModel": UNUSABLE_MODEL, "dataDisks": []})

    async def get(name: str) -> dict:
        return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    async with operator_running(control_plane, {shape_host.name: shape_host.uri}):
        started = time.monotonic()

        async def provisioned():
            body = await get(made.libvirt_machine)
            return body if body.get("status", {}).get("initialization", {}).get("provisioned") else None

        async def defined():
            body = await get(made.libvirt_machine)
            return body if body.get("status", {}).get("state") == "running" else None

        body = await wait_until("the UEFI machine's domain running", defined, PROVISION_DEADLINE_S)
        uid = body["metadata"]["uid"]
        domain_uuid = naming.domain_uuid(uid)
        with shape_host.connect() as conn:
            live_xml = conn.lookupByUUIDString(domain_uuid).XMLDesc(0)
            data_volume = naming.data_disk_volume_name(namespace, made.libvirt_machine, uid, 0)
            data_capacity = conn.storagePoolLookupByName(shape_host.pool_name).storageVolLookupByName(
                data_volume).info()[1]
        nvram = nvram_path(shape_host, live_xml)
        assert nvram.is_file(), "the domain's own UEFI variable store"
        assert data_capacity == DATA_DISK_GIB * 1024**3
        # The Ignition config is a fw_cfg file of the domain, never a NoCloud CD-ROM.
        root = ET.fromstring(live_xml)
        assert [entry.get("name") for entry in root.findall("sysinfo[@type='fwcfg']/entry")] == \
            ["opt/com.coreos/config"]
        assert not [disk for disk in root.findall("devices/disk") if disk.get("device") == "cdrom"]

        # Inside the guest, through its agent.
        def inside(script: str) -> bytes:
            return guest_agent.guest_output(shape_host, domain_uuid, script)
        await wait_until("the guest agent", lambda: asyncio.to_thread(guest_agent.agent_answers, shape_host,
                                                                      domain_uuid), PROVISION_DEADLINE_S, 2.0)
        agent_s = time.monotonic() - started
        efi = await asyncio.to_thread(inside, "ls /sys/firmware/efi")
        fw_cfg = await asyncio.to_thread(inside, f"modprobe qemu_fw_cfg 2>/dev/null; cat {FW_CFG_RAW}")
        sectors = await asyncio.to_thread(inside, "cat /sys/block/vdb/size")
        cpus = cpu_layout((await asyncio.to_thread(inside, "cat /proc/cpuinfo")).decode())
        body = await wait_until("the UEFI machine provisioned", provisioned, PROVISION_DEADLINE_S)
        provisioned_s = time.monotonic() - started
        assert [a for a in body["status"]["addresses"] if a["type"] == "InternalIP"], body["status"]
        # Booted by UEFI firmware, not SeaBIOS: the kernel has the EFI system table (ls exits 0 only when it exists).
        assert {b"systab", b"fw_platform_size"} & set(efi.split()), efi
        assert fw_cfg == ignition.encode(), "the fw_cfg file is the bootstrap Secret's value, byte for byte"
        assert int(sectors) * 512 == DATA_DISK_GIB * 1024**3
        assert cpus == {"processors": 2, **TOPOLOGY, "model": cpus["model"]}, cpus
        assert cpus["model"].startswith("QEMU Virtual CPU"), cpus  # qemu64's model name
        print(f"\n[numbers] UEFI guest (2 vCPUs as {TOPOLOGY}, {CPU_MODEL}, 256 MiB, TCG): guest agent answering "
              f"after {agent_s:.1f}s, provisioned (address) after {provisioned_s:.1f}s; /sys/firmware/efi: "
              f"{efi.decode().split()}; fw_cfg {len(fw_cfg)} bytes equal to the Secret's value; /dev/vdb "
              f"{int(sectors) * 512} bytes; /proc/cpuinfo {cpus}; NVRAM {nvram.name}")

        # The node joined (Cluster API's part, a stand-in here: the Machine's nodeRef): the Ignition config, with the
        # join token, leaves the domain's definition and the host; the guest runs on, not restarted.
        with shape_host.connect() as conn:
            domain_id = conn.lookupByUUIDString(domain_uuid).ID()
        await objects.patch_namespaced_custom_object_status(
            meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "machines", made.machine,
            {"status": {"nodeRef": {"name": naming.hostname(made.machine)}}},
            _content_type="application/merge-patch+json")

        async def ignition_removed():
            status = (await get(made.libvirt_machine)).get("status") or {}
            return status if status.get("ignitionConfigRemoved") else None
        await wait_until("the Ignition config removed", ignition_removed, 120)
        ignition_volume = naming.ignition_volume_name(namespace, made.libvirt_machine, uid)
        with shape_host.connect() as conn:
            domain = conn.lookupByUUIDString(domain_uuid)
            persistent = ET.fromstring(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
            running_id = domain.ID()
        assert persistent.find("sysinfo[@type='fwcfg']") is None, "the next start comes without the config"
        # Emptied, not deleted, while the guest runs (hypervisor.machines.drop_ignition): every byte is now zero.
        with shape_host.connect() as conn:
            emptied = conn.storagePoolLookupByName(shape_host.pool_name).storageVolLookupByName(ignition_volume)
            size = emptied.info()[1]
            assert size > 0 and read_volume(conn, emptied) == bytes(size), "the config is gone from the host"
        assert running_id == domain_id, "the guest was not restarted"
        [removed] = await events_posted(core, namespace, reasons.IGNITION_CONFIG_REMOVED,
                                        f"involvedObject.name={made.libvirt_machine}")
        assert "taken out of the domain's definition" in removed.message and f"{ignition_volume} emptied" in removed.message

        # The machine whose CPU model the host cannot run: refused by name, nothing made for it.
        async def refusal():
            status = (await get(refused.libvirt_machine)).get("status") or {}
            provisioned = {c["type"]: c for c in status.get("conditions") or []}.get("Provisioned") or {}
            return provisioned if provisioned.get("reason") == "CPUModelNotSupported" else None

        condition = await wait_until("the CPU model refusal", refusal, 120)
        assert UNUSABLE_MODEL in condition["message"] and shape_host.name in condition["message"], condition
        refused_uid = (await get(refused.libvirt_machine))["metadata"]["uid"]
        assert host_objects(shape_host, naming.domain_uuid(refused_uid), [
            naming.overlay_volume_name(namespace, refused.libvirt_machine, refused_uid),
            naming.nocloud_volume_name(namespace, refused.libvirt_machine, refused_uid)]) == []

        # Bootstrap data never leaves its volume: not in the status, the events, or anything the operator logged.
        events = await core.list_namespaced_event(namespace)
        shown = str(await get(made.libvirt_machine)) + str(await get(refused.libvirt_machine)) + \
            str([(e.reason, e.message) for e in events.items])
        assert marker not in shown
        assert not [r for r in caplog.records if marker in r.getMessage()]

        for name in (made.libvirt_machine, refused.libvirt_machine):
            await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

        async def gone():
            names = {m["metadata"]["name"] for m in (await objects.list_namespaced_custom_object(
                meta.GROUP, meta.VERSION, namespace, "libvirtmachines"))["items"]}
            return not names & {made.libvirt_machine, refused.libvirt_machine}

        await wait_until("both LibvirtMachines gone (finalizers released)", gone, DELETE_DEADLINE_S)

    names = [naming.overlay_volume_name(namespace, made.libvirt_machine, uid),
             naming.data_disk_volume_name(namespace, made.libvirt_machine, uid, 0),
             naming.ignition_volume_name(namespace, made.libvirt_machine, uid),
             naming.nocloud_volume_name(namespace, made.libvirt_machine, uid),
             naming.serial_log_file_name(namespace, made.libvirt_machine, uid)]
    assert host_objects(shape_host, domain_uuid, names) == []
    assert provider_objects(shape_host, base) == [], "nothing of either machine on the host"
    assert not nvram.exists(), f"the UEFI variable store {nvram} was removed with the domain"
