"""The clusterctl release artifacts, read by the real clusterctl (a local repository, no network) and applied
(server-side, dry-run) to a real API server with Cluster API's and the kubeadm providers' CRDs.

What is proved: clusterctl accepts metadata.yaml and infrastructure-components.yaml (`generate provider`), the
cluster template's variables are the documented ones (`generate cluster --list-variables`), and every object
clusterctl makes of them is valid against the CRDs it will meet (types, required fields, v1beta2 references).
"""

from __future__ import annotations

import collections
import json
import pathlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from capi_libvirt.api import meta, release, templates
from clusterctl_cli import REPO, VERSION, clusterctl, generate_cluster, source_arguments
from devenv import control_plane as cp
from devenv import ipam_stand_in, paths

from prereq import require

pytestmark = pytest.mark.integration

CAPI_MODULE = paths.cache_dir() / f"cluster-api-{paths.CLUSTER_API_VERSION}"
KUBEADM_CRD_DIRS = [CAPI_MODULE / "bootstrap" / "kubeadm" / "config" / "crd" / "bases",
                    CAPI_MODULE / "controlplane" / "kubeadm" / "config" / "crd" / "bases"]

TEMPLATE_VARIABLES = {
    "KUBERNETES_VERSION": "v1.34.1",
    "CONTROL_PLANE_MACHINE_COUNT": "3",
    "WORKER_MACHINE_COUNT": "2",
    "CONTROL_PLANE_ENDPOINT_HOST": "192.0.2.10",
    "LIBVIRT_BASE_IMAGE": "ubuntu-24.04.qcow2",
    # The static-ip flavor's pool (the other flavors have no such variables; clusterctl ignores them there).
    "LIBVIRT_IP_POOL_START": "192.0.2.100",
    "LIBVIRT_IP_POOL_END": "192.0.2.150",
    "LIBVIRT_IP_POOL_GATEWAY": "192.0.2.1",
}
PROVIDER_LABEL = {"cluster.x-k8s.io/provider": "infrastructure-libvirt"}


# -- server-side apply, dry-run ------------------------------------------------------------------------------------

def _resources(plane: cp.LocalControlPlane, api_version: str) -> dict[str, dict]:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    listing = plane.request("GET", prefix)
    return {r["kind"]: {**r, "prefix": prefix} for r in listing["resources"] if "/" not in r["name"]}


def object_path(plane: cp.LocalControlPlane, document: dict, cache: dict) -> str:
    if document["apiVersion"] not in cache:
        cache[document["apiVersion"]] = _resources(plane, document["apiVersion"])
    resource = cache[document["apiVersion"]][document["kind"]]
    namespace = document["metadata"].get("namespace")
    if resource["namespaced"]:
        assert namespace, f"{document['kind']} {document['metadata']['name']} has no namespace"
        return f"{resource['prefix']}/namespaces/{namespace}/{resource['name']}/{document['metadata']['name']}"
    return f"{resource['prefix']}/{resource['name']}/{document['metadata']['name']}"


def apply(plane: cp.LocalControlPlane, document: dict, cache: dict, dry_run: bool = True) -> dict:
    """Server-side apply (dry-run unless told): the API server validates against the CRD's schema and CEL rules."""
    query = "fieldManager=capi-libvirt-test" + ("&dryRun=All" if dry_run else "")
    return plane.request("PATCH", f"{object_path(plane, document, cache)}?{query}", document,
                         content_type="application/apply-patch+yaml")


@pytest.fixture
def target_namespace(plain_namespace: str) -> str:
    return plain_namespace


@pytest.fixture(scope="module")
def kubeadm_crds(control_plane: cp.LocalControlPlane) -> None:
    """The kubeadm bootstrap and control-plane CRDs (the test API server has only Cluster API's core ones)."""
    for directory in KUBEADM_CRD_DIRS:
        require(directory.is_dir(), f"kubeadm CRDs {directory} (make upstream)")
    control_plane.install_crds(sorted(f for d in KUBEADM_CRD_DIRS for f in d.glob("*.yaml")))
    # The static-ip flavor's InClusterIPPool: the in-cluster IPAM provider's kind, served here by the test bed's
    # stand-in CRD of the same shape (devenv/ipam_stand_in.py: the provider itself cannot be fetched here).
    control_plane.install_crd_documents([ipam_stand_in.POOL_CRD])


# -- the provider's components ---------------------------------------------------------------------------------------

def _manager_image(documents: list[dict]) -> str:
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    [manager] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
    return manager["image"]


def test_generate_provider_reads_the_release(repository: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """clusterctl reads metadata.yaml (validated: apiVersion, kind, a release series with a contract it speaks) and
    the components, as `clusterctl init` does; the image is this release's unless the user moves it with the
    CAPI_LIBVIRT_IMAGE variable or clusterctl's own image override."""
    def generate(**kwargs: Any) -> list[dict]:
        out = clusterctl(tmp_path, repository, "generate", "provider", "--infrastructure", f"libvirt:{VERSION}",
                         **kwargs).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    documents = generate()
    [namespace] = [d["metadata"]["name"] for d in documents if d["kind"] == "Namespace"]
    assert namespace == "capi-libvirt-system"
    assert _manager_image(documents) == f"{release.IMAGE_REPOSITORY}:{VERSION}"
    assert _manager_image(generate(env={"CAPI_LIBVIRT_IMAGE": "registry.example.org/libvirt:dev"})) == \
        "registry.example.org/libvirt:dev"
    mirrored = generate(config={"images": {"infrastructure-libvirt": {"repository": "registry.example.org/m"}}})
    assert _manager_image(mirrored) == f"registry.example.org/m/capi-libvirt:{VERSION}"

    # The other settings: replicas (they elect a leader) and the log format.
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 1
    assert "--logging-format=json" in _manager_container(deployment)["args"]
    [deployment] = [d for d in generate(env={"CAPI_LIBVIRT_REPLICAS": "2", "CAPI_LIBVIRT_LOG_FORMAT": "plain"})
                    if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert "--logging-format=plain" in _manager_container(deployment)["args"]


def test_config_default_is_what_kustomize_builds(repository: pathlib.Path) -> None:
    """config/ are kustomize bases: the real kustomize builds config/default into the same objects the release has
    (but the manager's image, which the release sets to its clusterctl variable)."""
    require(paths.kustomize_binary().exists(), f"kustomize {paths.kustomize_binary()} (make upstream)")
    built = subprocess.run([str(paths.kustomize_binary()), "build", str(REPO / "config" / "default")],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built) if d}
    released = [d for d in yaml.safe_load_all((repository / release.COMPONENTS).read_text()) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in released} == set(by_key)
    assert _manager_image(released) == f"${{CAPI_LIBVIRT_IMAGE:={release.IMAGE_REPOSITORY}:{VERSION}}}"
    for document in released:
        expected = by_key[(document["kind"], document["metadata"]["name"])]
        if document["kind"] == "Deployment":
            _manager_container(expected)["image"] = _manager_image(released)
        assert document == expected, f"{document['kind']} {document['metadata']['name']} differs from kustomize's"


def _manager_container(deployment: dict) -> dict:
    [manager] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
    return manager


def test_components_apply_to_the_api_server(repository: pathlib.Path, tmp_path: pathlib.Path,
                                            control_plane: cp.LocalControlPlane) -> None:
    """`generate provider --target-namespace` output: one Namespace, every object labelled, the CRDs byte-for-byte
    what config/crd has (the `$` of their patterns survive variable substitution), everything moved to the target
    namespace, and each object accepted by the API server (dry-run apply)."""
    namespace = f"capi-libvirt-{uuid.uuid4().hex[:8]}"
    out = clusterctl(tmp_path, repository, "generate", "provider", "--infrastructure", f"libvirt:{VERSION}",
                     "--target-namespace", namespace).stdout
    documents = [d for d in yaml.safe_load_all(out) if d]
    kinds = collections.Counter(d["kind"] for d in documents)
    assert kinds["Namespace"] == 1
    assert kinds["CustomResourceDefinition"] == len(list((REPO / "config" / "crd").glob(f"{meta.GROUP}_*.yaml")))
    assert kinds["Role"] == 1  # leader election: a Lease in the provider's namespace (no third-party CRD)
    assert kinds["Deployment"] == 1
    for document in documents:
        labels = document["metadata"].get("labels", {})
        assert PROVIDER_LABEL.items() <= labels.items(), f"{document['kind']} {document['metadata']['name']}"

    for document in documents:
        if document["kind"] == "CustomResourceDefinition":
            assert document["spec"]["group"] == meta.GROUP
            committed = yaml.safe_load((REPO / "config" / "crd" / f"{document['spec']['group']}_"
                                        f"{document['spec']['names']['plural']}.yaml").read_text())
            assert document["spec"] == committed["spec"]
            # What clusterctl move lists (and, on hosts, copies).
            assert committed["metadata"]["labels"].items() <= document["metadata"]["labels"].items()
            assert document["metadata"]["labels"]["clusterctl.cluster.x-k8s.io"] == ""
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == namespace
    [manager] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
    assert manager["image"] == f"{release.IMAGE_REPOSITORY}:{VERSION}"  # the variable's default
    assert "--namespace" in subprocess.run(  # the contract: the manager accepts --namespace
        [sys.executable, "-m", "capi_libvirt.cli", *manager["args"], "--help"],
        capture_output=True, text=True, timeout=60).stdout
    binding = next(d for d in documents if d["kind"] == "ClusterRoleBinding")
    assert {s["namespace"] for s in binding["subjects"]} == {namespace}
    # Secrets only through RoleBindings: the one of the host credentials sits in the provider's namespace, as does
    # the leader election Role's.
    role_bindings = {d["roleRef"]["name"]: d for d in documents if d["kind"] == "RoleBinding"}
    assert set(role_bindings) == {"capi-libvirt-secrets", "capi-libvirt-leader-election"}
    for role_binding in role_bindings.values():
        assert role_binding["metadata"]["namespace"] == namespace
        assert {s["namespace"] for s in role_binding["subjects"]} == {namespace}

    cache: dict[str, Any] = {}
    [namespace_object] = [d for d in documents if d["kind"] == "Namespace"]
    apply(control_plane, namespace_object, cache, dry_run=False)  # what the namespaced objects' dry-runs need
    try:
        for document in documents:
            if document["kind"] != "Namespace":
                applied = apply(control_plane, document, cache)
                assert applied["metadata"]["name"] == document["metadata"]["name"]
    finally:
        control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}")


# -- the cluster template ----------------------------------------------------------------------------------------------

# Variables every flavor shares, with their defaults as `--list-variables` prints them.
COMMON_OPTIONAL = {
    "CLUSTER_NAME": "demo",  # the command's argument
    "NAMESPACE": "demo",  # --target-namespace
    "CONTROL_PLANE_MACHINE_COUNT": "1",  # clusterctl's own defaults
    "CONTROL_PLANE_ENDPOINT_PORT": '"6443"',  # the templates'
    "LIBVIRT_STORAGE_POOL": '"default"',
    "LIBVIRT_NETWORK": '"default"',
    "LIBVIRT_CONTROL_PLANE_CPUS": '"2"',
    "LIBVIRT_CONTROL_PLANE_MEMORY_MIB": '"4096"',
    "LIBVIRT_WORKER_CPUS": '"2"',
    "LIBVIRT_WORKER_MEMORY_MIB": '"4096"',
    "LIBVIRT_DISK_GIB": '"20"',
    "CAPI_LIBVIRT_NAMESPACE": '"capi-libvirt-system"',  # the provider's, for the RoleBinding that lets it read Secrets
    "KUBE_VIP_IMAGE": '"ghcr.io/kube-vip/kube-vip:v1.0.1"',  # the endpoint's holder on the control-plane machines
    "KUBE_VIP_INTERFACE": '"enp1s0"',
}
# clusterctl 1.12's `--list-variables` lists the flavor file's variables only, not those of the ClusterClass file it
# adds from the repository (it substitutes them all the same: test_generated_cluster_applies_to_the_api_server).
CLASS_FILE_ONLY = {"LIBVIRT_STORAGE_POOL", "LIBVIRT_NETWORK", "LIBVIRT_CONTROL_PLANE_CPUS",
                   "LIBVIRT_CONTROL_PLANE_MEMORY_MIB", "LIBVIRT_WORKER_CPUS", "LIBVIRT_DISK_GIB", "KUBE_VIP_IMAGE",
                   "KUBE_VIP_INTERFACE"}
FLAVOR_OPTIONAL = {
    "": {"WORKER_MACHINE_COUNT": "0"},
    "clusterclass": {"WORKER_MACHINE_COUNT": "0"},
    "autoscaler": {"WORKER_MACHINE_MIN_COUNT": '"0"', "WORKER_MACHINE_MAX_COUNT": '"5"'},
    "static-ip": {"WORKER_MACHINE_COUNT": "0", "LIBVIRT_IP_POOL_PREFIX": '"24"'},
}
REQUIRED = ["CONTROL_PLANE_ENDPOINT_HOST", "KUBERNETES_VERSION", "LIBVIRT_BASE_IMAGE"]
FLAVOR_REQUIRED = {"static-ip": ["LIBVIRT_IP_POOL_END", "LIBVIRT_IP_POOL_GATEWAY", "LIBVIRT_IP_POOL_START"]}
POD_NETWORK_KINDS = {"ConfigMap": 1, "ClusterResourceSet": 1}  # flannel's manifest and what applies it
FLAVOR_KINDS = {
    "": {"Cluster": 1, "LibvirtCluster": 1, "KubeadmControlPlane": 1, "LibvirtMachineTemplate": 2,
         "MachineDeployment": 1, "KubeadmConfigTemplate": 1, "RoleBinding": 1, **POD_NETWORK_KINDS},
    "autoscaler": {"Cluster": 1, "LibvirtCluster": 1, "KubeadmControlPlane": 1, "LibvirtMachineTemplate": 2,
                   "MachineDeployment": 1, "KubeadmConfigTemplate": 1, "RoleBinding": 1, **POD_NETWORK_KINDS},
    "static-ip": {"Cluster": 1, "LibvirtCluster": 1, "KubeadmControlPlane": 1, "LibvirtMachineTemplate": 2,
                  "MachineDeployment": 1, "KubeadmConfigTemplate": 1, "RoleBinding": 1, "InClusterIPPool": 1,
                  **POD_NETWORK_KINDS},
    "clusterclass": {"ClusterClass": 1, "LibvirtClusterTemplate": 1, "KubeadmControlPlaneTemplate": 1,
                     "LibvirtMachineTemplate": 2, "KubeadmConfigTemplate": 1, "Cluster": 1, "RoleBinding": 1,
                     **POD_NETWORK_KINDS},
}


def test_every_flavor_is_released() -> None:
    assert set(FLAVOR_KINDS) == set(FLAVOR_OPTIONAL) == set(templates.FLAVORS)


@pytest.mark.parametrize("flavor", sorted(templates.FLAVORS))
def test_cluster_template_variables(flavor: str, repository: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = clusterctl(tmp_path, repository, "generate", "cluster", "demo", *source_arguments(flavor),
                     "--target-namespace", "demo", "--list-variables").stdout
    required = out.split("Required Variables:")[1].split("Optional Variables:")[0].split()
    assert [v for v in required if v != "-"] == sorted(REQUIRED + FLAVOR_REQUIRED.get(flavor, []))
    optional = {line.split()[1]: line.split("(defaults to ")[1].rstrip(")")
                for line in out.split("Optional Variables:")[1].splitlines() if line.strip().startswith("-")}
    common = {k: v for k, v in COMMON_OPTIONAL.items() if flavor != "clusterclass" or k not in CLASS_FILE_ONLY}
    assert optional == {**common, **FLAVOR_OPTIONAL[flavor]}


def _refs(value: Any) -> Iterator[dict]:
    """Every reference ({apiGroup or apiVersion, kind, name}) in an object."""
    if isinstance(value, dict):
        if {"kind", "name"} <= value.keys() and value.keys() & {"apiGroup", "apiVersion"}:
            yield value
        for item in value.values():
            yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


def _generate(flavor: str, repository: pathlib.Path, tmp_path: pathlib.Path, namespace: str) -> list[dict]:
    return generate_cluster(tmp_path, repository, flavor, "demo", namespace, TEMPLATE_VARIABLES)


@pytest.mark.parametrize("flavor", sorted(templates.FLAVORS))
def test_generated_cluster_applies_to_the_api_server(flavor: str, repository: pathlib.Path, tmp_path: pathlib.Path,
                                                     control_plane: cp.LocalControlPlane, kubeadm_crds: None,
                                                     target_namespace: str) -> None:
    """`generate cluster demo --from <flavor>` with every variable from the environment: the expected objects,
    references that resolve among them, numbers that are numbers, the kubelet's providerID left to cloud-init's
    Jinja, and every object accepted by the API server with the kubeadm CRDs (server-side apply, dry-run)."""
    documents = _generate(flavor, repository, tmp_path, target_namespace)
    assert collections.Counter(d["kind"] for d in documents) == FLAVOR_KINDS[flavor]
    assert {d["metadata"]["namespace"] for d in documents} == {target_namespace}
    present = {(d["apiVersion"].split("/")[0], d["kind"], d["metadata"]["name"]) for d in documents}
    for document in documents:
        for ref in _refs(document.get("spec", {})):
            group = ref.get("apiGroup") or ref["apiVersion"].split("/")[0]
            assert (group, ref["kind"], ref["name"]) in present, f"{document['kind']}: {ref} dangles"
    pool_ref = {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "demo-ips"}
    interface = {"network": "default", "addressesFromPools": [pool_ref]} if flavor == "static-ip" else \
        {"network": "default"}
    for template in [d for d in documents if d["kind"] == "LibvirtMachineTemplate"]:
        spec = template["spec"]["template"]["spec"]
        # The control plane's interface may also send from the endpoint kube-vip holds (the anti-spoofing filter).
        endpoint = TEMPLATE_VARIABLES["CONTROL_PLANE_ENDPOINT_HOST"]
        of_control_plane = template["metadata"]["name"].endswith("control-plane")
        wanted = interface | ({"allowedAddresses": [endpoint]} if of_control_plane else {})
        assert spec["storagePool"] == "default" and spec["interfaces"] == [wanted], template["metadata"]["name"]
        assert (spec["cpus"], spec["memoryMiB"], spec["diskGiB"]) == (2, 4096, 20)
    registrations = [r for d in documents for r in _node_registrations(d)]
    assert len(registrations) == 3  # control plane init and join, workers join
    for registration in registrations:
        assert {"name": "provider-id", "value": "{{ ds.meta_data.provider_id }}"} in registration["kubeletExtraArgs"]
        assert registration["name"] == "{{ ds.meta_data.local_hostname }}"

    cache: dict[str, Any] = {}
    for document in documents:
        applied = apply(control_plane, document, cache)
        assert (applied["kind"], applied["metadata"]["name"]) == (document["kind"], document["metadata"]["name"])


def _node_registrations(document: dict) -> list[dict]:
    spec = document.get("spec", {})
    config = {"KubeadmControlPlane": lambda: spec["kubeadmConfigSpec"],
              "KubeadmControlPlaneTemplate": lambda: spec["template"]["spec"]["kubeadmConfigSpec"],
              "KubeadmConfigTemplate": lambda: spec["template"]["spec"]}.get(document["kind"])
    if config is None:
        return []
    return [c["nodeRegistration"] for key, c in config().items() if key in ("initConfiguration", "joinConfiguration")]


def test_default_flavor_values(repository: pathlib.Path, tmp_path: pathlib.Path, control_plane: cp.LocalControlPlane,
                               kubeadm_crds: None, target_namespace: str) -> None:
    """The default flavor's numbers and endpoint; and the dry-run does validate: a reference without its v1beta2
    apiGroup is refused (422, a required field), and so is a field the schema does not declare."""
    by_kind = {d["kind"]: d for d in _generate("", repository, tmp_path, target_namespace)
               if d["kind"] != "LibvirtMachineTemplate"}
    assert by_kind["Cluster"]["metadata"]["name"] == "demo"
    assert by_kind["KubeadmControlPlane"]["spec"]["replicas"] == 3
    assert by_kind["KubeadmControlPlane"]["spec"]["version"] == "v1.34.1"
    assert by_kind["KubeadmControlPlane"]["spec"]["kubeadmConfigSpec"]["format"] == "cloud-config"
    assert by_kind["MachineDeployment"]["spec"]["replicas"] == 2
    assert by_kind["LibvirtCluster"]["spec"]["controlPlaneEndpoint"] == {"host": "192.0.2.10", "port": 6443}

    cache: dict[str, Any] = {}
    broken = json.loads(json.dumps(by_kind["KubeadmControlPlane"]))
    ref = broken["spec"]["machineTemplate"]["spec"]["infrastructureRef"]
    group = ref.pop("apiGroup")
    with pytest.raises(cp.ControlPlaneError) as refused:
        apply(control_plane, broken, cache)
    assert refused.value.status == 422 and "apiGroup" in str(refused.value)
    ref["apiVersion"] = f"{group}/{meta.VERSION}"
    with pytest.raises(cp.ControlPlaneError) as refused:
        apply(control_plane, broken, cache)
    assert "apiVersion: field not declared in schema" in str(refused.value)


def test_autoscaler_flavor_leaves_replicas_to_the_autoscaler(repository: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The worker MachineDeployment carries the node-group bounds and no replicas, and no capacity annotations:
    the autoscaler sizes it at zero from LibvirtMachineTemplate.status.capacity."""
    documents = _generate("autoscaler", repository, tmp_path, "demo")
    [deployment] = [d for d in documents if d["kind"] == "MachineDeployment"]
    assert "replicas" not in deployment["spec"]
    assert deployment["metadata"]["annotations"] == {
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5",
    }


def test_static_ip_flavor_makes_a_pool_the_machines_take_addresses_from(repository: pathlib.Path,
                                                                         tmp_path: pathlib.Path) -> None:
    """The InClusterIPPool from the variables (a range, the prefix a number, the gateway), named after the cluster."""
    documents = _generate("static-ip", repository, tmp_path, "demo")
    [pool] = [d for d in documents if d["kind"] == "InClusterIPPool"]
    assert pool["apiVersion"] == "ipam.cluster.x-k8s.io/v1alpha2" and pool["metadata"]["name"] == "demo-ips"
    assert pool["spec"] == {"addresses": ["192.0.2.100-192.0.2.150"], "prefix": 24, "gateway": "192.0.2.1"}


def test_clusterclass_flavor_patches_variables_in(repository: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The Cluster's topology names the class (which clusterctl added from its own file in the repository) and gives
    the endpoint, image and worker-memory variables; each variable the class declares has a patch that writes it into
    a template."""
    documents = _generate("clusterclass", repository, tmp_path, "demo")
    [cluster] = [d for d in documents if d["kind"] == "Cluster"]
    [cluster_class] = [d for d in documents if d["kind"] == "ClusterClass"]
    topology = cluster["spec"]["topology"]
    assert topology["classRef"] == {"name": cluster_class["metadata"]["name"]}
    assert {v["name"]: v["value"] for v in topology["variables"]} == {
        "controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}, "baseImage": "ubuntu-24.04.qcow2",
        "workerMemoryMiB": 4096}
    assert topology["workers"]["machineDeployments"][0]["replicas"] == 2
    declared = {v["name"] for v in cluster_class["spec"]["variables"]}
    patched = {j["valueFrom"]["variable"] for p in cluster_class["spec"]["patches"] for d in p["definitions"]
               for j in d["jsonPatches"]}
    assert declared == patched == {"controlPlaneEndpoint", "baseImage", "workerMemoryMiB"}


# -- with Cluster API's own webhooks and controllers (last in this module: they stay on once started) ----------------

def _create(plane: cp.LocalControlPlane, document: dict, cache: dict) -> None:
    plane.request("POST", object_path(plane, document, cache).rsplit("/", 1)[0], document)


def test_clusterclass_flavor_passes_cluster_apis_webhooks_and_controller(
        repository: pathlib.Path, tmp_path: pathlib.Path, control_plane: cp.LocalControlPlane, kubeadm_crds: None,
        capi_controller, target_namespace: str) -> None:
    """Beyond the schemas: the ClusterClass and its templates, created for real, are accepted by Cluster API's
    webhooks and reconciled by its ClusterClass controller (it resolves every template and its variables become
    ready), and the topology Cluster is accepted with Cluster API's webhooks on (dry-run)."""
    documents = _generate("clusterclass", repository, tmp_path, target_namespace)
    cache: dict[str, Any] = {}
    created = [d for d in documents if d["kind"] != "Cluster"]
    for document in created:
        _create(control_plane, document, cache)
    [cluster_class] = [d for d in documents if d["kind"] == "ClusterClass"]
    path = object_path(control_plane, cluster_class, cache)
    try:
        deadline = time.monotonic() + 60
        while True:
            status = control_plane.request("GET", path).get("status", {})
            ready = {c["type"]: c for c in status.get("conditions", [])}.get("VariablesReady")
            if ready and ready["status"] == "True" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert ready and ready["status"] == "True", status
        assert {v["name"] for v in status["variables"]} == {"controlPlaneEndpoint", "baseImage", "workerMemoryMiB"}

        [cluster] = [d for d in documents if d["kind"] == "Cluster"]
        applied = apply(control_plane, cluster, cache)
        assert applied["spec"]["topology"]["classRef"]["name"] == cluster_class["metadata"]["name"]

    finally:
        for document in reversed(created):
            control_plane.request("DELETE", object_path(control_plane, document, cache))
