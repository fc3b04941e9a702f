"""What clusterctl move creates on a target whose operator already runs: copies of LibvirtHosts and
LibvirtMachineTemplates that carry kopf's diff-base annotation of the source (so kopf takes them for handled and runs
no create handler) and no status. The host still gets into the inventory (its status published) and the template
still gets status.capacity and status.nodeInfo."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator

import kopf
import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from devenv import control_plane as cp

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DIFF_BASE = "capi-libvirt.x-k8s.io/last-handled-configuration"
KOPF_FINALIZER = f"{meta.GROUP}/libvirt"
FAKE_PEM = b"-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
async def operator(control_plane) -> AsyncIterator[None]:
    # A copied LibvirtHost carries kopf's diff-base, so no create handler runs for it: it joins the inventory at the
    # probe loop's next pass (add_missing_hosts), every second here instead of every 30.
    async with operator_running(control_plane, hosts={}, probe_interval_s=1.0):
        yield


async def test_a_copied_template_gets_its_capacity(api_client, namespace, operator) -> None:
    objects = client.CustomObjectsApi(api_client)
    spec = {"template": {"spec": {"image": {"volume": "base.qcow2"}, "cpus": 3, "memoryMiB": 2048}}}
    source = await objects.create_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates",
        {"apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": {"name": "source"},
         "spec": spec})
    # kopf's diff base of the source as a release with create/update handlers stored it (defaults applied).
    essence = kopf.AnnotationsDiffBaseStorage(prefix="capi-libvirt.x-k8s.io").build(body=kopf.Body(source))
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "copied", "annotations": {DIFF_BASE: json.dumps(essence)}}, "spec": source["spec"]})

    async def capacity():
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                          "libvirtmachinetemplates", "copied")
        return (body.get("status") or {}).get("capacity")
    assert await wait_until("the copy's status.capacity", capacity, 30) == {
        "cpu": "3", "memory": "2048Mi", "ephemeral-storage": "20Gi"}


async def test_a_copied_host_joins_the_inventory(api_client, namespace, operator) -> None:
    objects = client.CustomObjectsApi(api_client)
    suffix = uuid.uuid4().hex[:6]
    creds = f"move-creds-{suffix}"  # in the provider's namespace, the only one host credentials may be in
    await client.CoreV1Api(api_client).create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=creds),
        data={key: base64.b64encode(FAKE_PEM).decode() for key in ("ca.crt", "tls.crt", "tls.key")}))
    spec = {"uri": f"qemu+tls://127.0.0.1:{cp.free_port()}/system",
            "credentialsSecretRef": {"name": creds, "namespace": PROVIDER_NAMESPACE}}

    async def host(name: str) -> dict:
        return await objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)

    async def published(name: str) -> dict | None:
        body = await host(name)
        return body if (body.get("status") or {}).get("conditions") else None

    source_name, copy_name = f"move-src-{suffix}", f"move-copy-{suffix}"
    await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": source_name}, "spec": spec})
    try:
        async def handled():
            body = await host(source_name)
            return body if DIFF_BASE in (body["metadata"].get("annotations") or {}) else None
        source = await wait_until("kopf to handle the source host", handled, 30)
        # The copy as clusterctl creates it: the source's annotations (kopf's diff base too) and finalizers.
        await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtHost",
            "metadata": {"name": copy_name, "annotations": source["metadata"]["annotations"],
                         "finalizers": source["metadata"].get("finalizers") or [KOPF_FINALIZER]},
            "spec": source["spec"]})
        copied = await wait_until("the copy's status (it is in the inventory)", lambda: published(copy_name), 90)
        [ready] = [c for c in copied["status"]["conditions"] if c["type"] == "Ready"]
        assert ready["reason"] == "HostUnreachable"  # probed: a closed port
    finally:
        await client.CoreV1Api(api_client).delete_namespaced_secret(creds, PROVIDER_NAMESPACE)
        for name in (source_name, copy_name):
            try:
                await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)
            except client.exceptions.ApiException as error:
                if error.status != 404:
                    raise

        async def both_gone():
            listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
            return not {source_name, copy_name} & {h["metadata"]["name"] for h in listed["items"]}
        await wait_until("both hosts removed", both_gone, 60)
