"""Cluster API objects made the way Cluster API's controllers would make them, for the demo and the tests.

Without the Cluster API controllers running, something must play their part: a Cluster whose infrastructure is
provisioned, a bootstrap Secret, a Machine pointing at it, and a LibvirtMachine owned by that Machine.
"""

from __future__ import annotations

import base64
import dataclasses

from kubernetes_asyncio import client

from capi_libvirt.api import meta

CAPI_GROUP, CAPI_VERSION, CLUSTER_NAME_LABEL = meta.CAPI_GROUP, meta.CAPI_VERSION, meta.CLUSTER_NAME_LABEL
MERGE = {"_content_type": "application/merge-patch+json"}


@dataclasses.dataclass(frozen=True)
class MachineObjects:
    namespace: str
    cluster: str
    machine: str
    libvirt_machine: str
    secret: str


def marker_user_data(marker: str) -> str:
    """cloud-config that proves it ran: the marker on the serial console (and in a file), then a final message."""
    return (
        "#cloud-config\n"
        "runcmd:\n"
        f"  - [sh, -c, 'echo {marker} > /run/capi-libvirt-marker; echo {marker} > /dev/ttyS0']\n"
        f"final_message: \"capi-libvirt bootstrap finished: {marker}\"\n"
    )


async def create_cluster(api: client.ApiClient, namespace: str, name: str,
                         infrastructure_kind: str = "LibvirtCluster", control_plane_initialized: bool = False) -> dict:
    """A Cluster whose infrastructure is provisioned; `infrastructure_kind` may be another provider's (a Proxmox-based
    cluster with libvirt workers): LibvirtMachines do not care. `control_plane_initialized`: its workload API server
    answers (as Cluster API says once the first control-plane machine is up, and writes `<name>-kubeconfig`)."""
    objects = client.CustomObjectsApi(api)
    body = {
        "apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}",
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"infrastructureRef": {"apiGroup": meta.GROUP, "kind": infrastructure_kind, "name": name}},
    }
    cluster = await objects.create_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "clusters", body)
    await objects.patch_namespaced_custom_object_status(
        CAPI_GROUP, CAPI_VERSION, namespace, "clusters", name,
        {"status": {"initialization": {"infrastructureProvisioned": True,
                                       **({"controlPlaneInitialized": True} if control_plane_initialized else {})}}},
        **MERGE)
    return cluster


async def create_machine(api: client.ApiClient, namespace: str, cluster: str, name: str, user_data: str,
                         libvirt_spec: dict, *, bootstrap_format: str = "cloud-config",
                         create_secret: bool = True, labels: dict[str, str] | None = None) -> MachineObjects:
    """Bootstrap Secret, Machine and owned LibvirtMachine, in the order Cluster API creates them; `labels` go on the
    Machine and the LibvirtMachine (as a MachineSet puts its deployment-name label on both)."""
    objects = client.CustomObjectsApi(api)
    labels = {CLUSTER_NAME_LABEL: cluster, **(labels or {})}
    secret = f"{name}-bootstrap"
    if create_secret:
        await create_bootstrap_secret(api, namespace, cluster, secret, user_data, bootstrap_format)
    machine = await objects.create_namespaced_custom_object(CAPI_GROUP, CAPI_VERSION, namespace, "machines",
                                                            machine_body(cluster, name, labels))
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                  libvirt_machine_body(cluster, name, machine["metadata"]["uid"],
                                                                       libvirt_spec, labels))
    return MachineObjects(namespace=namespace, cluster=cluster, machine=name, libvirt_machine=name, secret=secret)


def machine_body(cluster: str, name: str, labels: dict[str, str] | None = None) -> dict:
    """A Machine whose bootstrap data is the Secret `<name>-bootstrap` and whose infrastructure is the LibvirtMachine
    `name`."""
    return {
        "apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}",
        "kind": "Machine",
        "metadata": {"name": name, "labels": {CLUSTER_NAME_LABEL: cluster, **(labels or {})}},
        "spec": {
            "clusterName": cluster,
            "bootstrap": {"dataSecretName": f"{name}-bootstrap"},
            "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachine", "name": name},
        },
    }


def libvirt_machine_body(cluster: str, name: str, machine_uid: str, libvirt_spec: dict,
                         labels: dict[str, str] | None = None) -> dict:
    """A LibvirtMachine owned (as its controller) by the Machine of the same name."""
    return {
        "apiVersion": meta.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {
            "name": name,
            "labels": {CLUSTER_NAME_LABEL: cluster, **(labels or {})},
            "ownerReferences": [{"apiVersion": f"{CAPI_GROUP}/{CAPI_VERSION}", "kind": "Machine", "name": name,
                                 "uid": machine_uid, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": libvirt_spec,
    }


async def create_bootstrap_secret(api: client.ApiClient, namespace: str, cluster: str, name: str, user_data: str,
                                  bootstrap_format: str = "cloud-config") -> None:
    """The Secret a bootstrap provider writes: `value` (the data) and `format`, labelled with the cluster."""
    await client.CoreV1Api(api).create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, labels={CLUSTER_NAME_LABEL: cluster}), type="cluster.x-k8s.io/secret",
        data={"value": base64.b64encode(user_data.encode()).decode(),
              "format": base64.b64encode(bootstrap_format.encode()).decode()}))
