"""A Cluster API worker cluster whose control plane is the local API server itself, for the e2e runs with the real
Cluster API controller.

The test API server plays the workload cluster's control plane (as a hosted control plane would: Kamaji, k0smotron).
Its stand-in control-plane provider is the test: a `HostedControlPlane` object (a small CRD of this module, honouring
Cluster API's v1beta2 control-plane contract) that it marks initialized, the `<cluster>-kubeconfig` Secret that
Cluster API reads Nodes through, and the `<cluster>-ca` Secret the kubeadm bootstrap provider reads. Everything else is what a user applies: a Cluster, a LibvirtCluster, a
LibvirtMachineTemplate and a MachineDeployment whose bootstrap data is a Secret named in
`bootstrap.dataSecretName`.
"""

from __future__ import annotations

import base64
import dataclasses

from kubernetes_asyncio import client

from capi_libvirt.api import meta
from devenv.control_plane import LocalControlPlane

CP_GROUP = "controlplane.devenv.capi-libvirt.local"
CP_VERSION = "v1alpha1"
CP_KIND, CP_PLURAL = "HostedControlPlane", "hostedcontrolplanes"
CAPI = f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"
MERGE = {"_content_type": "application/merge-patch+json"}


def hosted_control_plane_crd() -> dict:
    """The stand-in control plane's CRD, labelled with the contract version it honours (Cluster API checks it)."""
    free_form = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        # clusterctl's label: `clusterctl move` lists only labelled kinds, and the Cluster's controlPlaneRef must move.
        "metadata": {"name": f"{CP_PLURAL}.{CP_GROUP}",
                     "labels": {f"{meta.CAPI_GROUP}/v1beta2": CP_VERSION, f"{meta.CAPI_GROUP}/v1beta1": CP_VERSION,
                                "clusterctl.cluster.x-k8s.io": ""}},
        "spec": {
            "group": CP_GROUP,
            "names": {"kind": CP_KIND, "listKind": f"{CP_KIND}List", "plural": CP_PLURAL,
                      "singular": CP_KIND.lower()},
            "scope": "Namespaced",
            "versions": [{
                "name": CP_VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": free_form,
                                                                                   "status": free_form}}},
            }],
        },
    }


def core_manager_role() -> dict:
    """The rights on the stand-in control plane a Cluster API core manager installed by `clusterctl init` needs (it runs
    as its ServiceAccount): aggregated into its `capi-aggregated-manager-role`, as a control-plane provider's
    components aggregate theirs."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "devenv-hosted-control-plane-capi",
                         "labels": {"cluster.x-k8s.io/aggregate-to-manager": "true"}},
            "rules": [{"apiGroups": [CP_GROUP], "resources": [CP_PLURAL, f"{CP_PLURAL}/status"],
                       "verbs": ["get", "list", "watch", "patch", "update", "delete"]}]}


def install(plane: LocalControlPlane) -> None:
    plane.apply("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", hosted_control_plane_crd())
    plane.apply("/apis/rbac.authorization.k8s.io/v1/clusterroles", core_manager_role())


@dataclasses.dataclass(frozen=True)
class WorkerCluster:
    namespace: str
    name: str


def _secret(cluster: str, suffix: str, data: dict[str, bytes]) -> client.V1Secret:
    """A Secret of the cluster as a control-plane provider writes it: `<cluster>-<suffix>`, Cluster API's type."""
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=f"{cluster}-{suffix}", labels={meta.CLUSTER_NAME_LABEL: cluster}),
        type="cluster.x-k8s.io/secret",
        data={key: base64.b64encode(value).decode() for key, value in data.items()})


async def create_worker_cluster(api: client.ApiClient, plane: LocalControlPlane, namespace: str,
                                name: str, endpoint: tuple[str, int] | None = None) -> WorkerCluster:
    """Cluster, LibvirtCluster, the initialized HostedControlPlane and the kubeconfig Secret of the local API.

    `endpoint`: the control-plane endpoint machines are told (an API gateway's address, for `kubeadm join`); by
    default the API server's loopback address. Either way Cluster API itself reads the workload cluster through the
    kubeconfig Secret. The `<cluster>-ca` Secret (the cluster CA, as kubeadm control planes publish it) lets the
    kubeadm bootstrap provider pin the CA in the join configuration it writes."""
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    if endpoint is None:
        host, port = plane.server.removeprefix("https://").rsplit(":", 1)
        endpoint = (host, int(port))
    control_plane_endpoint = {"host": endpoint[0], "port": endpoint[1]}
    await core.create_namespaced_secret(namespace, _secret(name, "kubeconfig",
                                                           {"value": plane.cluster_kubeconfig()}))
    await core.create_namespaced_secret(namespace, _secret(name, "ca", {"tls.crt": plane.ca_file.read_bytes(),
                                                                        "tls.key": plane.ca_key_file.read_bytes()}))
    await objects.create_namespaced_custom_object(CP_GROUP, CP_VERSION, namespace, CP_PLURAL, {
        "apiVersion": f"{CP_GROUP}/{CP_VERSION}", "kind": CP_KIND, "metadata": {"name": name},
        "spec": {"controlPlaneEndpoint": control_plane_endpoint}})
    await objects.patch_namespaced_custom_object_status(CP_GROUP, CP_VERSION, namespace, CP_PLURAL, name, {
        # Initialized (v1beta2 and v1beta1 contract fields), and externally managed: no control-plane Machines, so
        # Cluster API may still delete the Nodes of the Machines it deletes.
        "status": {"initialization": {"controlPlaneInitialized": True}, "ready": True, "initialized": True,
                   "externalManagedControlPlane": True}},
        **MERGE)
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtclusters", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtCluster", "metadata": {"name": name},
        "spec": {"controlPlaneEndpoint": control_plane_endpoint}})
    await objects.create_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "clusters", {
        "apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": name},
        "spec": {
            "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtCluster", "name": name},
            "controlPlaneRef": {"apiGroup": CP_GROUP, "kind": CP_KIND, "name": name},
        }})
    return WorkerCluster(namespace, name)


async def create_machine_deployment(api: client.ApiClient, cluster: WorkerCluster, name: str, machine_spec: dict,
                                    data_secret: str, replicas: int | None,
                                    annotations: dict[str, str] | None = None) -> None:
    """A LibvirtMachineTemplate and a MachineDeployment of it whose machines boot with the Secret `data_secret`."""
    objects = client.CustomObjectsApi(api)
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, cluster.namespace,
                                                  "libvirtmachinetemplates", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": {"name": name},
        "spec": {"template": {"spec": machine_spec}}})
    spec: dict = {
        "clusterName": cluster.name,
        "selector": {"matchLabels": {}},
        "template": {"spec": {
            "clusterName": cluster.name,
            "bootstrap": {"dataSecretName": data_secret},
            "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachineTemplate", "name": name},
        }},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    metadata: dict = {"name": name, **({"annotations": annotations} if annotations else {})}
    await objects.create_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, cluster.namespace,
                                                  "machinedeployments", {
        "apiVersion": CAPI, "kind": "MachineDeployment", "metadata": metadata, "spec": spec})


async def scale(api: client.ApiClient, cluster: WorkerCluster, deployment: str, replicas: int) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        meta.CAPI_GROUP, meta.CAPI_VERSION, cluster.namespace, "machinedeployments", deployment,
        {"spec": {"replicas": replicas}}, **MERGE)
