"""The real Cluster API core controller (its manager, webhooks on) against the test API server, with no VMs.

What is proved: a Cluster and a MachineDeployment referring to our LibvirtCluster and LibvirtMachineTemplate lead
Cluster API's controllers to a MachineSet, Machines and LibvirtMachines cloned from the template and owned by the
Machines; the v1beta1 API that cluster-autoscaler speaks converts to and from the v1beta2 storage version (its scale
subresource included); scaling to zero deletes the Machines and their LibvirtMachines; and stopping the manager leaves
the API server's webhook configurations and CRDs as they were.
"""

from __future__ import annotations

import base64
import os
from typing import TypeVar

import pytest

from capi_libvirt.api import meta
from devenv import capi_controller as capi
from devenv import control_plane as cp
from devenv import paths
from installed_provider import gone, items

from prereq import require
from waiting import wait_for

pytestmark = pytest.mark.integration

T = TypeVar("T")
CAPI = f"/apis/{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"
CAPI_V1BETA1 = f"/apis/{meta.CAPI_GROUP}/v1beta1"
INFRA = f"/apis/{meta.GROUP}/{meta.VERSION}"
CLUSTER, DEPLOYMENT, TEMPLATE, SECRET = "demo", "demo-workers", "demo-workers", "demo-workers-bootstrap"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
TEMPLATE_SPEC = {"image": {"volume": "base.qcow2"}, "cpus": 1, "memoryMiB": 512, "diskGiB": 5}




def delete(plane: cp.LocalControlPlane, path: str) -> None:
    try:
        plane.request("DELETE", path)
    except cp.ControlPlaneError as error:
        if error.status != 404:
            raise



@pytest.fixture
def capi_namespace(plain_namespace: str) -> str:
    return plain_namespace


# -- what start() and stop() do to the API server ------------------------------------------------------------------

def webhook_state(plane: cp.LocalControlPlane) -> dict:
    """The CAPI CRDs' conversion and CRD-migrator annotation, and which CAPI webhook configurations exist."""
    crds = {name: plane.request("GET", f"{capi.CRDS}/{name}") for name in capi.conversion_crd_names(capi.CORE.config_dir)}
    return {
        "conversion": {name: crd["spec"]["conversion"] for name, crd in crds.items()},
        "annotation": {name: crd["metadata"].get("annotations", {}).get(capi.MIGRATION_ANNOTATION)
                       for name, crd in crds.items()},
        "webhooks": sorted(item["metadata"]["name"] for collection in capi.WEBHOOK_COLLECTIONS.values()
                           for item in items(plane, collection)
                           if item["metadata"]["name"].startswith(capi.NAME_PREFIX)),
    }


def test_stop_leaves_the_api_server_as_it_was(control_plane: cp.LocalControlPlane) -> None:
    """Runs its own manager, before the module's `capi_controller` starts (only one may run at a time)."""
    require(paths.cluster_api_manager_binary().exists(),
            f"Cluster API manager binary {paths.cluster_api_manager_binary()} (make upstream)")
    before = webhook_state(control_plane)
    assert before["webhooks"] == []
    with capi.CapiController(control_plane) as controller:
        during = webhook_state(control_plane)
        assert during["webhooks"] == ["capi-mutating-webhook-configuration", "capi-validating-webhook-configuration"]
        for name, conversion in during["conversion"].items():
            assert conversion["strategy"] == "Webhook", name
            assert conversion["webhook"]["clientConfig"]["url"] == f"{controller.base_url}/convert"
        pid = controller.pid
    assert webhook_state(control_plane) == before
    assert controller.pid is None and pid is not None
    with pytest.raises(ProcessLookupError):  # ended and reaped
        os.kill(pid, 0)


# -- a MachineDeployment reconciled by the real controllers --------------------------------------------------------

def create_objects(plane: cp.LocalControlPlane, namespace: str) -> None:
    """Bootstrap Secret, LibvirtCluster, LibvirtMachineTemplate, Cluster, MachineDeployment (2 replicas)."""
    plane.request("POST", f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
        "metadata": {"name": SECRET, "labels": {meta.CLUSTER_NAME_LABEL: CLUSTER}},
        "data": {"value": base64.b64encode(b"#cloud-config\n").decode(),
                 "format": base64.b64encode(b"cloud-config").decode()},
    })
    plane.request("POST", f"{INFRA}/namespaces/{namespace}/libvirtclusters", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtCluster", "metadata": {"name": CLUSTER}, "spec": {}})
    plane.request("POST", f"{INFRA}/namespaces/{namespace}/libvirtmachinetemplates", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": {"name": TEMPLATE},
        "spec": {"template": {"spec": TEMPLATE_SPEC}}})
    plane.request("POST", f"{CAPI}/namespaces/{namespace}/clusters", {
        "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Cluster", "metadata": {"name": CLUSTER},
        "spec": {"infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtCluster", "name": CLUSTER}}})
    plane.request("POST", f"{CAPI}/namespaces/{namespace}/machinedeployments", machine_deployment())


def machine_deployment() -> dict:
    labels = {DEPLOYMENT_LABEL: DEPLOYMENT}
    return {
        "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}",
        "kind": "MachineDeployment",
        "metadata": {"name": DEPLOYMENT},
        "spec": {
            "clusterName": CLUSTER,
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "clusterName": CLUSTER,
                    "bootstrap": {"dataSecretName": SECRET},
                    "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachineTemplate", "name": TEMPLATE},
                },
            },
        },
    }


def delete_objects(plane: cp.LocalControlPlane, namespace: str) -> None:
    """The Cluster (its controller deletes the MachineDeployment, MachineSets, Machines and the LibvirtCluster, this
    API server has no garbage collector), then what nothing owns."""
    delete(plane, f"{CAPI}/namespaces/{namespace}/clusters/{CLUSTER}")
    wait_for("the Cluster to be deleted", lambda: gone(plane, f"{CAPI}/namespaces/{namespace}/clusters/{CLUSTER}"),
             timeout=120)
    for kind in ("machinedeployments", "machinesets", "machines"):
        assert items(plane, f"{CAPI}/namespaces/{namespace}/{kind}") == [], kind
    assert items(plane, f"{INFRA}/namespaces/{namespace}/libvirtclusters") == []
    delete(plane, f"{INFRA}/namespaces/{namespace}/libvirtmachinetemplates/{TEMPLATE}")
    delete(plane, f"/api/v1/namespaces/{namespace}/secrets/{SECRET}")


def test_machine_deployment_is_reconciled(capi_controller: capi.CapiController, control_plane: cp.LocalControlPlane,
                                          capi_namespace: str) -> None:
    ns = capi_namespace
    try:
        create_objects(control_plane, ns)
        machines = wait_for("2 Machines", lambda: len(m := machines_of(control_plane, ns)) == 2 and m)
        check_machine_set(control_plane, ns, replicas=2, machines=machines)
        check_libvirt_machines(control_plane, ns, machines)
        check_v1beta1_reads(control_plane, ns)

        scale_through_v1beta1(control_plane, ns, replicas=0)
        wait_for("the Machines to be deleted", lambda: machines_of(control_plane, ns) == [])
        wait_for("the LibvirtMachines to be deleted",
                 lambda: items(control_plane, f"{INFRA}/namespaces/{ns}/libvirtmachines") == [])
        check_machine_set(control_plane, ns, replicas=0, machines=[])
    finally:
        delete_objects(control_plane, ns)


def machines_of(plane: cp.LocalControlPlane, namespace: str) -> list[dict]:
    return items(plane, f"{CAPI}/namespaces/{namespace}/machines?labelSelector={DEPLOYMENT_LABEL}%3D{DEPLOYMENT}")


def controller_owner(document: dict) -> dict:
    [owner] = [ref for ref in document["metadata"].get("ownerReferences", []) if ref.get("controller")]
    return owner


def check_machine_set(plane: cp.LocalControlPlane, namespace: str, replicas: int, machines: list[dict]) -> None:
    """One MachineSet, controlled by the MachineDeployment, controlling the Machines."""
    deployment = plane.request("GET", f"{CAPI}/namespaces/{namespace}/machinedeployments/{DEPLOYMENT}")
    [machine_set] = items(plane, f"{CAPI}/namespaces/{namespace}/machinesets")
    assert controller_owner(machine_set)["uid"] == deployment["metadata"]["uid"]
    assert machine_set["spec"]["replicas"] == replicas
    for machine in machines:
        assert controller_owner(machine)["uid"] == machine_set["metadata"]["uid"]
        assert machine["spec"]["bootstrap"] == {"dataSecretName": SECRET}
        assert machine["spec"]["infrastructureRef"]["apiGroup"] == meta.GROUP
        assert machine["spec"]["infrastructureRef"]["kind"] == "LibvirtMachine"


def check_libvirt_machines(plane: cp.LocalControlPlane, namespace: str, machines: list[dict]) -> None:
    """Each Machine's LibvirtMachine: cloned from the template, controlled by the Machine (the Machine controller
    sets that owner reference, so wait for it)."""
    uids = {m["spec"]["infrastructureRef"]["name"]: m["metadata"]["uid"] for m in machines}

    def owned() -> list[dict] | None:
        found = items(plane, f"{INFRA}/namespaces/{namespace}/libvirtmachines")
        owners = {lm["metadata"]["name"]: [r["uid"] for r in lm["metadata"].get("ownerReferences", [])
                                           if r["kind"] == "Machine" and r.get("controller")] for lm in found}
        return found if owners == {name: [uid] for name, uid in uids.items()} else None

    for libvirt_machine in wait_for("2 LibvirtMachines controlled by their Machines", owned):
        assert libvirt_machine["spec"] == {**libvirt_machine["spec"], **TEMPLATE_SPEC}
        annotations = libvirt_machine["metadata"]["annotations"]
        assert annotations["cluster.x-k8s.io/cloned-from-name"] == TEMPLATE
        assert annotations["cluster.x-k8s.io/cloned-from-groupkind"] == f"LibvirtMachineTemplate.{meta.GROUP}"
        assert libvirt_machine["metadata"]["labels"][meta.CLUSTER_NAME_LABEL] == CLUSTER
        assert libvirt_machine["metadata"].get("finalizers", []) == []  # no operator runs here


def check_v1beta1_reads(plane: cp.LocalControlPlane, namespace: str) -> None:
    """Through v1beta1 the references are v1beta1 ObjectReferences (apiVersion, not apiGroup): the conversion
    webhook converted them (without it the API server would only relabel the v1beta2 object)."""
    deployment = plane.request("GET", f"{CAPI_V1BETA1}/namespaces/{namespace}/machinedeployments/{DEPLOYMENT}")
    assert deployment["apiVersion"] == f"{meta.CAPI_GROUP}/v1beta1"
    assert deployment["spec"]["replicas"] == 2
    ref = deployment["spec"]["template"]["spec"]["infrastructureRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == (meta.API_VERSION, "LibvirtMachineTemplate", TEMPLATE)
    assert "apiGroup" not in ref
    machines = items(plane, f"{CAPI_V1BETA1}/namespaces/{namespace}/machines")
    assert [m["spec"]["infrastructureRef"]["apiVersion"] for m in machines] == [meta.API_VERSION] * 2


def scale_through_v1beta1(plane: cp.LocalControlPlane, namespace: str, replicas: int) -> None:
    """As cluster-autoscaler scales: read and update the scale subresource of the version it discovered (v1beta1),
    again on a conflict (the controllers update the MachineDeployment's status meanwhile)."""
    path = f"{CAPI_V1BETA1}/namespaces/{namespace}/machinedeployments/{DEPLOYMENT}/scale"

    def update() -> bool:
        scale = plane.request("GET", path)
        assert scale["spec"]["replicas"] == 2
        try:
            plane.request("PUT", path, {**scale, "spec": {"replicas": replicas}})
        except cp.ControlPlaneError as error:
            if error.status != 409:
                raise
            return False
        return True

    wait_for("the scale update to go through", update, timeout=30, interval=0.1)
