"""A reconcile that dies mid-create (right after the overlay exists, right after the domain is defined) leaves state a
restarted operator converges from: exactly one running domain and no stray volume, and deletion leaves the host clean.

The fault comes through a dependency the test constructs, never through a switch in production code: the first pass
is the production reconcile (`reconcile.machine.reconcile`), given a host whose operation raises
`ProcessDied` (a BaseException: no `except Exception`, no status write, no cleanup runs after it, as after a SIGKILL)
the moment the phase's last host operation has returned. Then the operator itself starts (a fresh process state:
new connections, an empty cache) and must finish the job. Kills of the operator process from outside, at random
moments, are tests/e2e/test_chaos.py's.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import domain_owner, naming
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.kube import api, kubeconfig
from capi_libvirt.kube.client import KubeClient
from capi_libvirt.reconcile import inventory
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv import capi_objects
from guests import refreshed_pool

from fixtures_control_plane import OPERATOR_USER, operator_running
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


class ProcessDied(BaseException):
    """The operator process ending right here: nothing after this point of the reconcile runs."""


def our_objects(host, machine_uid: str) -> dict[str, list[str]]:
    """Every domain whose metadata names this machine, and every volume carrying its name hash."""
    marker = naming.uid_hash(machine_uid)
    with host.connect() as conn:
        domains = [d.UUIDString() for d in conn.listAllDomains()
                   if (owner := domain_owner.parse_owner(d.XMLDesc(0))) and owner.uid == machine_uid]
        pool = refreshed_pool(conn, host.pool_name)
        volumes = sorted(v for v in pool.listVolumes() if marker in v)
    return {"domains": domains, "volumes": volumes}


def dying_after(registry: host_api.HostRegistry, host: str, last_operation: str) -> None:
    """Make `host` end the process once its operation `last_operation` (a Host method's name) returned."""
    target = registry.get(host)
    real = getattr(target, last_operation)

    async def operation(*args):
        await real(*args)  # done on the host; the process dies before it hears the answer
        raise ProcessDied(last_operation)

    setattr(target, last_operation, operation)


async def run_until_the_process_dies(control_plane, host, namespace: str, name: str, last_operation) -> None:
    """The production reconcile, as the operator's worker runs it (as OPERATOR_USER), pass after pass until it dies."""
    credentials = kubeconfig.from_kubeconfig(paths=[control_plane.kubeconfig_for(OPERATOR_USER)])
    registry = host_api.HostRegistry({host.name: host.uri})
    dying_after(registry, host.name, last_operation)
    async with KubeClient(credentials) as api_client:
        deps = machine_reconcile.Dependencies(kube=api.KubeAPI(api_client), inventory=inventory.Inventory(registry),
                                              post_event=lambda *_: None)
        try:
            for _ in range(20):
                await machine_reconcile.reconcile(deps, namespace, name)
                await asyncio.sleep(0.2)
            raise AssertionError(f"20 passes and {last_operation} never ran")
        except ProcessDied:
            pass
        finally:
            await asyncio.get_running_loop().run_in_executor(None, registry.close)


@pytest.mark.parametrize("last_operation, expected_before_restart", [
    ("ensure_overlay", {"domains": 0, "volumes": 1}),  # the overlay only
    ("define_domain", {"domains": 1, "volumes": 3}),   # overlay, ISO, empty serial log; defined, never started
], ids=["after-ensure_overlay", "after-ensure_domain"])
async def test_restart_after_a_crash_converges_to_one_domain_and_no_stray_volume(
        last_operation, expected_before_restart, control_plane, api_client, namespace, libvirt_host, guest_image,
        base_image_volume):
    await capi_objects.create_cluster(api_client, namespace, "demo")
    name = f"crash-{uuid.uuid4().hex[:6]}"
    spec = {"image": {"volume": base_image_volume}, "storagePool": libvirt_host.pool_name, "domainType": "qemu",
            "machineType": "pc", "cpus": 1, "memoryMiB": 256, "diskGiB": 2,
            "interfaces": [{"network": libvirt_host.network_name}],
            "kernelBoot": dict(zip(("kernel", "initrd"), libvirt_host.boot_files(guest_image), strict=True))}
    await capi_objects.create_machine(api_client, namespace, "demo", name, "#cloud-config\n", spec)
    objects = client.CustomObjectsApi(api_client)

    async def body():
        return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    await run_until_the_process_dies(control_plane, libvirt_host, namespace, name, last_operation)
    uid = (await body())["metadata"]["uid"]
    before = our_objects(libvirt_host, uid)
    assert {k: len(v) for k, v in before.items()} == expected_before_restart, before
    if before["domains"]:
        with libvirt_host.connect() as conn:
            assert not conn.lookupByUUIDString(before["domains"][0]).isActive()  # died before ensure_running

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
