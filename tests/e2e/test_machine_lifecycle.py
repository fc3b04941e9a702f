"""A LibvirtMachine's whole life on real parts: created as Cluster API would, booted, bootstrap data run, deleted clean.

Real kube-apiserver, real libvirtd in its network namespace, the cached guest image, the operator running in the
test's event loop.
"""

from __future__ import annotations

import base64
import pathlib
import time
import uuid
import xml.etree.ElementTree as ET

import pytest
from kubernetes_asyncio import client

import qemu_files
from capi_libvirt.api import meta
from capi_libvirt.core import conditions, naming
from capi_libvirt.hypervisor.connection import THREADS_PER_HOST
from devenv import capi_objects
from guests import host_objects, machine_spec

from fixtures_control_plane import operator_running
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROVISION_DEADLINE_S = 600.0  # TCG boot on a busy 2-core CI machine
DELETE_DEADLINE_S = 120.0


async def test_machine_boots_runs_its_bootstrap_data_and_is_deleted_without_a_trace(
        control_plane, api_client, namespace, libvirt_host, guest_image, base_image_volume, caplog):
    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    marker = f"marker-{uuid.uuid4().hex[:12]}"
    machine_name = f"worker-{uuid.uuid4().hex[:6]}"
    # The Cluster's infrastructure is another provider's kind (a Proxmox-based cluster getting libvirt workers).
    await capi_objects.create_cluster(api_client, namespace, "demo", infrastructure_kind="ProxmoxCluster",
                                      control_plane_initialized=True)
    # The workload cluster is the test API server itself: its kubeconfig Secret, and the Node a kubelet registered
    # without --provider-id, which the provider patches.
    await core.create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="demo-kubeconfig"),
        data={"value": base64.b64encode(control_plane.cluster_kubeconfig()).decode()}))
    await core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=naming.hostname(machine_name))))
    # No guest agent: libvirt's DHCP lease is then the only source that can give the address (the lease path; the
    # agent and the ARP table are proven by test_bridged_addresses.py).
    spec = machine_spec(libvirt_host, guest_image, base_image_volume) | {"guestAgent": False}
    made = await capi_objects.create_machine(api_client, namespace, "demo", machine_name,
                                             capi_objects.marker_user_data(marker), spec)

    async def get():
        return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                          made.libvirt_machine)

    async with operator_running(control_plane, {libvirt_host.name: libvirt_host.uri}) as memo:
        started, running_at = time.monotonic(), None

        async def provisioned():
            nonlocal running_at
            body = await get()
            if running_at is None and body.get("status", {}).get("state") == "running":
                running_at = time.monotonic()
            return body if body.get("status", {}).get("initialization", {}).get("provisioned") else None

        body = await wait_until("provisioned", provisioned, PROVISION_DEADLINE_S, interval=0.5)
        provisioned_at = time.monotonic()
        deps = memo.runtime.deps
        assert 1 <= deps.hosts.get(libvirt_host.name).opened <= THREADS_PER_HOST, \
            "a connection per pool thread at most, reused by every pass"
        print(f"\n[numbers] creation -> domain running (provider): {running_at - started:.1f}s; "
              f"running -> address, provisioned (guest boot): {provisioned_at - running_at:.1f}s; "
              f"host operations: {deps.hosts.get(libvirt_host.name).calls}; Kubernetes API calls: {deps.kube.calls}")
        uid = body["metadata"]["uid"]
        domain_uuid = naming.domain_uuid(uid)
        assert body["spec"]["providerID"] == f"libvirt://{libvirt_host.name}/{domain_uuid}"
        assert body["status"]["ready"] is True
        assert body["status"]["host"] == libvirt_host.name
        assert body["status"]["state"] == "running"
        internal = [a["address"] for a in body["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal and all(a.startswith("192.168.122.") for a in internal), body["status"]["addresses"]
        discovery = conditions.get_condition(body["status"]["conditions"], conditions.ADDRESSES_DISCOVERED)
        assert (discovery["status"], discovery["reason"]) == ("True", "DHCPLease"), discovery
        with libvirt_host.connect() as conn:  # the address is the lease libvirt's network gave the domain's MAC
            mac = ET.fromstring(conn.lookupByUUIDString(naming.domain_uuid(body["metadata"]["uid"])).XMLDesc(0)) \
                .find("devices/interface/mac").get("address")
            leases = conn.networkLookupByName(libvirt_host.network_name).DHCPLeases(mac)
        assert internal == [lease["ipaddr"] for lease in leases], (internal, leases)
        ready = {c["type"]: c for c in body["status"]["conditions"]}
        assert (ready["Ready"]["status"], ready["Provisioned"]["reason"]) == ("True", "Provisioned"), \
            (body["status"]["conditions"], [(e.reason, e.message) for e in (await core.list_namespaced_event(
                namespace)).items], [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")])

        async def node_provider_id():
            return (await core.read_node(naming.hostname(machine_name))).spec.provider_id
        assert await wait_until("the Node's providerID", node_provider_id, 60) == body["spec"]["providerID"]

        # The bootstrap data ran inside the guest: its marker is on the serial console, logged in the pool folder.
        serial_log = pathlib.Path(libvirt_host.pool_dir) / naming.serial_log_file_name(namespace, machine_name, uid)

        async def marker_logged():
            return serial_log.exists() and marker in serial_log.read_text(errors="replace")

        await wait_until("the bootstrap marker in the serial log", marker_logged, PROVISION_DEADLINE_S, 2.0)

        # The defaults: a kvm domain, which libvirt started with QEMU's KVM accelerator (the test host's wrapper then
        # ran it under TCG, and says so in the domain's log: devenv/kvm_as_tcg.py); the machine type q35, with the
        # NoCloud CD-ROM on the virtio-scsi bus q35 gives it.
        with libvirt_host.connect() as conn:
            defined = ET.fromstring(conn.lookupByUUIDString(domain_uuid).XMLDesc(0))
        assert defined.get("type") == "kvm"
        qemu_log = (libvirt_host.qemu_log_dir / f"{defined.findtext('name')}.log").read_text()
        assert "\n-accel kvm \\\n" in qemu_log and "-accel kvm run as -accel tcg" in qemu_log, qemu_log[-2000:]
        assert defined.find("os/type").get("machine", "").startswith("pc-q35-"), ET.tostring(defined.find("os"))
        assert defined.find("devices/disk[@device='cdrom']/target").get("bus") == "scsi"

        # QEMU runs as the host's unprivileged user (as Debian and Ubuntu run it), on the files libvirt gave it; the
        # shared base image stays root's, and QEMU holds it read-only: no guest can write to it.
        pool = libvirt_host.pool_dir
        pid = qemu_files.qemu_pid(libvirt_host, naming.domain_name(namespace, machine_name, uid))
        assert qemu_files.process_uid(pid) == qemu_files.qemu_uid() != 0
        held = qemu_files.held_files(pid)
        overlay, iso = (str(pool / naming.overlay_volume_name(namespace, machine_name, uid)),
                        str(pool / naming.nocloud_volume_name(namespace, machine_name, uid)))
        base = str(pool / base_image_volume)
        assert (held[overlay].access, held[base].access) == ("rw", "r"), held
        assert qemu_files.owned(overlay).uid == qemu_files.owned(iso).uid == qemu_files.qemu_uid()
        base_owner = qemu_files.owned(base)
        assert (base_owner.uid, base_owner.mode, base_owner.libvirt_attributes) == (0, 0o644, ()), base_owner
        kernel_owner = qemu_files.owned(spec["kernelBoot"]["kernel"])
        assert kernel_owner.uid == qemu_files.qemu_uid() and kernel_owner.libvirt_attributes, kernel_owner

        # Bootstrap data never leaves the ISO: not in the status, the events, or anything the operator logged.
        body = await get()
        events = await core.list_namespaced_event(namespace)
        assert marker not in str(body) and marker not in str([(e.reason, e.message) for e in events.items])
        assert not [r for r in caplog.records if marker in r.getMessage()]

        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                      made.libvirt_machine)

        async def gone():
            try:
                await get()
                return False
            except client.exceptions.ApiException as error:
                return error.status == 404

        await wait_until("the LibvirtMachine to be gone (finalizer released)", gone, DELETE_DEADLINE_S)

    names = [naming.overlay_volume_name(namespace, machine_name, uid), naming.nocloud_volume_name(namespace, machine_name, uid),
             naming.serial_log_file_name(namespace, machine_name, uid)]
    assert host_objects(libvirt_host, domain_uuid, names) == []
    # The host's own files the guest used (its kernel and initrd) are given back to their owner, root, as they were.
    for path in (spec["kernelBoot"]["kernel"], spec["kernelBoot"]["initrd"]):
        assert qemu_files.owned(path) == qemu_files.Owned(0, 0, 0o644, ()), path
    await core.delete_node(naming.hostname(machine_name))
