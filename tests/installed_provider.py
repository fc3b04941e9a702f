"""A provider installed on a fresh management cluster (by `clusterctl init` in tests/e2e/test_clusterctl_init.py, by
the Cluster API Operator in tests/e2e/test_capi_operator.py), proven the same way: what a user applies (the host and
its credentials, a bootstrap Secret, LibvirtCluster, LibvirtMachineTemplate, Cluster, a MachineDeployment of one),
Cluster API's controllers making the Machine and the LibvirtMachine, our manager (the pod of the installed
Deployment) provisioning it over qemu+ssh (and, for a Linux guest, the guest running its bootstrap data); then scaled
to 0 and deleted, the host clean. Plain requests to the API server (these tests drive it synchronously)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import ipaddress
import pathlib
import shutil
from collections.abc import Callable, Iterator
from typing import TypeVar

import libvirt

from capi_libvirt.api import meta, templates
from capi_libvirt.core import naming
from devenv import control_plane as cp
from devenv import pod_runner
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost
from guests import host_access, host_objects

import waiting
from prereq import require

T = TypeVar("T")
CAPI = f"/apis/{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"
INFRA = f"/apis/{meta.GROUP}/{meta.VERSION}"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
PROVISION_DEADLINE_S = 600.0
DELETE_DEADLINE_S = 180.0


@dataclasses.dataclass(frozen=True)
class Names:
    """What one test's objects are called (two beds may run side by side)."""

    namespace: str
    cluster: str
    host: str

    @property
    def deployment(self) -> str:
        return f"{self.cluster}-workers"

    @property
    def secret(self) -> str:
        return f"{self.cluster}-workers-bootstrap"


def wait_for(what: str, probe: Callable[[], T], timeout: float = 120.0, interval: float = 1.0) -> T:
    """waiting.wait_for with longer defaults (cert-manager and the managers start here)."""
    return waiting.wait_for(what, probe, timeout, interval)


def items(plane: cp.LocalControlPlane, path: str) -> list[dict]:
    return plane.request("GET", path)["items"]


def gone(plane: cp.LocalControlPlane, path: str) -> bool:
    try:
        plane.request("GET", path)
    except cp.ControlPlaneError as error:
        if error.status == 404:
            return True
        raise
    return False


def condition(document: dict, kind: str) -> str | None:
    return next((c["status"] for c in (document.get("status") or {}).get("conditions") or [] if c["type"] == kind),
                None)


@contextlib.contextmanager
def ssh_host_with_image(names: Names, subnet: str, link: int, upload: Callable[[libvirt.virConnect, str], str]
                        ) -> Iterator[tuple[ra.RemoteAccess, str]]:
    """A libvirt host reached over qemu+ssh (its own network namespace and link), its base volume put into its pool by
    `upload(connection, pool name)`, which returns the volume's name: (the access, the volume's name)."""
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen", "libvirtd", "qemu-system-x86_64"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost(names.host, subnet), link_index=link) as access:
        with access.host.connect() as conn:
            volume = upload(conn, access.host.pool_name)
        yield access, volume


def create_objects(plane: cp.LocalControlPlane, names: Names, access: ra.RemoteAccess, spec: dict,
                   user_data: str) -> None:
    """The host and its credentials, then what a user applies: bootstrap Secret (`user_data`), LibvirtCluster,
    LibvirtMachineTemplate, Cluster, MachineDeployment (1 replica)."""
    plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": names.namespace}})
    # The host's credentials in the provider's namespace, where the installer put it and its Secrets RoleBinding;
    # the cluster's namespace gets the RoleBinding the cluster templates carry (templates.secrets_binding).
    plane.request("POST", f"/api/v1/namespaces/{meta.PROVIDER_NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": names.host},
        "data": {"ssh-privatekey": base64.b64encode(access.ssh_key.read_bytes()).decode(),
                 "known_hosts": base64.b64encode(access.known_hosts.read_bytes()).decode()}})
    binding = templates.secrets_binding()
    binding["metadata"] = {"name": f"{names.cluster}-{meta.SECRETS_CLUSTER_ROLE}", "namespace": names.namespace}
    binding["subjects"][0]["namespace"] = meta.PROVIDER_NAMESPACE
    plane.apply(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{names.namespace}/rolebindings", binding)
    plane.request("POST", f"{INFRA}/libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": names.host},
        "spec": {"uri": f"qemu+ssh://root@{access.address}/system", "storagePool": access.host.pool_name,
                 "access": host_access(spec),
                 "credentialsSecretRef": {"name": names.host, "namespace": meta.PROVIDER_NAMESPACE}}})
    plane.request("POST", f"/api/v1/namespaces/{names.namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
        "metadata": {"name": names.secret, "labels": {meta.CLUSTER_NAME_LABEL: names.cluster}},
        "data": {"value": base64.b64encode(user_data.encode()).decode(),
                 "format": base64.b64encode(b"cloud-config").decode()}})
    # The endpoint is only data here (no control plane, nothing connects to it): the test API server's own.
    plane.request("POST", f"{INFRA}/namespaces/{names.namespace}/libvirtclusters", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtCluster", "metadata": {"name": names.cluster},
        "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": plane.secure_port}}})
    plane.request("POST", f"{INFRA}/namespaces/{names.namespace}/libvirtmachinetemplates", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": {"name": names.deployment},
        "spec": {"template": {"spec": spec | {"host": names.host}}}})
    plane.request("POST", f"{CAPI}/namespaces/{names.namespace}/clusters", {
        "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Cluster", "metadata": {"name": names.cluster},
        "spec": {"infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtCluster", "name": names.cluster}}})
    labels = {DEPLOYMENT_LABEL: names.deployment}
    plane.request("POST", f"{CAPI}/namespaces/{names.namespace}/machinedeployments", {
        "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "MachineDeployment",
        "metadata": {"name": names.deployment},
        "spec": {"clusterName": names.cluster, "replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "clusterName": names.cluster, "bootstrap": {"dataSecretName": names.secret},
                     "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachineTemplate",
                                           "name": names.deployment}}}}})


@dataclasses.dataclass(frozen=True)
class Provisioned:
    """The MachineDeployment's Machine and its LibvirtMachine, provisioned."""

    machine: dict
    infra: dict

    @property
    def infra_path(self) -> str:
        metadata = self.infra["metadata"]
        return f"{INFRA}/namespaces/{metadata['namespace']}/libvirtmachines/{metadata['name']}"

    @property
    def domain_uuid(self) -> str:
        return naming.domain_uuid(self.infra["metadata"]["uid"])

    def host_names(self) -> list[str]:
        """The names of its volumes and serial log on the host."""
        metadata = self.infra["metadata"]
        args = (metadata["namespace"], metadata["name"], metadata["uid"])
        return [naming.overlay_volume_name(*args), naming.nocloud_volume_name(*args),
                naming.serial_log_file_name(*args)]


def provisioned_machine(plane: cp.LocalControlPlane, names: Names, pod: pod_runner.PodmanPod, host) -> Provisioned:
    """Cluster API's MachineSet makes the one Machine; our manager (in `pod`) provisions its LibvirtMachine: owned by
    that Machine, its providerID on both, an address on the host's network (the guest's DHCP lease); the Machine
    Provisioned."""
    def machine() -> dict | None:
        found = items(plane, f"{CAPI}/namespaces/{names.namespace}/machines")
        return found[0] if len(found) == 1 else None
    made = wait_for("Cluster API's MachineSet to create 1 Machine", machine)
    infra_path = f"{INFRA}/namespaces/{names.namespace}/libvirtmachines/{made['spec']['infrastructureRef']['name']}"

    def provisioned() -> dict | None:
        assert pod.running(), f"the container exited:\n{pod.logs()[-4000:]}"
        try:
            body = plane.request("GET", infra_path)
        except cp.ControlPlaneError as error:
            if error.status == 404:
                return None
            raise
        return body if (body.get("status") or {}).get("initialization", {}).get("provisioned") else None
    body = wait_for("the LibvirtMachine provisioned by our manager", provisioned, PROVISION_DEADLINE_S, 2.0)
    result = Provisioned(made, body)
    assert [r["uid"] for r in body["metadata"]["ownerReferences"] if r["kind"] == "Machine"] == \
        [made["metadata"]["uid"]], "Cluster API's Machine controller owns the LibvirtMachine"
    assert body["spec"]["providerID"] == f"libvirt://{names.host}/{result.domain_uuid}"
    assert [a for a in body["status"]["addresses"] if a["type"] == "InternalIP" and
            ipaddress.ip_address(a["address"]) in host.subnet], body["status"]["addresses"]

    def machine_provisioned() -> dict | None:
        current = plane.request("GET", f"{CAPI}/namespaces/{names.namespace}/machines/{made['metadata']['name']}")
        return current if (current.get("status") or {}).get("phase") == "Provisioned" else None
    current = wait_for("the Machine Provisioned", machine_provisioned, 120)
    assert current["spec"]["providerID"] == body["spec"]["providerID"]
    return result


def bootstrap_ran(host, machine: Provisioned, marker: str) -> None:
    """The Linux guest ran its bootstrap data (capi_objects.marker_user_data): the marker on its console."""
    serial_log = pathlib.Path(host.pool_dir) / machine.host_names()[2]
    wait_for("the bootstrap marker on the console",
             lambda: serial_log.exists() and marker in serial_log.read_text(errors="replace"),
             PROVISION_DEADLINE_S, 2.0)


def scale(plane: cp.LocalControlPlane, names: Names, replicas: int) -> None:
    plane.request("PATCH", f"{CAPI}/namespaces/{names.namespace}/machinedeployments/{names.deployment}",
                  {"spec": {"replicas": replicas}}, content_type="application/merge-patch+json")


def scaled_to_zero_leaves_nothing(plane: cp.LocalControlPlane, names: Names, host, machine: Provisioned) -> None:
    """Scaled to 0: the Machine and the LibvirtMachine deleted, nothing of them on the host."""
    scale(plane, names, 0)
    wait_for("the Machine deleted", lambda: items(plane, f"{CAPI}/namespaces/{names.namespace}/machines") == [],
             DELETE_DEADLINE_S)
    wait_for("the LibvirtMachine deleted", lambda: gone(plane, machine.infra_path), DELETE_DEADLINE_S)
    assert host_objects(host, machine.domain_uuid, machine.host_names()) == []


def delete_everything(plane: cp.LocalControlPlane, names: Names) -> None:
    """The Cluster (Cluster API deletes what hangs off it; our manager releases the LibvirtCluster), then the rest."""
    cluster = f"{CAPI}/namespaces/{names.namespace}/clusters/{names.cluster}"
    for path in (cluster, f"{INFRA}/namespaces/{names.namespace}/libvirtmachinetemplates/{names.deployment}"):
        try:
            plane.request("DELETE", path)
        except cp.ControlPlaneError as error:
            if error.status != 404:
                raise
    wait_for("the Cluster deleted", lambda: gone(plane, cluster), DELETE_DEADLINE_S)
    try:
        plane.request("DELETE", f"{INFRA}/libvirthosts/{names.host}")
    except cp.ControlPlaneError as error:
        if error.status != 404:
            raise
    wait_for("the LibvirtHost released", lambda: gone(plane, f"{INFRA}/libvirthosts/{names.host}"),
             DELETE_DEADLINE_S)
