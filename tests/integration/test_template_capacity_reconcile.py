"""The running operator writes a LibvirtMachineTemplate's status.capacity, read back as a map of strings; the
template's spec is immutable (the API server refuses an edit, naming what to do instead), so a new shape is a new
template, with its own capacity."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta

pytestmark = pytest.mark.integration
MERGE = {"_content_type": "application/merge-patch+json"}


async def wait_for_status(objects, namespace, name, predicate, timeout=30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    status = {}
    while asyncio.get_running_loop().time() < deadline:
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                          "libvirtmachinetemplates", name)
        status = body.get("status", {})
        if predicate(status):
            return status
        await asyncio.sleep(0.2)
    raise AssertionError(f"status never matched; last seen: {status}")


async def test_template_capacity_is_its_spec_and_an_edit_is_refused(api_client, namespace, running_operator):
    objects = client.CustomObjectsApi(api_client)

    def template(name: str, cpus: int) -> dict:
        return {"apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": {"name": name},
                "spec": {"template": {"spec": {"image": {"volume": "base.qcow2"}, "cpus": cpus, "memoryMiB": 4096}}}}

    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates",
                                                  template("workers", 2))
    status = await wait_for_status(objects, namespace, "workers", lambda s: "capacity" in s)
    assert status["capacity"] == {"cpu": "2", "memory": "4096Mi", "ephemeral-storage": "20Gi"}
    assert status["nodeInfo"] == {"architecture": "amd64", "operatingSystem": "linux"}

    with pytest.raises(client.ApiException) as refused:
        await objects.patch_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates", "workers",
            {"spec": {"template": {"spec": {"cpus": 8}}}}, **MERGE,
        )
    assert refused.value.status == 422 and "spec.template is immutable" in refused.value.body, refused.value.body
    assert "create a new LibvirtMachineTemplate" in refused.value.body

    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates",
                                                  template("workers-v2", 8))
    status = await wait_for_status(objects, namespace, "workers-v2", lambda s: "capacity" in s)
    assert status["capacity"] == {"cpu": "8", "memory": "4096Mi", "ephemeral-storage": "20Gi"}
