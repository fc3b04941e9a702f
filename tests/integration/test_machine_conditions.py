"""What a LibvirtMachine waits for and what fails, on a real libvirtd: each ends in a condition naming the problem,
leaves nothing on the host, and the machine can be deleted while waiting or failing (for an unreachable host, as soon
as it is back). Pause and the cluster's infrastructure gate everything."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import naming
from devenv import capi_objects
from devenv.libvirt_host import LibvirtHost

from fixtures_control_plane import operator_running
from waiting import CONVERGENCE_S, events_posted, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DEADLINE_S = CONVERGENCE_S
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
    [event, *_] = await events_posted(machine.core, namespace, "ImageNotFound", f"involvedObject.name={machine.name}")
    assert event.type == "Warning"
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


async def test_missing_bootstrap_secret_waits_and_the_machine_moves_on_once_it_appears(
        api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host), create_secret=False)
    waiting = await machine.wait_for_condition("Provisioned", "WaitingForBootstrapData")
    assert f"{machine.name}-bootstrap" in waiting["message"]
    assert (await machine.body())["status"].get("host") is None  # nothing placed, nothing created

    # Secrets are not watched (that would need list/watch on every Secret): the 10 s recheck finds it.
    await capi_objects.create_bootstrap_secret(api_client, namespace, "demo", f"{machine.name}-bootstrap",
                                               SECRET_LOOKING_DATA)
    await machine.wait_for_condition("Provisioned", "ImageNotFound")
    await machine.delete_and_wait_gone()


async def test_an_unknown_bootstrap_format_is_refused_with_a_clear_condition(api_client, namespace, libvirt_host,
                                                                              operator):
    # cloud-config (NoCloud) and ignition (fw_cfg, tests/e2e/test_machine_shape.py) are served; nothing else.
    machine = await make(api_client, namespace, spec(libvirt_host), bootstrap_format="kickstart")
    refused = await machine.wait_for_condition("Provisioned", "BootstrapFormatUnsupported")
    assert "kickstart" in refused["message"]
    assert "cloud-config" in refused["message"] and "ignition" in refused["message"]
    assert (await machine.body())["status"].get("host") is None
    await machine.delete_and_wait_gone()


async def test_machine_pinned_to_an_unreachable_host_says_so_and_deletes_at_once(
        api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host, host="offline"))
    unreachable = await machine.wait_for_condition("Provisioned", "HostUnreachable")
    assert "offline" in unreachable["message"]
    assert "host" not in (await machine.body())["status"]  # never placed, so nothing can exist anywhere
    await machine.delete_and_wait_gone()


async def test_host_unreachable_after_placement_keeps_the_finalizer_with_a_reason_until_it_is_back(
        api_client, namespace, libvirt_host, offline_host, operator):
    with offline_host:
        machine = await make(api_client, namespace, spec(offline_host, host="offline"))
        await machine.wait_for_condition("Provisioned", "ImageNotFound")  # placed there: things may exist there
        assert (await machine.body())["status"]["host"] == "offline"
    # The host is gone now.
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
    cells = dict(zip([c["name"] for c in table["columnDefinitions"]], table["rows"][0]["cells"], strict=True))
    assert (cells["Cluster"], cells["Host"], cells["State"], cells["Address"]) == ("demo", "kvm1", "running", "192.0.2.7")
    assert cells["ProviderID"] == "libvirt://kvm1/5d64ece4-dc73-59e8-9624-de2ce4c5a35e"


async def test_missing_network_is_named_before_anything_is_created(api_client, namespace, libvirt_host, operator):
    machine = await make(api_client, namespace, spec(libvirt_host, interfaces=[{"network": "no-such-net"}]))
    provisioned = await machine.wait_for_condition("Provisioned", "NetworkNotFound")
    assert "no-such-net" in provisioned["message"]
    uid = (await machine.body())["metadata"]["uid"]
    assert left_on_host(libvirt_host, namespace, machine.name, uid) == []
    await machine.delete_and_wait_gone()


async def test_a_foreign_domain_with_the_machines_uuid_is_never_destroyed(
        api_client, namespace, libvirt_host, operator):
    """Deletion checks the owner recorded in the domain's metadata before touching it."""
    machine = await make(api_client, namespace, spec(libvirt_host))
    await machine.wait_for_condition("Provisioned", "ImageNotFound")
    uid = (await machine.body())["metadata"]["uid"]
    foreign = (f"<domain type='qemu'><name>foreign-{machine.name}</name><uuid>{naming.domain_uuid(uid)}</uuid>"
               "<memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>")
    with libvirt_host.connect() as conn:
        conn.defineXML(foreign)
    try:
        await machine.objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                              machine.name)
        refused = await machine.wait_for_condition("Deleting", "DeletionFailed")
        assert "not owned by machine" in refused["message"]
        with libvirt_host.connect() as conn:
            assert conn.lookupByUUIDString(naming.domain_uuid(uid)).name() == f"foreign-{machine.name}"
    finally:
        with libvirt_host.connect() as conn:
            conn.lookupByUUIDString(naming.domain_uuid(uid)).undefine()

    async def gone():
        return await machine.body() is None
    await wait_until("deletion once the foreign domain is gone", gone, DEADLINE_S * 2)


async def create_libvirt_cluster(api_client, namespace: str, cluster_uid: str, spec_: dict, labels: dict,
                                 name: str = "demo") -> None:
    await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtclusters", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtCluster",
            "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": "demo", **labels},
                         "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                                              "name": "demo", "uid": cluster_uid}]},
            "spec": spec_})


async def libvirt_cluster_status(api_client, namespace: str, name: str = "demo") -> dict:
    body = await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name)
    return body.get("status", {}) | {"_spec": body["spec"]}


async def test_libvirt_cluster_takes_the_endpoint_from_the_cluster_and_is_provisioned(
        api_client, namespace, operator):
    cluster = await capi_objects.create_cluster(api_client, namespace, "demo")
    await create_libvirt_cluster(api_client, namespace, cluster["metadata"]["uid"], {}, {})

    async def waiting():
        status = await libvirt_cluster_status(api_client, namespace)
        reasons = {c["type"]: c["reason"] for c in status.get("conditions", [])}
        return status if reasons.get("Provisioned") == "WaitingForControlPlaneEndpoint" else None
    await wait_until("LibvirtCluster waiting for an endpoint", waiting, DEADLINE_S)

    await patch_cluster(api_client, namespace, {"spec": {"controlPlaneEndpoint": {"host": "192.0.2.1", "port": 6443}}})

    async def provisioned():
        status = await libvirt_cluster_status(api_client, namespace)
        return status if status.get("initialization", {}).get("provisioned") else None
    status = await wait_until("LibvirtCluster provisioned", provisioned, DEADLINE_S)
    assert status["ready"] is True and status["_spec"]["controlPlaneEndpoint"] == {"host": "192.0.2.1", "port": 6443}
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"


async def test_libvirt_cluster_managed_by_someone_else_is_left_alone(api_client, namespace, operator):
    cluster = await capi_objects.create_cluster(api_client, namespace, "demo")
    endpoint = {"controlPlaneEndpoint": {"host": "192.0.2.1", "port": 6443}}
    await create_libvirt_cluster(api_client, namespace, cluster["metadata"]["uid"], endpoint,
                                 {"cluster.x-k8s.io/managed-by": "someone-else"}, name="managed")
    await create_libvirt_cluster(api_client, namespace, cluster["metadata"]["uid"], endpoint, {}, name="ours")

    # Created after it and otherwise the same, ours is provisioned; by then the managed one was seen and skipped.
    async def ours_provisioned():
        return (await libvirt_cluster_status(api_client, namespace, "ours")).get("initialization")
    await wait_until("the unmanaged twin to be provisioned", ours_provisioned, DEADLINE_S)
    assert "initialization" not in await libvirt_cluster_status(api_client, namespace, "managed")
