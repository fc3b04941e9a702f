"""Placement by what a host really has, through the real operator and two real libvirt hosts reached over qemu+tls: a
domain someone else defined and started on host a (no owner metadata: a foreign VM, declared with nearly all the
host's memory, which QEMU allocates lazily, so it really takes a few MiB) makes host a full, so machines land on host
b; a machine that fits nowhere waits with a condition naming, per host, the room left and the foreign VMs; once the
foreign VM is destroyed, the next probe sees the room and the waiting machine is placed on host a. A machine larger
than the host's free memory is never placed, whatever the overcommit allows. A foreign domain that is defined but shut
off counts for nothing. The machines use a missing base image: placement is what is tested, nothing of theirs boots;
the foreign VM runs in its firmware (no disk: nothing to boot)."""

from __future__ import annotations

import base64
import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator

import libvirt
import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from devenv import capi_objects
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require
from waiting import CONVERGENCE_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

A, B = "placement-a", "placement-b"
DEADLINE_S = CONVERGENCE_S
MERGE = {"_content_type": "application/merge-patch+json"}
MISSING_BASE = "placement-missing.qcow2"  # no such volume: placement is what is tested, no machine boots
FOREIGN, SHUT_OFF = "someone-elses-vm", "someone-elses-stopped-vm"
LEFT_ON_A = 1024  # MiB of host a's memory the foreign VM leaves to placement
ROOM_ON_B = 3072  # MiB host b's overcommit gives placement (so that two machines fill it)
MACHINE_MIB = 2048


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[ra.RemoteAccess, ra.RemoteAccess]]:
    require_libvirt_host_prerequisites()
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost(A, "192.168.190.0/24"), link_index=190) as a, \
            ra.RemoteAccess(LibvirtHost(B, "192.168.191.0/24"), link_index=191) as b:
        yield a, b


def foreign_domain_xml(name: str, memory_mib: int) -> str:
    """A VM as another tool defines it: no owner metadata of ours, no disk (it sits in its firmware)."""
    return (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>{memory_mib}</memory><vcpu>1</vcpu>"
            "<os><type arch='x86_64' machine='pc'>hvm</type></os><devices/></domain>")


def tls_secret(access: ra.RemoteAccess) -> dict[str, str]:
    folder = access.client_dir
    return {key: base64.b64encode((folder / file).read_bytes()).decode()
            for key, file in (("ca.crt", "cacert.pem"), ("tls.crt", "clientcert.pem"), ("tls.key", "clientkey.pem"))}


async def host_status(api_client, name: str) -> dict:
    body = await client.CustomObjectsApi(api_client).get_cluster_custom_object(meta.GROUP, meta.VERSION,
                                                                               "libvirthosts", name)
    return body.get("status") or {}


async def machine(api_client, namespace: str, name: str) -> dict:
    return await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)


async def placed_on(api_client, namespace: str, name: str) -> str:
    async def host():
        return ((await machine(api_client, namespace, name)).get("status") or {}).get("host")
    found: str = await wait_until(f"{name} placed", host, DEADLINE_S)
    return found


async def waiting(api_client, namespace: str, name: str, text: str) -> dict:
    async def condition():
        body = await machine(api_client, namespace, name)
        assert not (body.get("status") or {}).get("host"), f"{name} was placed: {body.get('status')}"
        found = {c["type"]: c for c in (body.get("status") or {}).get("conditions", [])}.get("Provisioned")
        return found if found and found["reason"] == "InsufficientCapacity" and text in found["message"] else None
    found: dict = await wait_until(f"{name} to wait for a host ({text})", condition, DEADLINE_S)
    return found


def machine_spec(memory_mib: int, network: str) -> dict:
    return {"image": {"volume": MISSING_BASE}, "storagePool": "capi-libvirt", "domainType": "qemu", "cpus": 1,
            "memoryMiB": memory_mib, "interfaces": [{"network": network}]}


@pytest.fixture(scope="module")
async def operator(control_plane, api_client, hosts) -> AsyncIterator[dict]:
    """The operator (a probe a second) with both hosts as LibvirtHosts; host b's memory overcommit set so that
    placement may hand out ROOM_ON_B MiB there. Yields the operator's memo and the hosts' memory."""
    a, b = hosts
    with b.host.connect() as conn:
        memory_mib = conn.getInfo()[1]
    core, objects = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    for access in hosts:
        await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name=access.host.name), data=tls_secret(access)))
    try:
        async with operator_running(control_plane, {}, probe_interval_s=1.0) as memo:
            for access, overcommit in ((a, 1.0), (b, (ROOM_ON_B + 0.5) / memory_mib)):
                await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
                    "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": access.host.name},
                    "spec": {"uri": f"qemu+tls://{access.address}/system", "storagePool": access.host.pool_name,
                             "credentialsSecretRef": {"name": access.host.name, "namespace": PROVIDER_NAMESPACE},
                             "overcommit": {"memory": overcommit},
                             "access": {"networks": [access.host.network_name], "images": [MISSING_BASE]}}})
            try:
                yield {"memo": memo, "memory_mib": memory_mib}
            finally:
                for access in hosts:
                    with contextlib.suppress(client.exceptions.ApiException):
                        await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts",
                                                                   access.host.name)
    finally:
        for access in hosts:
            await core.delete_namespaced_secret(access.host.name, PROVIDER_NAMESPACE)


async def test_foreign_vms_and_free_memory_steer_placement(api_client, namespace, hosts, operator) -> None:
    a, b = hosts
    memory_mib, objects = operator["memory_mib"], client.CustomObjectsApi(api_client)
    foreign_mib = memory_mib - LEFT_ON_A
    with a.host.connect() as conn:  # someone else's VM, running, declared with nearly all of host a's memory
        conn.defineXML(foreign_domain_xml(FOREIGN, foreign_mib)).create()
        rss_kib = conn.lookupByName(FOREIGN).memoryStats().get("rss")
    with b.host.connect() as conn:  # someone else's VM, defined, shut off: takes nothing now
        conn.defineXML(foreign_domain_xml(SHUT_OFF, 4 * memory_mib))
    names = []
    try:
        async def probed():
            sa, sb = await host_status(api_client, A), await host_status(api_client, B)
            return (sa, sb) if sa.get("foreignVMs") == 1 and sb.get("foreignVMsShutOff") == 1 else None
        status_a, status_b = await wait_until("both hosts probed with their foreign VMs", probed, DEADLINE_S)
        print(f"\n[placement] host memory {memory_mib} MiB; foreign VM declared {foreign_mib} MiB, its QEMU's RSS "
              f"{rss_kib // 1024 if rss_kib else '?'} MiB; host a status: " + ", ".join(
                  f"{key} {status_a[key]}" for key in ("foreignVMs", "foreignCPUs", "foreignMemoryMiB",
                                                       "freeMemoryMiB", "availableMemoryMiB")))
        assert (status_a["foreignCPUs"], status_a["foreignMemoryMiB"], status_a["foreignVMsShutOff"]) == \
            (1, foreign_mib, 0)
        assert (status_b["foreignVMs"], status_b["foreignCPUs"], status_b["foreignMemoryMiB"]) == (0, 0, 0)
        assert status_a["availableMemoryMiB"] > 0 and status_a["machines"] == 0
        vcpus_left = status_a["cpus"] * 4 - 1  # the default CPU overcommit; the foreign VM, then "first", take one

        await capi_objects.create_cluster(api_client, namespace, "demo")
        network = a.host.network_name  # both hosts' network has the same name
        names.append("first")  # host a: 1024 MiB left after the foreign VM; host b: 3072 MiB
        await capi_objects.create_machine(api_client, namespace, "demo", "first", "#cloud-config\n",
                                          machine_spec(MACHINE_MIB, network))
        assert await placed_on(api_client, namespace, "first") == B

        names.append("waits")  # now host a 1024 MiB, host b 1024 MiB: fits nowhere
        await capi_objects.create_machine(api_client, namespace, "demo", "waits", "#cloud-config\n",
                                          machine_spec(MACHINE_MIB, network))
        condition = await waiting(api_client, namespace, "waits", f"{A}: {vcpus_left} vCPU and {LEFT_ON_A} MiB free "
                                  f"after 1 foreign VM ({foreign_mib} MiB, 1 vCPU)")
        assert f"{B}: {vcpus_left} vCPU and {ROOM_ON_B + 0.5 - MACHINE_MIB:g} MiB free" in condition["message"]
        print(f"[placement] waiting: {condition['message']}")

        with a.host.connect() as conn:  # the foreign VM goes away: the next probe sees the room
            domain = conn.lookupByName(FOREIGN)
            domain.destroy()
            domain.undefine()
        assert await placed_on(api_client, namespace, "waits") == A
        assert (await host_status(api_client, A))["foreignVMs"] == 0

        # Free memory: host a's overcommit now lets placement hand out 4x its memory, but a machine larger than
        # the memory libvirt reports free (never more than the host has) is not placed there.
        await objects.patch_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", A,
                                                  {"spec": {"overcommit": {"memory": 4.0}}}, **MERGE)
        inventory = operator["memo"].runtime.deps.inventory

        async def taken():
            return inventory.hosts[A].spec.overcommit.memory == 4.0
        await wait_until("the operator to take host a's new overcommit", taken, DEADLINE_S)
        too_big = 4 * memory_mib - MACHINE_MIB  # exactly host a's room now; more than the host has at all
        assert too_big > (await host_status(api_client, A))["availableMemoryMiB"]
        names.append("too-big")
        await capi_objects.create_machine(api_client, namespace, "demo", "too-big", "#cloud-config\n",
                                          machine_spec(too_big, network))
        condition = await waiting(api_client, namespace, "too-big", "but the host has only ")
        assert f"{A}: {vcpus_left} vCPU and {4 * memory_mib - MACHINE_MIB} MiB free" in condition["message"]
        print(f"[placement] too big: {condition['message']}")
    finally:
        for name in names:
            with contextlib.suppress(client.exceptions.ApiException):
                await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                              name)

        async def machines_gone():
            listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                 "libvirtmachines")
            return not listed["items"]
        await wait_until("machines deleted", machines_gone, DEADLINE_S)
        for access, name in ((a, FOREIGN), (b, SHUT_OFF)):
            with access.host.connect() as conn, contextlib.suppress(libvirt.libvirtError):
                domain = conn.lookupByName(name)
                if domain.isActive():
                    domain.destroy()
                domain.undefine()
    for access in hosts:  # nothing left on the hosts
        with access.host.connect() as conn:
            pool = conn.storagePoolLookupByName(access.host.pool_name)
            pool.refresh(0)
            assert conn.listAllDomains() == [] and pool.listVolumes() == []
