"""The clusterctl release artifacts: infrastructure-components.yaml, metadata.yaml and cluster-template.yaml.

Laid out as a clusterctl local repository, `<out>/infrastructure-libvirt/<version>/`, so
`providers: [{name: libvirt, type: InfrastructureProvider, url: file://<out>/infrastructure-libvirt/<version>/
infrastructure-components.yaml}]` in clusterctl.yaml serves them. Every document is built as a Python dict and dumped
by pyyaml; clusterctl's variables (`${VAR}`, `${VAR:=default}`) are plain string values in them.
"""

from __future__ import annotations

import pathlib
import re
from typing import Iterable

import yaml

from capi_libvirt.api import meta

PROVIDER_LABEL = "infrastructure-libvirt"  # clusterctl's name for the provider: <type>-<name>
LABELS = {"cluster.x-k8s.io/provider": PROVIDER_LABEL}
IMAGE_REPOSITORY = "ghcr.io/capi-libvirt/capi-libvirt"
CONTRACT = "v1beta2"  # the Cluster API contract the release series implements (v1beta1 fields are kept too)

COMPONENTS = "infrastructure-components.yaml"
METADATA = "metadata.yaml"
CLUSTER_TEMPLATE = "cluster-template.yaml"

# The folders under config/ whose kustomization.yaml lists what goes into the components, in apply order.
CONFIG_FOLDERS = ("crd", "rbac", "manager")

VERSION = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$")

BOOTSTRAP_GROUP = "bootstrap.cluster.x-k8s.io"
CONTROLPLANE_GROUP = "controlplane.cluster.x-k8s.io"

# The kubelet's providerID from the NoCloud meta-data (`provider-id`, which cloud-init's Jinja exposes as
# provider_id); Cluster API's kubeadm bootstrap data starts with `## template: jinja`, so cloud-init renders it.
PROVIDER_ID_FROM_METADATA = "{{ ds.meta_data.provider_id }}"
HOSTNAME_FROM_METADATA = "{{ ds.meta_data.local_hostname }}"

# Pods and services of the workload cluster: outside libvirt's default NAT network (192.168.122.0/24).
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"


class ReleaseError(ValueError):
    """The release cannot be written: a bad version, or config/ is not what it should be."""


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a release version `vMAJOR.MINOR.PATCH[-PRE]`, as clusterctl's local repository wants it."""
    match = VERSION.match(version)
    if not match:
        raise ReleaseError(f"version {version!r} is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE]")
    return int(match.group(1)), int(match.group(2))


def image(version: str) -> str:
    """The manager's image, a literal: `clusterctl generate provider --describe` and `--raw` skip the variables but
    still parse every image, so a `${VAR}` image fails there ("couldn't parse image name"). Users move it with
    clusterctl's own override, `images: {infrastructure-libvirt: {repository: ..., tag: ...}}` in clusterctl.yaml."""
    return f"{IMAGE_REPOSITORY}:{version}"


# -- infrastructure-components.yaml ----------------------------------------------------------------------------------

def _kustomized(folder: pathlib.Path) -> list[dict]:
    """The documents of the files a kustomization.yaml lists, in its order."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    documents = []
    for resource in kustomization.get("resources", []):
        path = folder / resource
        if not path.is_file():
            raise ReleaseError(f"{folder / 'kustomization.yaml'} lists {resource}, which is not a file")
        documents.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return documents


def components(config_dir: pathlib.Path, version: str) -> list[dict]:
    """The provider's objects: CRDs, RBAC, the Namespace and the controller Deployment, each labelled as clusterctl
    wants. The Namespace keeps its name (clusterctl moves everything to `--target-namespace` itself); the manager
    runs this version's image. No variables: the one knob of config/manager, CAPI_LIBVIRT_HOSTS, is for development
    and empty by default, and clusterctl would treat `${VAR:=}` (an empty default) as a required variable."""
    parse_version(version)
    documents = [d for folder in CONFIG_FOLDERS for d in _kustomized(config_dir / folder)]
    namespaces = [d for d in documents if d.get("kind") == "Namespace"]
    if len(namespaces) != 1:
        raise ReleaseError(f"clusterctl wants exactly one Namespace in the components, config/ has {len(namespaces)}")
    managers = [c for d in documents if d.get("kind") == "Deployment"
                for c in d["spec"]["template"]["spec"]["containers"] if c.get("name") == "manager"]
    if len(managers) != 1:
        raise ReleaseError(f"clusterctl wants one controller container named `manager`, config/ has {len(managers)}")
    managers[0]["image"] = image(version)
    for document in documents:
        document.setdefault("metadata", {}).setdefault("labels", {}).update(LABELS)
    # Namespace first, then CRDs, then the rest (as in config/): what clusterctl and kubectl apply expect.
    order = {"Namespace": 0, "CustomResourceDefinition": 1}
    return sorted(documents, key=lambda d: order.get(d["kind"], 2))


# -- metadata.yaml ---------------------------------------------------------------------------------------------------

def metadata(version: str) -> dict:
    """The release series -> contract map clusterctl reads (and validates: apiVersion, kind, non-empty series)."""
    major, minor = parse_version(version)
    return {
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [{"major": major, "minor": minor, "contract": CONTRACT}],
    }


# -- cluster-template.yaml -------------------------------------------------------------------------------------------

# Variables of the default flavor; those with `:=` have defaults, clusterctl requires the others.
CLUSTER_NAME = "${CLUSTER_NAME}"
NAMESPACE = "${NAMESPACE}"
KUBERNETES_VERSION = "${KUBERNETES_VERSION}"
CONTROL_PLANE_MACHINE_COUNT = "${CONTROL_PLANE_MACHINE_COUNT}"
WORKER_MACHINE_COUNT = "${WORKER_MACHINE_COUNT}"
CONTROL_PLANE_ENDPOINT_HOST = "${CONTROL_PLANE_ENDPOINT_HOST}"
CONTROL_PLANE_ENDPOINT_PORT = "${CONTROL_PLANE_ENDPOINT_PORT:=6443}"
LIBVIRT_BASE_IMAGE = "${LIBVIRT_BASE_IMAGE}"
LIBVIRT_STORAGE_POOL = "${LIBVIRT_STORAGE_POOL:=default}"
LIBVIRT_NETWORK = "${LIBVIRT_NETWORK:=default}"


def _ref(group: str, kind: str, name: str) -> dict:
    """A v1beta2 contract reference: apiGroup, kind, name (same namespace)."""
    return {"apiGroup": group, "kind": kind, "name": name}


def _object(api_version: str, kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def _node_registration() -> dict:
    """The kubelet gets its providerID (and the node its name) from the machine's NoCloud meta-data."""
    return {
        "name": HOSTNAME_FROM_METADATA,
        "kubeletExtraArgs": [{"name": "provider-id", "value": PROVIDER_ID_FROM_METADATA}],
    }


def _machine_template(name: str) -> dict:
    return _object(meta.API_VERSION, "LibvirtMachineTemplate", name, {
        "template": {"spec": {
            "image": {"volume": LIBVIRT_BASE_IMAGE},
            "storagePool": LIBVIRT_STORAGE_POOL,
            "cpus": 2,
            "memoryMiB": 4096,
            "diskGiB": 20,
            "interfaces": [{"network": LIBVIRT_NETWORK}],
        }},
    })


def cluster_template() -> list[dict]:
    """The default flavor: a Cluster on a LibvirtCluster, a KubeadmControlPlane of LibvirtMachines and one
    MachineDeployment of workers, all in the Cluster API v1beta2 types."""
    control_plane = f"{CLUSTER_NAME}-control-plane"
    workers = f"{CLUSTER_NAME}-md-0"
    capi = f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"
    return [
        _object(capi, "Cluster", CLUSTER_NAME, {
            "clusterNetwork": {"pods": {"cidrBlocks": [POD_CIDR]}, "services": {"cidrBlocks": [SERVICE_CIDR]}},
            "infrastructureRef": _ref(meta.GROUP, "LibvirtCluster", CLUSTER_NAME),
            "controlPlaneRef": _ref(CONTROLPLANE_GROUP, "KubeadmControlPlane", control_plane),
        }),
        _object(meta.API_VERSION, "LibvirtCluster", CLUSTER_NAME, {
            # The provider supplies the endpoint (Cluster API copies it to the Cluster): an address the user
            # provides, e.g. a load balancer or a virtual IP in front of the control-plane machines.
            "controlPlaneEndpoint": {"host": CONTROL_PLANE_ENDPOINT_HOST, "port": CONTROL_PLANE_ENDPOINT_PORT},
        }),
        _object(f"{CONTROLPLANE_GROUP}/{meta.CAPI_VERSION}", "KubeadmControlPlane", control_plane, {
            "replicas": CONTROL_PLANE_MACHINE_COUNT,
            "version": KUBERNETES_VERSION,
            "machineTemplate": {"spec": {
                "infrastructureRef": _ref(meta.GROUP, "LibvirtMachineTemplate", control_plane),
            }},
            "kubeadmConfigSpec": {
                "format": "cloud-config",
                "initConfiguration": {"nodeRegistration": _node_registration()},
                "joinConfiguration": {"nodeRegistration": _node_registration()},
            },
        }),
        _machine_template(control_plane),
        _object(capi, "MachineDeployment", workers, {
            "clusterName": CLUSTER_NAME,
            "replicas": WORKER_MACHINE_COUNT,
            "selector": {"matchLabels": {}},  # Cluster API's defaulting adds the cluster and deployment labels
            "template": {"spec": {
                "clusterName": CLUSTER_NAME,
                "version": KUBERNETES_VERSION,
                "bootstrap": {"configRef": _ref(BOOTSTRAP_GROUP, "KubeadmConfigTemplate", workers)},
                "infrastructureRef": _ref(meta.GROUP, "LibvirtMachineTemplate", workers),
            }},
        }),
        _object(f"{BOOTSTRAP_GROUP}/{meta.CAPI_VERSION}", "KubeadmConfigTemplate", workers, {
            "template": {"spec": {
                "format": "cloud-config",
                "joinConfiguration": {"nodeRegistration": _node_registration()},
            }},
        }),
        _machine_template(workers),
    ]


# -- writing ---------------------------------------------------------------------------------------------------------

HEADER = "# Generated by `capi-libvirt release-manifests` from config/ and src/capi_libvirt/api; do not edit.\n"


def _dump_all(documents: Iterable[dict]) -> str:
    return HEADER + yaml.safe_dump_all(list(documents), sort_keys=False, width=120, explicit_start=True)


def rendered(config_dir: pathlib.Path, version: str) -> dict[str, str]:
    """File name -> YAML text of the release's files."""
    return {
        COMPONENTS: _dump_all(components(config_dir, version)),
        METADATA: HEADER + yaml.safe_dump(metadata(version), sort_keys=False),
        CLUSTER_TEMPLATE: _dump_all(cluster_template()),
    }


def release_dir(out: pathlib.Path, version: str) -> pathlib.Path:
    """Where clusterctl's local repository layout wants the files: {basepath}/{provider-label}/{version}/."""
    return out / PROVIDER_LABEL / version


def write(out: pathlib.Path, version: str, config_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write the release under `out/infrastructure-libvirt/<version>/`; returns the files written."""
    files = rendered(config_dir, version)
    directory = release_dir(out, version)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written

