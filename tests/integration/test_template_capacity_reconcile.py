"""The running operator keeps a LibvirtMachineTemplate's status.capacity current, read back as a map of strings."""

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


async def test_template_capacity_follows_the_spec(api_client, namespace, running_operator):
    objects = client.CustomObjectsApi(api_client)
    template = {
        "apiVersion": meta.API_VERSION,
        "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "workers"},
        "spec": {"template": {"spec": {"image": {"volume": "base.qcow2"}, "cpus": 2, "memoryMiB": 4096}}},
    }
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates",
                                                  template)
    status = await wait_for_status(objects, namespace, "workers", lambda s: "capacity" in s)
    assert status["capacity"] == {"cpu": "2", "memory": "4096Mi", "ephemeral-storage": "20Gi"}
    assert status["nodeInfo"] == {"architecture": "amd64", "operatingSystem": "linux"}

    await objects.patch_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates", "workers",
        {"spec": {"template": {"spec": {"cpus": 8}}}}, **MERGE,
    )
    status = await wait_for_status(objects, namespace, "workers", lambda s: s.get("capacity", {}).get("cpu") == "8")
    assert status["capacity"] == {"cpu": "8", "memory": "4096Mi", "ephemeral-storage": "20Gi"}
