"""The generated CRDs on a real kube-apiserver: they install, refuse bad objects naming the field, keep good ones."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from capi_libvirt.api import kinds, meta, v1alpha1

pytestmark = pytest.mark.integration


def machine(name: str, **spec: object) -> dict:
    return {
        "apiVersion": meta.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": name},
        "spec": {"image": {"volume": "debian-12.qcow2"}, **spec},
    }


async def create(api_client: client.ApiClient, namespace: str, body: dict, plural: str = "libvirtmachines") -> dict:
    return await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, plural, body
    )


async def refused(api_client: client.ApiClient, namespace: str, body: dict, plural: str = "libvirtmachines") -> str:
    with pytest.raises(ApiException) as caught:
        await create(api_client, namespace, body, plural)
    assert caught.value.status == 422, caught.value.body
    return json.loads(caught.value.body)["message"]


MERGE = {"_content_type": "application/merge-patch+json"}


async def test_every_generated_crd_is_established_with_cluster_api_crds_beside_it(api_client):
    extensions = client.ApiextensionsV1Api(api_client)
    installed = {crd.metadata.name: crd for crd in (await extensions.list_custom_resource_definition()).items}
    for kind in kinds.ALL:
        crd = installed[f"{kind.plural}.{meta.GROUP}"]
        assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
        assert crd.metadata.labels["cluster.x-k8s.io/v1beta2"] == "v1alpha1"
    assert "machines.cluster.x-k8s.io" in installed and "clusters.cluster.x-k8s.io" in installed


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"memoryMiB": -512}, "spec.memoryMiB"),
        ({"domainType": "xen"}, "spec.domainType"),
        ({"cpus": 0}, "spec.cpus"),
        ({"diskBus": "floppy"}, "spec.diskBus"),
        ({"interfaces": [{"network": "default", "bridge": "br0"}]}, "set exactly one of network or bridge"),
        ({"interfaces": []}, "spec.interfaces"),
        ({"host": "Not_A_DNS_Label"}, "spec.host"),
        ({"cpus": 4, "cpuTopology": {"sockets": 1, "cores": 2, "threads": 1}}, v1alpha1.TOPOLOGY_MATCHES_CPUS),
        ({"cpuTopology": {"sockets": 1, "cores": 1, "threads": 1}}, v1alpha1.TOPOLOGY_MATCHES_CPUS),  # cpus: 2
        ({"cpuModel": "qemu64", "cpuMode": "host-model"}, v1alpha1.MODEL_OR_MODE),
        ({"firmware": "efi"}, "spec.firmware"),
        ({"dataDisks": [{"sizeGiB": 1}] * 9}, "spec.dataDisks"),
        ({"dataDisks": [{"sizeGiB": 0}]}, "spec.dataDisks[0].sizeGiB"),
    ],
    ids=["negative-memory", "unknown-domain-type", "zero-cpus", "unknown-disk-bus", "network-and-bridge",
         "no-interface", "bad-host-name", "topology-not-cpus", "topology-not-default-cpus", "model-and-mode",
         "unknown-firmware", "too-many-data-disks", "empty-data-disk"],
)
async def test_invalid_machine_is_refused_naming_the_field(api_client, namespace, spec, field):
    message = await refused(api_client, namespace, machine("bad", **spec))
    assert field in message


async def test_machine_without_required_image_is_refused_naming_it(api_client, namespace):
    body = machine("no-image")
    del body["spec"]["image"]
    message = await refused(api_client, namespace, body)
    assert "spec.image" in message and "Required" in message


async def test_valid_machine_round_trips_with_defaults_applied(api_client, namespace):
    created = await create(api_client, namespace, machine("good", cpus=4, domainType="qemu"))
    objects = client.CustomObjectsApi(api_client)
    fetched = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "good")
    assert fetched["spec"] == created["spec"]
    assert fetched["spec"]["cpus"] == 4 and fetched["spec"]["domainType"] == "qemu"
    assert fetched["spec"]["memoryMiB"] == 2048 and fetched["spec"]["diskBus"] == "virtio"
    assert fetched["spec"]["interfaces"] == [{"network": "default", "model": "virtio"}]


async def test_status_is_written_through_its_subresource_only(api_client, namespace):
    await create(api_client, namespace, machine("status"))
    objects = client.CustomObjectsApi(api_client)
    args = (meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "status")

    # A status written through the main resource is dropped: status belongs to the subresource.
    patched = await objects.patch_namespaced_custom_object(*args, {"status": {"ready": True}}, **MERGE)
    assert "ready" not in patched.get("status", {})

    status = {"status": {"ready": True, "initialization": {"provisioned": True},
                         "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]}}
    patched = await objects.patch_namespaced_custom_object_status(*args, status, **MERGE)
    assert patched["status"]["initialization"] == {"provisioned": True}

    # ... and a spec written through the status subresource is dropped.
    patched = await objects.patch_namespaced_custom_object_status(*args, {"spec": {"cpus": 8}}, **MERGE)
    assert patched["spec"]["cpus"] == 2 and patched["status"]["ready"] is True


async def test_invalid_status_is_refused_too(api_client, namespace):
    await create(api_client, namespace, machine("bad-status"))
    objects = client.CustomObjectsApi(api_client)
    with pytest.raises(ApiException) as caught:
        await objects.patch_namespaced_custom_object_status(
            meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "bad-status",
            {"status": {"addresses": [{"type": "Carrier-Pigeon", "address": "x"}]}}, **MERGE,
        )
    assert caught.value.status == 422 and "status.addresses[0].type" in json.loads(caught.value.body)["message"]


async def test_template_capacity_accepts_only_strings(api_client, namespace):
    template = {
        "apiVersion": meta.API_VERSION,
        "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "workers"},
        "spec": {"template": {"spec": {"image": {"volume": "debian-12.qcow2"}}}},
    }
    await create(api_client, namespace, template, "libvirtmachinetemplates")
    objects = client.CustomObjectsApi(api_client)
    args = (meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates", "workers")
    with pytest.raises(ApiException) as caught:
        await objects.patch_namespaced_custom_object_status(*args, {"status": {"capacity": {"cpu": 2}}}, **MERGE)
    assert caught.value.status == 422 and "status.capacity.cpu" in json.loads(caught.value.body)["message"]
    patched = await objects.patch_namespaced_custom_object_status(*args, {"status": {"capacity": {"cpu": "2"}}}, **MERGE)
    assert patched["status"]["capacity"] == {"cpu": "2"}


async def test_machine_spec_is_immutable_and_provider_id_keeps_its_domain_once_set(api_client, namespace):
    await create(api_client, namespace, machine("fixed"))
    objects = client.CustomObjectsApi(api_client)
    args = (meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "fixed")
    with pytest.raises(ApiException) as caught:
        await objects.patch_namespaced_custom_object(*args, {"spec": {"cpus": 8}}, **MERGE)
    assert caught.value.status == 422 and "immutable" in json.loads(caught.value.body)["message"]
    with pytest.raises(ApiException) as caught:
        await objects.patch_namespaced_custom_object(*args, {"spec": {"host": "kvm2"}}, **MERGE)
    assert caught.value.status == 422

    provider_id = "libvirt://kvm1/5d64ece4-dc73-59e8-9624-de2ce4c5a35e"
    patched = await objects.patch_namespaced_custom_object(*args, {"spec": {"providerID": provider_id}}, **MERGE)
    assert patched["spec"]["providerID"] == provider_id
    with pytest.raises(ApiException) as caught:  # another domain: never
        await objects.patch_namespaced_custom_object(
            *args, {"spec": {"providerID": "libvirt://kvm1/0d64ece4-dc73-59e8-9624-de2ce4c5a35e"}}, **MERGE)
    assert caught.value.status == 422 and "providerID cannot change" in json.loads(caught.value.body)["message"]
    with pytest.raises(ApiException) as caught:
        await objects.patch_namespaced_custom_object(*args, {"spec": {"providerID": None}}, **MERGE)
    assert caught.value.status == 422
    # The same domain UUID on another host: a machine that never had a domain, placed again after a host outage.
    moved = "libvirt://kvm2/5d64ece4-dc73-59e8-9624-de2ce4c5a35e"
    patched = await objects.patch_namespaced_custom_object(*args, {"spec": {"providerID": moved}}, **MERGE)
    assert patched["spec"]["providerID"] == moved
