"""Kubernetes API calls of the reconciles: owners, clusters, bootstrap Secrets, and our objects' spec and status.

asyncio-native (kubernetes_asyncio on aiohttp, like kopf), so no call blocks the event loop. "Not found" is
recognised by HTTP status 404 and returned as None; every other error propagates.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
from typing import Any

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from capi_libvirt.api import meta

CAPI_GROUP, CAPI_VERSION = meta.CAPI_GROUP, meta.CAPI_VERSION

# The client logs whole response bodies at DEBUG, Secrets (bootstrap data, host keys) included: never below INFO,
# whatever level the operator runs at.
logging.getLogger("kubernetes_asyncio.client.rest").setLevel(logging.INFO)
MERGE_PATCH = {"_content_type": "application/merge-patch+json"}


@dataclasses.dataclass(frozen=True)
class BootstrapData:
    value: bytes
    format: str  # cloud-config or ignition

    def __repr__(self) -> str:  # bootstrap data can hold credentials: never in a log line or a traceback
        return f"BootstrapData(format={self.format!r}, value=<{len(self.value)} bytes>)"


async def new_api_client() -> client.ApiClient:
    """A client from $KUBECONFIG / ~/.kube/config, or the in-cluster service account."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return client.ApiClient(configuration)


async def _or_none(coroutine: Any) -> Any:
    try:
        return await coroutine
    except ApiException as error:
        if error.status == 404:
            return None
        raise


class KubeAPI:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.client = api_client
        self.objects = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.calls = 0  # API calls made, for the numbers in the README

    async def get_machine(self, namespace: str, name: str) -> dict | None:
        self.calls += 1
        return await _or_none(self.objects.get_namespaced_custom_object(
            CAPI_GROUP, CAPI_VERSION, namespace, "machines", name))

    async def get_cluster(self, namespace: str, name: str) -> dict | None:
        self.calls += 1
        return await _or_none(self.objects.get_namespaced_custom_object(
            CAPI_GROUP, CAPI_VERSION, namespace, "clusters", name))

    async def get_libvirt_machine(self, namespace: str, name: str) -> dict | None:
        self.calls += 1
        return await _or_none(self.objects.get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name))

    async def get_libvirt_cluster(self, namespace: str, name: str) -> dict | None:
        self.calls += 1
        return await _or_none(self.objects.get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name))

    async def patch_libvirt_cluster(self, namespace: str, name: str, patch: dict) -> dict:
        self.calls += 1
        return await self.objects.patch_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name, patch, **MERGE_PATCH)

    async def patch_libvirt_cluster_status(self, namespace: str, name: str, status: dict) -> dict:
        self.calls += 1
        return await self.objects.patch_namespaced_custom_object_status(
            meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name, {"status": status}, **MERGE_PATCH)

    async def list_libvirt_machines(self) -> list[dict]:
        """Every LibvirtMachine of every namespace: what is allocated on each host, and each group's spread."""
        self.calls += 1
        listed = await self.objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirtmachines")
        return listed.get("items", [])

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        self.calls += 1
        secret = await _or_none(self.core.read_namespaced_secret(name, namespace))
        if secret is None:
            return None
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    async def get_libvirt_host(self, name: str) -> dict | None:
        self.calls += 1
        return await _or_none(self.objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name))

    async def patch_libvirt_host_status(self, name: str, status: dict) -> dict:
        self.calls += 1
        return await self.objects.patch_cluster_custom_object_status(
            meta.GROUP, meta.VERSION, "libvirthosts", name, {"status": status}, **MERGE_PATCH)

    async def get_bootstrap_data(self, namespace: str, name: str) -> BootstrapData | None:
        data = await self.get_secret_data(namespace, name)
        if data is None:
            return None
        return BootstrapData(value=data.get("value", b""), format=data.get("format", b"cloud-config").decode())

    async def patch_libvirt_machine(self, namespace: str, name: str, patch: dict) -> dict:
        self.calls += 1
        return await self.objects.patch_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name, patch, **MERGE_PATCH)

    async def patch_libvirt_machine_status(self, namespace: str, name: str, status: dict) -> dict:
        self.calls += 1
        return await self.objects.patch_namespaced_custom_object_status(
            meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name, {"status": status}, **MERGE_PATCH)


class WorkloadNodes:
    """The workload cluster's Nodes, reached through the `<cluster>-kubeconfig` Secret Cluster API writes."""

    def __init__(self, kube: KubeAPI) -> None:
        self.kube = kube

    async def kubeconfig(self, namespace: str, cluster: str) -> dict | None:
        self.kube.calls += 1
        secret = await _or_none(self.kube.core.read_namespaced_secret(f"{cluster}-kubeconfig", namespace))
        if secret is None or not (secret.data or {}).get("value"):
            return None
        return yaml.safe_load(base64.b64decode(secret.data["value"]))

    async def set_provider_id(self, kubeconfig: dict, node_name: str, provider_id: str) -> str:
        """Set the Node's providerID when it has none; returns what happened: patched, absent, already-set or other."""
        configuration = client.Configuration()
        await config.load_kube_config_from_dict(kubeconfig, client_configuration=configuration)
        async with client.ApiClient(configuration) as workload:
            nodes = client.CoreV1Api(workload)
            node = await _or_none(nodes.read_node(node_name))
            if node is None:
                return "absent"
            current = node.spec.provider_id if node.spec else None
            if current:
                return "already-set" if current == provider_id else "other"
            await nodes.patch_node(node_name, {"spec": {"providerID": provider_id}})
            return "patched"
