"""What a LibvirtMachine waits for and what fails, on a real libvirtd: each ends in a condition naming the problem,
leaves nothing on the host, and the machine can be deleted while waiting or failing (for an unreachable host, as soon
as it is back). Pause and the cluster's infrastructure gate everything."""

from __future__ import annotations

import uuid
from typing import AsyncIterator

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import naming
from capi_libvirt.devenv import capi_objects
from capi_libvirt.devenv.libvirt_host import LibvirtHost

from fixtures_control_plane import operator_running
from waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DEADLINE_S = 60.0
SECRET_LOOKING_DATA = "#cloud-config\n# token: s3cr3t-bootstrap-credential\n"


@pytest.fixture(scope="module")
def offline_host() -> LibvirtHost:
    """A host the operator knows but whose daemon is not running (started by the test that needs it back)."""
    return LibvirtHost("pytest-offline", "192.168.123.0/24")


@pytest.fixture(scope="module")
async def operator(control_plane, libvirt_host, offline_host) -> AsyncIterator[None]:
    async with operator_running(control_plane, {libvirt_host.name: libvirt_host.uri, "offline": offline_host.uri}):
        yield


def spec(libvirt_host, **changes) -> dict:
    return {"image": {"volume": "missing-base.qcow2"}, "storagePool": libvirt_host.pool_name, "domainType": "qemu",
            "memoryMiB": 256, "interfaces": [{"network": libvirt_host.network_name}], "host": libvirt_host.name,
            **changes}


class Machine:
    def __init__(self, api_client, namespace: str, name: str) -> None:
        self.objects = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace, self.name = namespace, name

    async def body(self) -> dict | None:
        try:
            return await self.objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, self.namespace,
                                                                   "libvirtmachines", self.name)
        except client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise

    async def wait_for_condition(self, type_: str, reason: str) -> dict:
        async def probe():
            body = await self.body() or {}
            found = {c["type"]: c for c in body.get("status", {}).get("conditions", [])}.get(type_)
            return found if found and found["reason"] == reason else None
        return await wait_until(f"{type_} condition with reason {reason}", probe, DEADLINE_S)

    async def delete_and_wait_gone(self) -> None:
        await self.objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, self.namespace,
                                                           "libvirtmachines", self.name)

        async def gone():
            return await self.body() is None
        await wait_until("the LibvirtMachine to be gone", gone, DEADLINE_S)

    async def events(self) -> list[str]:
        listed = await self.core.list_namespaced_event(self.namespace,
                                                       field_selector=f"involvedObject.name={self.name}")
        return [f"{e.type} {e.reason}: {e.message}" for e in listed.items]


def left_on_host(host: LibvirtHost, namespace: str, name: str, uid: str) -> list[str]:
    names = {naming.overlay_volume_name(namespace, name, uid), naming.nocloud_volume_name(namespace, name, uid),
             naming.serial_log_file_name(namespace, name, uid)}
    with host.connect() as conn:
        left = [d.name() for d in conn.listAllDomains() if d.UUIDString() == naming.domain_uuid(uid)]
        for pool in conn.listAllStoragePools():
            if pool.isActive():
                pool.refresh(0)
                left += [v for v in pool.listVolumes() if v in names]
    return left


async def make(api_client, namespace, libvirt_spec, *, cluster: bool = True, **kwargs) -> Machine:
    if cluster:
        await capi_objects.create_cluster(api_client, namespace, "demo")
    name = f"m-{uuid.uuid4().hex[:6]}"
    await capi_objects.create_machine(api_client, namespace, "demo", name, SECRET_LOOKING_DATA, libvirt_spec, **kwargs)
    return Machine(api_client, namespace, name)


async def test_missing_base_image_is_named_in_the_condition_and_nothing_is_left(
        api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host))
    provisioned = await machine.wait_for_condition("Provisioned", "ImageNotFound")
    assert "missing-base.qcow2" in provisioned["message"] and libvirt_host.pool_name in provisioned["message"]
    ready = await machine.wait_for_condition("Ready", "ImageNotFound")
    assert ready["status"] == "False"
    assert any(e.startswith("Warning ImageNotFound") for e in await machine.events())
    uid = (await machine.body())["metadata"]["uid"]
    await machine.delete_and_wait_gone()
    assert left_on_host(libvirt_host, namespace, machine.name, uid) == []


async def test_missing_pool_is_named_in_the_condition_and_the_machine_deletes(
        api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host, storagePool="no-such-pool"))
    provisioned = await machine.wait_for_condition("Provisioned", "PoolNotFound")
    assert "no-such-pool" in provisioned["message"]
    uid = (await machine.body())["metadata"]["uid"]
    await machine.delete_and_wait_gone()
    assert left_on_host(libvirt_host, namespace, machine.name, uid) == []


async def test_missing_bootstrap_secret_waits_and_a_new_secret_wakes_the_machine(
        api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host), create_secret=False)
    waiting = await machine.wait_for_condition("Provisioned", "WaitingForBootstrapData")
    assert f"{machine.name}-bootstrap" in waiting["message"]
    assert (await machine.body())["status"].get("host") is None  # nothing placed, nothing created

    # The watch on Secrets wakes the machine: it moves on to the next phase without waiting for its timer.
    await capi_objects.create_bootstrap_secret(api_client, namespace, "demo", f"{machine.name}-bootstrap",
                                               SECRET_LOOKING_DATA)
    await machine.wait_for_condition("Provisioned", "ImageNotFound")
    await machine.delete_and_wait_gone()


async def test_ignition_bootstrap_data_is_refused_with_a_clear_condition(api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host), bootstrap_format="ignition")
    refused = await machine.wait_for_condition("Provisioned", "BootstrapFormatUnsupported")
    assert "ignition" in refused["message"] and "cloud-config" in refused["message"]
    assert (await machine.body())["status"].get("host") is None
    await machine.delete_and_wait_gone()


async def test_unreachable_host_keeps_the_finalizer_with_a_reason_until_the_host_is_back(
        api_client, namespace, libvirt_host, offline_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host, host="offline"))
    unreachable = await machine.wait_for_condition("Provisioned", "HostUnreachable")
    assert "offline" in unreachable["message"]

    await machine.objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                          machine.name)
    deleting = await machine.wait_for_condition("Deleting", "HostUnreachable")
    assert deleting["status"] == "True" and "cannot delete yet" in deleting["message"]
    assert (await machine.body())["metadata"]["finalizers"], "the finalizer must stay while the host is unreachable"

    with offline_host:  # the host comes back: the retried deletion goes through
        async def gone():
            return await machine.body() is None
        await wait_until("deletion once the host is back", gone, DEADLINE_S * 2)


async def test_no_bootstrap_data_in_conditions_or_events(api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host))
    await machine.wait_for_condition("Provisioned", "ImageNotFound")
    body = await machine.body()
    assert "s3cr3t" not in str(body["status"]) and "s3cr3t" not in str(await machine.events())
    await machine.delete_and_wait_gone()


async def patch_cluster(api_client, namespace: str, body: dict, status: bool = False) -> None:
    objects = client.CustomObjectsApi(api_client)
    patch = objects.patch_namespaced_custom_object_status if status else objects.patch_namespaced_custom_object
    await patch("cluster.x-k8s.io", "v1beta2", namespace, "clusters", "demo", body,
                _content_type="application/merge-patch+json")


async def test_paused_cluster_stops_everything_and_unpausing_resumes(api_client, namespace, libvirt_host, operator):
    await capi_objects.create_cluster(api_client, namespace, "demo")
    await patch_cluster(api_client, namespace, {"spec": {"paused": True}})
    machine = await make(api_client, namespace, spec(libvirt_host), cluster=False)
    paused = await machine.wait_for_condition("Paused", "Paused")
    assert paused["status"] == "True"
    status = (await machine.body())["status"]
    assert "host" not in status and not any(c["type"] == "Provisioned" for c in status["conditions"])

    await patch_cluster(api_client, namespace, {"spec": {"paused": False}})  # the Cluster watch wakes the machine
    await machine.wait_for_condition("Provisioned", "ImageNotFound")
    assert (await machine.wait_for_condition("Paused", "NotPaused"))["status"] == "False"
    await machine.delete_and_wait_gone()


async def test_machine_waits_for_the_cluster_infrastructure(api_client, namespace, libvirt_host, operator):
    objects = client.CustomObjectsApi(api_client)
    await objects.create_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", namespace, "clusters", {
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": "demo"},
        "spec": {"infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtCluster", "name": "demo"}}})
    machine = await make(api_client, namespace, spec(libvirt_host), cluster=False)
    await machine.wait_for_condition("Provisioned", "WaitingForClusterInfrastructure")
    assert (await machine.wait_for_condition("Ready", "WaitingForClusterInfrastructure"))["status"] == "False"
    await patch_cluster(api_client, namespace, {"status": {"initialization": {"infrastructureProvisioned": True}}},
                        status=True)
    await machine.wait_for_condition("Provisioned", "ImageNotFound")
    await machine.delete_and_wait_gone()


async def test_kubectl_get_shows_cluster_host_state_provider_id_and_address(api_client, namespace, control_plane):
    """`kubectl get` asks the API server for a Table; the CRD's printer columns fill it."""
    objects = client.CustomObjectsApi(api_client)
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine",
        "metadata": {"name": "shown", "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": {"image": {"volume": "base.qcow2"}, "providerID": "libvirt://kvm1/5d64ece4-dc73-59e8-9624-de2ce4c5a35e"}})
    await objects.patch_namespaced_custom_object_status(
        meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "shown",
        {"status": {"host": "kvm1", "state": "running", "addresses": [
            {"type": "Hostname", "address": "shown"}, {"type": "InternalIP", "address": "192.0.2.7"}]}},
        _content_type="application/merge-patch+json")
    table = control_plane.request(
        "GET", f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/libvirtmachines/shown",
        accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    columns = [c["name"] for c in table["columnDefinitions"] if c.get("priority", 0) == 0]
    assert columns == ["Name", "Cluster", "Host", "State", "ProviderID", "Address", "Age"]
    cells = dict(zip([c["name"] for c in table["columnDefinitions"]], table["rows"][0]["cells"]))
    assert (cells["Cluster"], cells["Host"], cells["State"], cells["Address"]) == ("demo", "kvm1", "running", "192.0.2.7")
    assert cells["ProviderID"] == "libvirt://kvm1/5d64ece4-dc73-59e8-9624-de2ce4c5a35e"
