"""clusterctl move, simulated on one API server: the LibvirtMachine is deleted the way clusterctl deletes the source
copy (delete-for-move annotation, delete, finalizers stripped) and re-created the way it creates the target copy
(same spec, providerID, finalizers and annotations; a new UID; no status). The copy adopts the same domain (same UUID,
same libvirt domain ID: never undefined, redefined or restarted), its status is rebuilt from the host, and deleting
the copy then cleans the host. (The real two-management-cluster move with clusterctl is not this test.)

The guest boots (minimal image, kernel boot) because Ready needs its DHCP address. Its own libvirt host, so as not to
share the session host with other runs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import domain_owner, naming
from capi_libvirt.reconcile.machine import DELETE_FOR_MOVE_ANNOTATION, FINALIZER, IDENTITY_ANNOTATION
from devenv import base_image, capi_objects
from devenv.libvirt_host import LibvirtHost
from guests import refreshed_pool

from fixtures_control_plane import operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from waiting import events_posted, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MOVE_SUBNET = "192.168.157.0/24"
DEADLINE_S = 240.0


@pytest.fixture(scope="module")
def move_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibvirtHost]:
    require_libvirt_host_prerequisites()
    with LibvirtHost("move-host", MOVE_SUBNET, log_dir=tmp_path_factory.mktemp("move-host-logs")) as host:
        yield host


@pytest.fixture(scope="module")
def move_base_volume(move_host: LibvirtHost, guest_image) -> str:
    with move_host.connect() as conn:
        return base_image.upload_base_image(conn, move_host.pool_name, guest_image)


def on_host(host: LibvirtHost, marker: str) -> dict:
    """Every provider domain ({UUID: (name, libvirt ID, owner UID)}) and every volume carrying the name hash."""
    with host.connect() as conn:
        domains = {}
        for domain in conn.listAllDomains():
            owner = domain_owner.parse_owner(domain.XMLDesc(0))
            if owner is not None:
                domains[domain.UUIDString()] = (domain.name(), domain.ID(), owner.uid)
        volumes = sorted(v for v in refreshed_pool(conn, host.pool_name).listVolumes() if marker in v)
    return {"domains": domains, "volumes": volumes}


async def test_a_moved_copy_adopts_its_domain_and_deleting_it_cleans_the_host(
        control_plane, api_client, namespace, move_host, move_base_volume, guest_image):
    objects = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    name = f"move-{uuid.uuid4().hex[:6]}"
    spec = {"image": {"volume": move_base_volume}, "storagePool": move_host.pool_name, "domainType": "qemu",
            "machineType": "pc", "cpus": 1, "memoryMiB": 256, "diskGiB": 2, "host": move_host.name,
            "interfaces": [{"network": move_host.network_name}],
            "kernelBoot": {"kernel": str(guest_image.kernel), "initrd": str(guest_image.initrd)}}

    async def body() -> dict | None:
        try:
            return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                              name)
        except client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise

    async def ready() -> dict | None:
        current = await body() or {}
        status = current.get("status") or {}
        return current if status.get("ready") and status.get("state") == "running" else None

    async def paused(value: bool) -> None:
        await objects.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", namespace, "clusters", "demo",
                                                     {"spec": {"paused": value}},
                                                     _content_type="application/merge-patch+json")

    async def events_of(uid: str) -> list[str]:
        listed = await core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={uid}")
        return [e.reason for e in listed.items]

    async with operator_running(control_plane, {move_host.name: move_host.uri}):
        await capi_objects.create_cluster(api_client, namespace, "demo")
        await capi_objects.create_machine(api_client, namespace, "demo", name, "#cloud-config\n", spec)
        source = await wait_until("the machine to run with an address", ready, DEADLINE_S)
        source_uid = source["metadata"]["uid"]
        assert source["metadata"]["annotations"][IDENTITY_ANNOTATION] == source_uid  # written by placement
        uuid_ = naming.domain_uuid(source_uid)
        assert source["spec"]["providerID"] == f"libvirt://{move_host.name}/{uuid_}"
        before = on_host(move_host, naming.uid_hash(source_uid))
        assert list(before["domains"]) == [uuid_] and len(before["volumes"]) == 3, before

        # clusterctl move: pause, read the source, create the copy ... (here: delete first, one API server, one name)
        await paused(True)

        async def paused_condition():
            current = await body() or {}
            return current if any(c["type"] == "Paused" and c["status"] == "True"
                                  for c in (current.get("status") or {}).get("conditions") or []) else None
        source = await wait_until("the Paused condition", paused_condition, 60)
        # ... then delete it as clusterctl does: the annotation (replacing the whole map), delete, strip finalizers.
        await objects.patch_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name,
            [{"op": "add", "path": "/metadata/annotations", "value": {DELETE_FOR_MOVE_ANNOTATION: ""}}],
            _content_type="application/json-patch+json")
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)
        try:
            await objects.patch_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                         name, {"metadata": {"finalizers": []}},
                                                         _content_type="application/merge-patch+json")
        except client.exceptions.ApiException as error:
            assert error.status == 404  # the operator released its finalizer first (delete-for-move)

        async def gone():
            return await body() is None
        await wait_until("the source copy to be gone", gone, 60)
        assert on_host(move_host, naming.uid_hash(source_uid)) == before, "deleting for move touched the host"
        await events_posted(core, namespace, "DeletedForMove", f"involvedObject.uid={source_uid}")

        metadata = source["metadata"]
        copy = {"apiVersion": meta.API_VERSION, "kind": "LibvirtMachine",
                "metadata": {"name": name, "namespace": namespace, "labels": metadata.get("labels") or {},
                             "annotations": metadata.get("annotations") or {},
                             "finalizers": metadata.get("finalizers") or [],
                             "ownerReferences": metadata.get("ownerReferences") or []},
                "spec": source["spec"]}
        assert FINALIZER in copy["metadata"]["finalizers"]
        created = await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                "libvirtmachines", copy)
        copy_uid = created["metadata"]["uid"]
        assert copy_uid != source_uid and not created.get("status")
        await paused(False)

        adopted = await wait_until("the copy to be adopted and ready", ready, DEADLINE_S)
        status = adopted["status"]
        assert adopted["metadata"]["uid"] == copy_uid
        assert adopted["spec"]["providerID"] == source["spec"]["providerID"]
        assert adopted["metadata"]["annotations"][IDENTITY_ANNOTATION] == source_uid
        assert status["host"] == move_host.name and status["domainUUID"] == uuid_
        assert status["initialization"] == {"provisioned": True}
        assert any(a["type"] == "InternalIP" for a in status["addresses"])
        assert on_host(move_host, naming.uid_hash(source_uid)) == before, "same domain, same ID, same volumes"
        reasons = await events_of(copy_uid)
        assert "Placed" not in reasons and "DomainDefined" not in reasons, reasons

        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)
        await wait_until("the copy's deletion", gone, 120)
    assert on_host(move_host, naming.uid_hash(source_uid)) == {"domains": {}, "volumes": []}
