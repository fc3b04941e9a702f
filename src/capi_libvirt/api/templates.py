"""The cluster templates (flavors) users give `clusterctl generate cluster`: plain, ClusterClass, autoscaler and
static-ip (addresses from a Cluster API IPAM pool).

Every object is a Python dict; clusterctl's variables (`${VAR}`, `${VAR:=default}`) are plain string values in them.
All use the Cluster API v1beta2 types and Kubeadm bootstrap and control plane. The kubelet takes its providerID and
the node its name from the NoCloud meta-data the provider writes, through cloud-init's Jinja (Kubeadm's bootstrap
data starts with `## template: jinja`).

The control-plane endpoint is an address the user gives: a virtual IP on the machines' network, which kube-vip holds
on the control-plane machines (api.endpoint_holder), or a load balancer's in front of them (then drop kube-vip's file
and commands from the KubeadmControlPlane). Every flavor brings its pod network (api.pod_network: flannel) as a
ConfigMap that a ClusterResourceSet applies to the workload cluster, selecting its Cluster by the `cni` label.
"""

from __future__ import annotations

from typing import Any

from capi_libvirt.api import endpoint_holder, meta, pod_network
from capi_libvirt.api.quoting import Quoted, dump

BOOTSTRAP_GROUP = "bootstrap.cluster.x-k8s.io"
CONTROLPLANE_GROUP = "controlplane.cluster.x-k8s.io"
ADDONS_GROUP = "addons.cluster.x-k8s.io"
CAPI = f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"
BOOTSTRAP = f"{BOOTSTRAP_GROUP}/{meta.CAPI_VERSION}"
CONTROLPLANE = f"{CONTROLPLANE_GROUP}/{meta.CAPI_VERSION}"
ADDONS = f"{ADDONS_GROUP}/{meta.CAPI_VERSION}"

PROVIDER_ID_FROM_METADATA = "{{ ds.meta_data.provider_id }}"
HOSTNAME_FROM_METADATA = "{{ ds.meta_data.local_hostname }}"

# Pods and services of the workload cluster: outside libvirt's default NAT network (192.168.122.0/24).
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"

# The autoscaler's node-group bounds (cluster-autoscaler's clusterapi provider reads these annotations).
AUTOSCALER_MIN = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
AUTOSCALER_MAX = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"

# Variables; those with `:=` have defaults, clusterctl requires the others.
CLUSTER_NAME = "${CLUSTER_NAME}"
NAMESPACE = "${NAMESPACE}"
KUBERNETES_VERSION = "${KUBERNETES_VERSION}"
CONTROL_PLANE_MACHINE_COUNT = "${CONTROL_PLANE_MACHINE_COUNT}"
WORKER_MACHINE_COUNT = "${WORKER_MACHINE_COUNT}"


WORKER_MACHINE_MIN_COUNT = Quoted("${WORKER_MACHINE_MIN_COUNT:=0}")
WORKER_MACHINE_MAX_COUNT = Quoted("${WORKER_MACHINE_MAX_COUNT:=5}")
CONTROL_PLANE_ENDPOINT_HOST = "${CONTROL_PLANE_ENDPOINT_HOST}"
CONTROL_PLANE_ENDPOINT_PORT = "${CONTROL_PLANE_ENDPOINT_PORT:=6443}"
LIBVIRT_BASE_IMAGE = "${LIBVIRT_BASE_IMAGE}"
LIBVIRT_STORAGE_POOL = "${LIBVIRT_STORAGE_POOL:=default}"
LIBVIRT_NETWORK = "${LIBVIRT_NETWORK:=default}"
CONTROL_PLANE_CPUS = "${LIBVIRT_CONTROL_PLANE_CPUS:=2}"
CONTROL_PLANE_MEMORY_MIB = "${LIBVIRT_CONTROL_PLANE_MEMORY_MIB:=4096}"
WORKER_CPUS = "${LIBVIRT_WORKER_CPUS:=2}"
WORKER_MEMORY_MIB = "${LIBVIRT_WORKER_MEMORY_MIB:=4096}"
DISK_GIB = "${LIBVIRT_DISK_GIB:=20}"
PROVIDER_NAMESPACE = f"${{CAPI_LIBVIRT_NAMESPACE:={meta.PROVIDER_NAMESPACE}}}"  # where `clusterctl init` put us

CLUSTER_CLASS = "libvirt-kubeadm-v0.1.0"  # versioned, so a changed class is a new class clusters move to
WORKER_MEMORY_VARIABLE = "workerMemoryMiB"


def _ref(group: str, kind: str, name: str) -> dict[str, Any]:
    """A v1beta2 contract reference: apiGroup, kind, name (same namespace)."""
    return {"apiGroup": group, "kind": kind, "name": name}


def _template_ref(api_version: str, kind: str, name: str) -> dict[str, Any]:
    """A ClusterClass template reference: v1beta2 ClusterClasses name templates by apiVersion."""
    return {"apiVersion": api_version, "kind": kind, "name": name}


def _object(api_version: str, kind: str, name: str, spec: dict[str, Any],
            annotations: dict[str, Any] | None = None, labels: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}


def node_registration() -> dict[str, Any]:
    """The kubelet gets its providerID (and the node its name) from the machine's NoCloud meta-data."""
    return {
        "name": HOSTNAME_FROM_METADATA,
        "kubeletExtraArgs": [{"name": "provider-id", "value": PROVIDER_ID_FROM_METADATA}],
    }


def machine_spec(cpus: str, memory_mib: str, control_plane: bool = False) -> dict[str, Any]:
    """A machine template's spec; a control-plane machine's interface may also send from the endpoint's virtual IP,
    which kube-vip moves between them (the hosts' admin grants it: LibvirtHost spec.access.allowedAddresses)."""
    interface: dict[str, Any] = {"network": LIBVIRT_NETWORK}
    if control_plane:
        interface["allowedAddresses"] = [CONTROL_PLANE_ENDPOINT_HOST]
    return {
        "image": {"volume": LIBVIRT_BASE_IMAGE},
        "storagePool": LIBVIRT_STORAGE_POOL,
        "cpus": cpus,
        "memoryMiB": memory_mib,
        "diskGiB": DISK_GIB,
        "interfaces": [interface],
    }


def _machine_template(name: str, cpus: str, memory_mib: str, control_plane: bool = False) -> dict[str, Any]:
    spec = {"template": {"spec": machine_spec(cpus, memory_mib, control_plane)}}
    return _object(meta.API_VERSION, "LibvirtMachineTemplate", name, spec)


def _kubeadm_config_spec() -> dict[str, Any]:
    """The control plane's: kubeadm init and join with the providerID, and kube-vip holding the endpoint."""
    return {
        "format": "cloud-config",
        "initConfiguration": {"nodeRegistration": node_registration()},
        "joinConfiguration": {"nodeRegistration": node_registration()},
        **endpoint_holder.kubeadm_config(CONTROL_PLANE_ENDPOINT_HOST, CONTROL_PLANE_ENDPOINT_PORT),
    }


def _worker_bootstrap_template(name: str) -> dict[str, Any]:
    return _object(BOOTSTRAP, "KubeadmConfigTemplate", name, {
        "template": {"spec": {"format": "cloud-config", "joinConfiguration": {"nodeRegistration": node_registration()}}},
    })


def _endpoint() -> dict[str, Any]:
    return {"host": CONTROL_PLANE_ENDPOINT_HOST, "port": CONTROL_PLANE_ENDPOINT_PORT}


def _cluster_network() -> dict[str, Any]:
    return {"pods": {"cidrBlocks": [POD_CIDR]}, "services": {"cidrBlocks": [SERVICE_CIDR]}}


# The pod network: a ConfigMap of flannel's manifest and the ClusterResourceSet that applies it (once: a
# ClusterResourceSet never deletes what it applied) to the Clusters labelled `cni: <cluster>-pod-network`.
POD_NETWORK = f"{CLUSTER_NAME}-pod-network"
POD_NETWORK_LABELS = {"cni": POD_NETWORK}
POD_NETWORK_KEY = "flannel.yaml"


def pod_network_objects() -> list[dict[str, Any]]:
    """The ConfigMap holding flannel's objects as one YAML stream, and the ClusterResourceSet naming it."""
    api_server = (Quoted(CONTROL_PLANE_ENDPOINT_HOST), Quoted(CONTROL_PLANE_ENDPOINT_PORT))
    stream = "".join("---\n" + dump(document) for document in pod_network.manifest(POD_CIDR, api_server))
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": POD_NETWORK, "namespace": NAMESPACE}, "data": {POD_NETWORK_KEY: stream}}
    resource_set = _object(ADDONS, "ClusterResourceSet", POD_NETWORK, {
        "clusterSelector": {"matchLabels": POD_NETWORK_LABELS},
        "resources": [{"name": POD_NETWORK, "kind": "ConfigMap"}],
        "strategy": "ApplyOnce",
    })
    return [config_map, resource_set]


def secrets_binding() -> dict[str, Any]:
    """The provider may read this namespace's Secrets (bootstrap data, `<cluster>-kubeconfig`): a RoleBinding of its
    ClusterRole to its ServiceAccount, in the cluster's namespace only (never a ClusterRoleBinding: docs/book/src/topics/tenants.md).
    One per cluster, so deleting one cluster's objects leaves the others' binding."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{CLUSTER_NAME}-{meta.SECRETS_CLUSTER_ROLE}", "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": meta.SECRETS_CLUSTER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": meta.PROVIDER_SERVICE_ACCOUNT, "namespace": PROVIDER_NAMESPACE}],
    }


# -- the default flavor ----------------------------------------------------------------------------------------------

def _machine_deployment(name: str, replicas: str | None, annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterName": CLUSTER_NAME,
        "selector": {"matchLabels": {}},  # Cluster API's defaulting adds the cluster and deployment labels
        "template": {"spec": {
            "clusterName": CLUSTER_NAME,
            "version": KUBERNETES_VERSION,
            "bootstrap": {"configRef": _ref(BOOTSTRAP_GROUP, "KubeadmConfigTemplate", name)},
            "infrastructureRef": _ref(meta.GROUP, "LibvirtMachineTemplate", name),
        }},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return _object(CAPI, "MachineDeployment", name, spec, annotations)


def cluster_template(worker_annotations: dict[str, Any] | None = None,
                     worker_replicas: str | None = WORKER_MACHINE_COUNT) -> list[dict[str, Any]]:
    """The default flavor: a Cluster on a LibvirtCluster, a KubeadmControlPlane of LibvirtMachines, one
    MachineDeployment of workers and the pod network."""
    control_plane = f"{CLUSTER_NAME}-control-plane"
    workers = f"{CLUSTER_NAME}-md-0"
    return [
        _object(CAPI, "Cluster", CLUSTER_NAME, {
            "clusterNetwork": _cluster_network(),
            "infrastructureRef": _ref(meta.GROUP, "LibvirtCluster", CLUSTER_NAME),
            "controlPlaneRef": _ref(CONTROLPLANE_GROUP, "KubeadmControlPlane", control_plane),
        }, labels=POD_NETWORK_LABELS),
        # The provider supplies the endpoint (Cluster API copies it to the Cluster).
        _object(meta.API_VERSION, "LibvirtCluster", CLUSTER_NAME, {"controlPlaneEndpoint": _endpoint()}),
        _object(CONTROLPLANE, "KubeadmControlPlane", control_plane, {
            "replicas": CONTROL_PLANE_MACHINE_COUNT,
            "version": KUBERNETES_VERSION,
            "machineTemplate": {"spec": {
                "infrastructureRef": _ref(meta.GROUP, "LibvirtMachineTemplate", control_plane),
            }},
            "kubeadmConfigSpec": _kubeadm_config_spec(),
        }),
        _machine_template(control_plane, CONTROL_PLANE_CPUS, CONTROL_PLANE_MEMORY_MIB, control_plane=True),
        _machine_deployment(workers, worker_replicas, worker_annotations),
        _worker_bootstrap_template(workers),
        _machine_template(workers, WORKER_CPUS, WORKER_MEMORY_MIB),
        *pod_network_objects(),
        secrets_binding(),
    ]


def autoscaler_template() -> list[dict[str, Any]]:
    """The default flavor with cluster-autoscaler owning the workers' replicas: min/max annotations and no
    `replicas` (Cluster API then starts the MachineDeployment at the minimum and leaves the count to the
    autoscaler). No capacity annotations: the autoscaler sizes a node group at zero from
    LibvirtMachineTemplate.status.capacity, which the provider fills."""
    return cluster_template({AUTOSCALER_MIN: WORKER_MACHINE_MIN_COUNT, AUTOSCALER_MAX: WORKER_MACHINE_MAX_COUNT},
                            worker_replicas=None)


# -- the static-ip flavor: addresses from a Cluster API IPAM pool --------------------------------------------------------

IPAM_GROUP = "ipam.cluster.x-k8s.io"
IN_CLUSTER_POOL = f"{IPAM_GROUP}/v1alpha2"  # the in-cluster IPAM provider's InClusterIPPool
IP_POOL_NAME = f"{CLUSTER_NAME}-ips"
IP_POOL_ADDRESSES = "${LIBVIRT_IP_POOL_START}-${LIBVIRT_IP_POOL_END}"
IP_POOL_PREFIX = "${LIBVIRT_IP_POOL_PREFIX:=24}"
IP_POOL_GATEWAY = "${LIBVIRT_IP_POOL_GATEWAY}"


def static_ip_template() -> list[dict[str, Any]]:
    """The default flavor whose machines take their address from an InClusterIPPool (the in-cluster IPAM provider's
    kind; `clusterctl init --ipam in-cluster` installs it) instead of DHCP: the pool (a range, a prefix, a gateway)
    and machine templates whose interface lists it in addressesFromPools."""
    objects = cluster_template()
    pool_ref = {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": IP_POOL_NAME}
    for template in (o for o in objects if o["kind"] == "LibvirtMachineTemplate"):
        for interface in template["spec"]["template"]["spec"]["interfaces"]:
            interface["addressesFromPools"] = [pool_ref]
    pool = _object(IN_CLUSTER_POOL, "InClusterIPPool", IP_POOL_NAME, {
        "addresses": [IP_POOL_ADDRESSES], "prefix": IP_POOL_PREFIX, "gateway": IP_POOL_GATEWAY})
    return [*objects, pool]


# -- the ClusterClass flavor -----------------------------------------------------------------------------------------

def _variable(name: str, schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"name": name, "required": required, "schema": {"openAPIV3Schema": schema}}


def _patch(name: str, api_version: str, kind: str, match: dict[str, Any], path: str, variable: str) -> dict[str, Any]:
    return {"name": name, "definitions": [{
        "selector": {"apiVersion": api_version, "kind": kind, "matchResources": match},
        "jsonPatches": [{"op": "add", "path": path, "valueFrom": {"variable": variable}}],
    }]}


def cluster_class() -> list[dict[str, Any]]:
    """A ClusterClass of a kubeadm control plane and a `default-worker` MachineDeployment class on libvirt, its
    templates, and three variables: the control-plane endpoint, the base image volume and the workers' memory (patched
    in; changing a Cluster's `workerMemoryMiB` rolls its workers to a new template)."""
    name = CLUSTER_CLASS
    control_plane, worker = f"{name}-control-plane", f"{name}-default-worker"
    machine = {"controlPlane": True}
    workers = {"machineDeploymentClass": {"names": ["default-worker"]}}
    image_path = "/spec/template/spec/image/volume"
    return [
        _object(CAPI, "ClusterClass", name, {
            "controlPlane": {
                "templateRef": _template_ref(CONTROLPLANE, "KubeadmControlPlaneTemplate", control_plane),
                "machineInfrastructure": {
                    "templateRef": _template_ref(meta.API_VERSION, "LibvirtMachineTemplate", control_plane)},
            },
            "infrastructure": {"templateRef": _template_ref(meta.API_VERSION, "LibvirtClusterTemplate", name)},
            "workers": {"machineDeployments": [{
                "class": "default-worker",
                "bootstrap": {"templateRef": _template_ref(BOOTSTRAP, "KubeadmConfigTemplate", worker)},
                "infrastructure": {"templateRef": _template_ref(meta.API_VERSION, "LibvirtMachineTemplate", worker)},
            }]},
            "variables": [
                _variable("controlPlaneEndpoint", {
                    "type": "object", "required": ["host"],
                    "properties": {"host": {"type": "string", "minLength": 1},
                                   "port": {"type": "integer", "default": 6443, "minimum": 1, "maximum": 65535}},
                }),
                _variable("baseImage", {"type": "string", "minLength": 1, "maxLength": 255,
                                        "description": "The libvirt volume the machines' disks are overlays of."}),
                _variable(WORKER_MEMORY_VARIABLE, {"type": "integer", "minimum": 256,
                                                   "description": "Each worker machine's memory in MiB."}),
            ],
            "patches": [
                _patch("controlPlaneEndpoint", meta.API_VERSION, "LibvirtClusterTemplate",
                       {"infrastructureCluster": True}, "/spec/template/spec/controlPlaneEndpoint",
                       "controlPlaneEndpoint"),
                _patch("controlPlaneImage", meta.API_VERSION, "LibvirtMachineTemplate", machine, image_path,
                       "baseImage"),
                _patch("workerImage", meta.API_VERSION, "LibvirtMachineTemplate", workers, image_path, "baseImage"),
                _patch("workerMemory", meta.API_VERSION, "LibvirtMachineTemplate", workers,
                       "/spec/template/spec/memoryMiB", WORKER_MEMORY_VARIABLE),
            ],
        }),
        # The endpoint and image are patched in from the Cluster's variables; the templates carry placeholders
        # the schemas accept.
        _object(meta.API_VERSION, "LibvirtClusterTemplate", name, {"template": {"spec": {}}}),
        _object(CONTROLPLANE, "KubeadmControlPlaneTemplate", control_plane, {
            "template": {"spec": {"kubeadmConfigSpec": _kubeadm_config_spec()}},
        }),
        _class_machine_template(control_plane, CONTROL_PLANE_CPUS, CONTROL_PLANE_MEMORY_MIB, control_plane=True),
        _worker_bootstrap_template(worker),
        _class_machine_template(worker, WORKER_CPUS, WORKER_MEMORY_MIB),
    ]


def _class_machine_template(name: str, cpus: str, memory_mib: str, control_plane: bool = False) -> dict[str, Any]:
    spec = machine_spec(cpus, memory_mib, control_plane)
    spec["image"] = {"volume": "set-by-the-baseImage-variable"}
    return _object(meta.API_VERSION, "LibvirtMachineTemplate", name, {"template": {"spec": spec}})


def clusterclass_template() -> list[dict[str, Any]]:
    """The ClusterClass flavor: a Cluster whose topology uses the class, its pod network and the Secrets binding. The
    class is a release file of its own (CLUSTER_CLASSES), which `clusterctl generate cluster --flavor clusterclass`
    adds to the output from the provider's repository when the management cluster does not have it yet."""
    cluster = _object(CAPI, "Cluster", CLUSTER_NAME, {
        "clusterNetwork": _cluster_network(),
        "topology": {
            "classRef": {"name": CLUSTER_CLASS},
            "version": KUBERNETES_VERSION,
            "controlPlane": {"replicas": CONTROL_PLANE_MACHINE_COUNT},
            "workers": {"machineDeployments": [
                {"class": "default-worker", "name": "md-0", "replicas": WORKER_MACHINE_COUNT},
            ]},
            "variables": [
                {"name": "controlPlaneEndpoint", "value": _endpoint()},
                {"name": "baseImage", "value": LIBVIRT_BASE_IMAGE},
                {"name": WORKER_MEMORY_VARIABLE, "value": WORKER_MEMORY_MIB},
            ],
        },
    }, labels=POD_NETWORK_LABELS)
    return [cluster, *pod_network_objects(), secrets_binding()]


# Flavor name ("" is the default) -> the objects of `cluster-template[-<flavor>].yaml`.
FLAVORS = {
    "": cluster_template,
    "clusterclass": clusterclass_template,
    "autoscaler": autoscaler_template,
    "static-ip": static_ip_template,
}


def file_name(flavor: str) -> str:
    return f"cluster-template-{flavor}.yaml" if flavor else "cluster-template.yaml"


# ClusterClass name -> the objects of `clusterclass-<name>.yaml`, the file clusterctl looks for in the provider's
# repository when a template's Cluster names a class the management cluster does not have.
CLUSTER_CLASSES = {CLUSTER_CLASS: cluster_class}


def cluster_class_file_name(name: str) -> str:
    return f"clusterclass-{name}.yaml"
