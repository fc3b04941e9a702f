"""The running operator writes a LibvirtMachineTemplate's status.capacity, read back as a map of strings; an edit of
the template's spec in place is taken (Cluster API's topology controller dry-runs templates onto the current ones) and
reported by the EditedInPlace condition, naming what to do instead, since it rolls nothing; a new shape is a new
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


async def test_template_capacity_is_its_spec_and_an_edit_in_place_is_reported(api_client, namespace, running_operator):
    objects = client.CustomObjectsApi(api_client)

    def template(name: str, cpus: int) -> dict:
        return {"apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": {"name": name},
                "spec": {"template": {"spec": {"image": {"volume": "base.qcow2"}, "cpus": cpus, "memoryMiB": 4096}}}}

    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates",
                                                  template("workers", 2))
    status = await wait_for_status(objects, namespace, "workers", lambda s: "capacity" in s)
    assert status["capacity"] == {"cpu": "2", "memory": "4096Mi", "ephemeral-storage": "20Gi"}
    assert status["nodeInfo"] == {"architecture": "amd64", "operatingSystem": "linux"}

    # An edit in place is taken (Cluster API's topology controller dry-runs templates onto the current ones), and
    # reported: the capacity follows the spec, and the EditedInPlace condition says that it rolled nothing.
    await objects.patch_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates", "workers",
        {"spec": {"template": {"spec": {"cpus": 8}}}}, **MERGE,
    )
    status = await wait_for_status(objects, namespace, "workers", lambda s: "conditions" in s)
    assert status["capacity"]["cpu"] == "8"
    [edited] = status["conditions"]
    assert (edited["type"], edited["status"], edited["observedGeneration"]) == ("EditedInPlace", "True", 2), edited
    assert "create a new LibvirtMachineTemplate" in edited["message"]

    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates",
                                                  template("workers-v2", 8))
    status = await wait_for_status(objects, namespace, "workers-v2", lambda s: "capacity" in s)
    assert status["capacity"] == {"cpu": "8", "memory": "4096Mi", "ephemeral-storage": "20Gi"}
