"""The operator dies mid-create (right after the overlay exists, right after the domain is defined); restarted, it
converges to exactly one running domain and no stray volume, and deletion leaves the host clean."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import domain_xml, naming
from capi_libvirt.operator import config as operator_config
from devenv import capi_objects
from guests import refreshed_pool

from fixtures_control_plane import OPERATOR_USER, operator_running
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def our_objects(host, machine_uid: str) -> dict[str, list[str]]:
    """Every domain whose metadata names this machine, and every volume carrying its name hash."""
    marker = naming.uid_hash(machine_uid)
    with host.connect() as conn:
        domains = [d.UUIDString() for d in conn.listAllDomains()
                   if (owner := domain_xml.parse_owner(d.XMLDesc(0))) and owner.uid == machine_uid]
        pool = refreshed_pool(conn, host.pool_name)
        volumes = sorted(v for v in pool.listVolumes() if marker in v)
    return {"domains": domains, "volumes": volumes}


async def crash_operator_after(phase: str, control_plane, host) -> int:
    """Run the operator as its own process until the fault point ends it, as a kill would."""
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig_for(OPERATOR_USER)),
           operator_config.CRASH_AFTER_ENV: phase}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "capi_libvirt", "run", "--host", f"{host.name}={host.uri}", "--standalone",
        "--health-address", "0", "--metrics-address", "0", env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return await asyncio.wait_for(process.wait(), timeout=120)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize("phase, expected_before_restart", [
    ("ensure_overlay", {"domains": 0, "volumes": 1}),   # the overlay only
    ("ensure_domain", {"domains": 1, "volumes": 3}),    # overlay, ISO, empty serial log; defined, never started
])
async def test_restart_after_a_crash_converges_to_one_domain_and_no_stray_volume(
        phase, expected_before_restart, control_plane, api_client, namespace, libvirt_host, guest_image,
        base_image_volume):
    await capi_objects.create_cluster(api_client, namespace, "demo")
    name = f"crash-{uuid.uuid4().hex[:6]}"
    spec = {"image": {"volume": base_image_volume}, "storagePool": libvirt_host.pool_name, "domainType": "qemu",
            "machineType": "pc", "cpus": 1, "memoryMiB": 256, "diskGiB": 2,
            "interfaces": [{"network": libvirt_host.network_name}],
            "kernelBoot": {"kernel": str(guest_image.kernel), "initrd": str(guest_image.initrd)}}
    await capi_objects.create_machine(api_client, namespace, "demo", name, "#cloud-config\n", spec)
    objects = client.CustomObjectsApi(api_client)

    async def body():
        return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    assert await crash_operator_after(phase, control_plane, libvirt_host) == operator_config.CRASH_EXIT_CODE
    uid = (await body())["metadata"]["uid"]
    before = our_objects(libvirt_host, uid)
    assert {k: len(v) for k, v in before.items()} == expected_before_restart, before

    async with operator_running(control_plane, {libvirt_host.name: libvirt_host.uri}):
        async def running():
            current = await body()
            return current if current.get("status", {}).get("state") == "running" and \
                current["spec"].get("providerID") else None
        await wait_until("the restarted operator to start the domain", running, 180)
        after = our_objects(libvirt_host, uid)
        assert after["domains"] == [naming.domain_uuid(uid)]
        expected_volumes = sorted([naming.overlay_volume_name(namespace, name, uid),
                                   naming.nocloud_volume_name(namespace, name, uid),
                                   naming.serial_log_file_name(namespace, name, uid)])
        assert after["volumes"] == expected_volumes

        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

        async def gone():
            try:
                await body()
                return False
            except client.exceptions.ApiException as error:
                return error.status == 404
        await wait_until("deletion", gone, 120)
    assert our_objects(libvirt_host, uid) == {"domains": [], "volumes": []}
