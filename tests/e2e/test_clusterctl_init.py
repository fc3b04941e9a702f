"""`clusterctl init` for real, on a fresh API server, and a machine provisioned through what it installed.

`clusterctl init --core cluster-api --bootstrap kubeadm --control-plane kubeadm --infrastructure libvirt` runs against
a control plane of this module's own (not the session's, which holds test-made copies of Cluster API's objects), from
a local repository: Cluster API's components kustomized from its module, our `make release-manifests` output, and
cert-manager.yaml rendered from cert-manager's chart (devenv/clusterctl_repository.py). The test bed plays the kubelet
(devenv/clusterctl_init.py): cert-manager's three programs (built from its Go module) start once clusterctl has
installed cert-manager's CRDs; the API server reaches every webhook Service through EndpointSlices to a local address.

What is proved:
- clusterctl exits 0: cert-manager's webhook admitted its test Issuer and Certificate, with the CA its cainjector
  injected; the inventory lists the four providers at their versions; the providers' Certificates are Ready and their
  CA is in Cluster API's CRD conversions and webhook configurations;
- the Cluster API core and kubeadm bootstrap managers run as their Deployments say, as their ServiceAccounts (the RBAC
  clusterctl installed, aggregated by kube-controller-manager), serving the certificates cert-manager issued;
- our manager runs from the image `make image` built, as the Deployment clusterctl installed says (devenv.pod_runner),
  with the ServiceAccount and RBAC of infrastructure-components.yaml;
- a MachineDeployment of 1 leads Cluster API's controllers to a Machine and a LibvirtMachine that our manager
  provisions over qemu+ssh on a libvirt host (the guest boots and runs its bootstrap data); the Machine is Provisioned
  with the LibvirtMachine's providerID; scaling to 0 leaves nothing on the host;
- `clusterctl upgrade plan` reads our metadata: it exits 0 and names infrastructure-libvirt at v0.1.0;
- `clusterctl upgrade` to a bumped release (v0.1.1: this code's release written beside v0.1.0 in the repository, its
  image the one built, tagged as v0.1.1 names it): the plan offers it, `upgrade apply` installs it while the machine
  runs, the inventory and the Deployment say v0.1.1, the VM runs on untouched (same domain ID), and the new manager
  is the one that deletes the machine when the MachineDeployment scales to 0.
"""

from __future__ import annotations

import base64
import os
import pathlib
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from capi_libvirt.api import meta, release, templates
from capi_libvirt.core import naming
from devenv import (
    base_image,
    capi_objects,
    clusterctl_init,
    clusterctl_repository,
    management_cluster,
    paths,
    pod_runner,
    service_address,
)
from devenv import capi_controller as capi
from devenv import control_plane as cp
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost
from guests import host_access, host_objects, machine_spec

import waiting
from prereq import require

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

T = TypeVar("T")
SUBNET, LINK = "192.168.156.0/24", 156
HOST = "init-host"
NAMESPACE = "init-demo"
CLUSTER, DEPLOYMENT, SECRET = "init", "init-workers", "init-workers-bootstrap"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
CAPI = f"/apis/{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"
INFRA = f"/apis/{meta.GROUP}/{meta.VERSION}"
OURS = management_cluster.OPERATOR
PROVIDERS = {  # the inventory clusterctl writes: provider name -> (type, version)
    "cluster-api": ("CoreProvider", paths.CLUSTER_API_VERSION),
    "bootstrap-kubeadm": ("BootstrapProvider", paths.CLUSTER_API_VERSION),
    "control-plane-kubeadm": ("ControlPlaneProvider", paths.CLUSTER_API_VERSION),
    "infrastructure-libvirt": ("InfrastructureProvider", clusterctl_repository.VERSION),
}
PROVISION_DEADLINE_S = 600.0
DELETE_DEADLINE_S = 180.0
# Each provider's webhook Service and the Secret cert-manager writes for its Certificate. The kubeadm control plane's is
# installed and issued; its manager is not built nor run here.
WEBHOOK_SECRETS = {(p.namespace, p.webhook_service): p.certificate_secret for p in (capi.CORE, capi.KUBEADM_BOOTSTRAP)}
WEBHOOK_SECRETS[("capi-kubeadm-control-plane-system", "capi-kubeadm-control-plane-webhook-service")] = \
    "capi-kubeadm-control-plane-webhook-service-cert"
WEBHOOK_SECRETS[("cert-manager", "cert-manager-webhook")] = "cert-manager-webhook-ca"  # its webhook's dynamic CA


def wait_for(what: str, probe: Callable[[], T], timeout: float = 120.0, interval: float = 1.0) -> T:
    """waiting.wait_for with this test's longer defaults (cert-manager and the managers start here)."""
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


# -- fixtures --------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def management(init_repository: clusterctl_repository.Repository,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[management_cluster.ManagementCluster]:
    """A fresh API server with no CRDs (clusterctl installs them all), the controllers of kube-controller-manager a
    management cluster needs here (namespaces, garbage collection, ClusterRole aggregation), `clusterctl init`."""
    started = time.monotonic()
    with management_cluster.ManagementCluster(tmp_path_factory.mktemp("init"), init_repository,
                                              service_address.ADDRESS) as management:
        print(f"\n[init] clusterctl init exited 0 and the Cluster API managers serve after "
              f"{time.monotonic() - started:.1f}s")
        yield management


@pytest.fixture(scope="module")
def plane(management: management_cluster.ManagementCluster) -> cp.LocalControlPlane:
    return management.plane


@pytest.fixture(scope="module")
def installed(management: management_cluster.ManagementCluster) -> clusterctl_init.ClusterctlInit:
    assert management.init is not None
    return management.init


@pytest.fixture(scope="module")
def ssh_host(guest_image):
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen", "libvirtd", "qemu-system-x86_64"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost(HOST, SUBNET), link_index=LINK) as access:
        with access.host.connect() as conn:
            volume = base_image.upload_base_image(conn, access.host.pool_name, guest_image)
        yield access, volume


# -- what clusterctl installed is what runs ----------------------------------------------------------------------

def test_clusterctl_init_installs_cert_manager_and_the_providers_that_run(
        installed: clusterctl_init.ClusterctlInit, plane: cp.LocalControlPlane) -> None:
    assert installed.result is not None and installed.result.returncode == 0
    assert "Your management cluster has been initialized successfully!" in installed.result.stdout
    assert "Installing cert-manager" in installed.result.stdout, "cert-manager came with clusterctl"

    inventory = items(plane, "/apis/clusterctl.cluster.x-k8s.io/v1alpha3/providers")
    assert {p["metadata"]["name"]: (p["type"], p["version"]) for p in inventory} == PROVIDERS

    certificates = items(plane, "/apis/cert-manager.io/v1/certificates")
    names = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in certificates}
    assert {(p.namespace, f"{p.name_prefix}serving-cert") for p in (capi.CORE, capi.KUBEADM_BOOTSTRAP)} <= names
    for certificate in certificates:
        path = (f"/apis/cert-manager.io/v1/namespaces/{certificate['metadata']['namespace']}/certificates/"
                f"{certificate['metadata']['name']}")
        assert wait_for(f"Certificate {certificate['metadata']['name']} Ready",
                        lambda path=path: condition(plane.request("GET", path), "Ready") == "True")

    # The CA cainjector injected into every conversion and webhook is the one of the Secret cert-manager wrote for the
    # Service's certificate (its CA Issuer's for the providers; its webhook's dynamic CA for cert-manager itself).
    expected = {(namespace, service): plane.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{secret}")[
        "data"]["ca.crt"] for (namespace, service), secret in WEBHOOK_SECRETS.items()}
    def client_configs() -> dict[str, dict]:
        found = {}
        for crd in items(plane, capi.CRDS):
            webhook = (crd["spec"].get("conversion") or {}).get("webhook")
            if crd["spec"]["conversion"]["strategy"] == "Webhook":
                found[f"CRD {crd['metadata']['name']}"] = webhook["clientConfig"]
        for kind, collection in capi.WEBHOOK_COLLECTIONS.items():
            for configuration in items(plane, collection):
                for webhook in configuration["webhooks"]:
                    found[f"{kind} {configuration['metadata']['name']} {webhook['name']}"] = webhook["clientConfig"]
        return found

    def not_injected() -> list[str]:
        return [what for what, client_config in client_configs().items() if client_config.get("caBundle") !=
                expected[(client_config["service"]["namespace"], client_config["service"]["name"])]]
    # cainjector writes them as it gets to them (a busy machine: a CRD a few seconds after its Certificate is Ready).
    wait_for("the CA injected into every conversion and webhook", lambda: not not_injected() or None, 120)
    assert sum(what.startswith("CRD ") for what in client_configs()) >= 17, \
        "Cluster API's CRDs with their conversion webhooks (core 13, kubeadm 2 + 2)"

    # The managers: alive, logged in as their Deployments' ServiceAccounts, serving (their probe went through the
    # API server, the Service's EndpointSlice and cert-manager's certificate at start).
    assert [m.provider for m in installed.managers] == [capi.CORE, capi.KUBEADM_BOOTSTRAP]
    for manager in installed.managers:
        assert manager.pid is not None, manager.provider.name
        os.kill(manager.pid, 0)  # alive
        assert manager.kubeconfig != plane.kubeconfig_path
        assert "system:serviceaccount:" in manager.kubeconfig.read_text()
        assert any(arg.startswith("--feature-gates=") for arg in manager.argv()), "the Deployment's feature gates"
        manager.provider.probe(plane)
    assert installed.cert_manager is not None
    installed.cert_manager.check_alive()


def test_clusterctl_upgrade_plan_reads_our_metadata(installed: clusterctl_init.ClusterctlInit) -> None:
    plan = installed.clusterctl("upgrade", "plan")
    assert plan.returncode == 0, plan.stderr
    [ours] = [line.split() for line in plan.stdout.splitlines() if line.startswith("infrastructure-libvirt ")]
    assert ours[:4] == ["infrastructure-libvirt", "capi-libvirt-system", "InfrastructureProvider",
                        clusterctl_repository.VERSION], plan.stdout


# -- a machine through what clusterctl installed ---------------------------------------------------------------------

def create_objects(plane: cp.LocalControlPlane, access: ra.RemoteAccess, spec: dict, marker: str) -> None:
    """The host and its credentials, then what a user applies: bootstrap Secret, LibvirtCluster,
    LibvirtMachineTemplate, Cluster, MachineDeployment (1 replica)."""
    plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NAMESPACE}})
    # The host's credentials in the provider's namespace, where clusterctl init put it and its Secrets RoleBinding;
    # the cluster's namespace gets the RoleBinding the cluster templates carry (templates.secrets_binding).
    plane.request("POST", f"/api/v1/namespaces/{meta.PROVIDER_NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": HOST},
        "data": {"ssh-privatekey": base64.b64encode(access.ssh_key.read_bytes()).decode(),
                 "known_hosts": base64.b64encode(access.known_hosts.read_bytes()).decode()}})
    binding = templates.secrets_binding()
    binding["metadata"] = {"name": f"{CLUSTER}-{meta.SECRETS_CLUSTER_ROLE}", "namespace": NAMESPACE}
    binding["subjects"][0]["namespace"] = meta.PROVIDER_NAMESPACE
    plane.apply(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings", binding)
    plane.request("POST", f"{INFRA}/libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": HOST},
        "spec": {"uri": f"qemu+ssh://root@{access.address}/system", "storagePool": access.host.pool_name,
                 "access": host_access(spec),
                 "credentialsSecretRef": {"name": HOST, "namespace": meta.PROVIDER_NAMESPACE}}})
    plane.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
        "metadata": {"name": SECRET, "labels": {meta.CLUSTER_NAME_LABEL: CLUSTER}},
        "data": {"value": base64.b64encode(capi_objects.marker_user_data(marker).encode()).decode(),
                 "format": base64.b64encode(b"cloud-config").decode()}})
    # The endpoint is only data here (no control plane, nothing connects to it): the test API server's own.
    plane.request("POST", f"{INFRA}/namespaces/{NAMESPACE}/libvirtclusters", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtCluster", "metadata": {"name": CLUSTER},
        "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": plane.secure_port}}})
    plane.request("POST", f"{INFRA}/namespaces/{NAMESPACE}/libvirtmachinetemplates", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": {"name": DEPLOYMENT},
        "spec": {"template": {"spec": spec}}})
    plane.request("POST", f"{CAPI}/namespaces/{NAMESPACE}/clusters", {
        "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Cluster", "metadata": {"name": CLUSTER},
        "spec": {"infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtCluster", "name": CLUSTER}}})
    labels = {DEPLOYMENT_LABEL: DEPLOYMENT}
    plane.request("POST", f"{CAPI}/namespaces/{NAMESPACE}/machinedeployments", {
        "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "MachineDeployment",
        "metadata": {"name": DEPLOYMENT},
        "spec": {"clusterName": CLUSTER, "replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "clusterName": CLUSTER, "bootstrap": {"dataSecretName": SECRET},
                     "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachineTemplate",
                                           "name": DEPLOYMENT}}}}})


BUMPED = "v0.1.1"  # the release `clusterctl upgrade` goes to: this code again, under the next version


def domain_id(host: LibvirtHost, domain_uuid: str) -> int:
    """The running domain's ID: a new one whenever the VM is started again."""
    with host.connect() as conn:
        domain = conn.lookupByUUIDString(domain_uuid)
        assert domain.isActive(), f"domain {domain_uuid} is not running"
        return int(domain.ID())


def upgrade_to_a_bumped_release(installed: clusterctl_init.ClusterctlInit, plane: cp.LocalControlPlane, image: str,
                                old_pod: pod_runner.PodmanPod, folder: pathlib.Path) -> pod_runner.PodmanPod:
    """`clusterctl upgrade` from v0.1.0 to BUMPED, and the bumped manager's pod started as a kubelet would; returns it.
    The bumped release's files go beside the first ones in the local repository (clusterctl lists a provider's
    versions from its folders there); its image is the one built, tagged as the bumped components name it."""
    release.write(installed.repository.root, BUMPED, clusterctl_repository.REPO / "config")
    pod_runner.podman("tag", image, release.image(BUMPED))
    plan = installed.clusterctl("upgrade", "plan")
    assert plan.returncode == 0, plan.stderr
    [ours] = [line.split() for line in plan.stdout.splitlines() if line.startswith("infrastructure-libvirt ")]
    assert ours[3:5] == [clusterctl_repository.VERSION, BUMPED], plan.stdout
    # The upgrade deletes the old Deployment, and with it the pod: stopped here, as the kubelet would stop it.
    assert old_pod.terminate() == 0, f"SIGTERM: the old manager did not exit cleanly:\n{old_pod.logs()[-4000:]}"
    old_pod.stop()
    applied = installed.clusterctl("upgrade", "apply", "--infrastructure",
                                   f"{meta.PROVIDER_NAMESPACE}/libvirt:{BUMPED}", timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    inventory = {p["metadata"]["name"]: p["version"]
                 for p in items(plane, "/apis/clusterctl.cluster.x-k8s.io/v1alpha3/providers")}
    assert inventory == {name: version for name, (_, version) in PROVIDERS.items()} | {"infrastructure-libvirt": BUMPED}
    namespace, name = OURS
    deployment = plane.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == release.image(BUMPED)
    pod = pod_runner.PodmanPod(plane, namespace, name, folder, name=f"pod-{namespace}-upgraded")
    pod.start()
    pod.wait_ready()
    return pod


def scale(plane: cp.LocalControlPlane, replicas: int) -> None:
    plane.request("PATCH", f"{CAPI}/namespaces/{NAMESPACE}/machinedeployments/{DEPLOYMENT}",
                  {"spec": {"replicas": replicas}}, content_type="application/merge-patch+json")


def delete_everything(plane: cp.LocalControlPlane) -> None:
    """The Cluster (Cluster API deletes what hangs off it; our manager releases the LibvirtCluster), then the rest."""
    for path in (f"{CAPI}/namespaces/{NAMESPACE}/clusters/{CLUSTER}",
                 f"{INFRA}/namespaces/{NAMESPACE}/libvirtmachinetemplates/{DEPLOYMENT}"):
        try:
            plane.request("DELETE", path)
        except cp.ControlPlaneError as error:
            if error.status != 404:
                raise
    wait_for("the Cluster deleted", lambda: gone(plane, f"{CAPI}/namespaces/{NAMESPACE}/clusters/{CLUSTER}"),
             DELETE_DEADLINE_S)
    try:
        plane.request("DELETE", f"{INFRA}/libvirthosts/{HOST}")
    except cp.ControlPlaneError as error:
        if error.status != 404:
            raise
    wait_for("the LibvirtHost released", lambda: gone(plane, f"{INFRA}/libvirthosts/{HOST}"), DELETE_DEADLINE_S)


def test_a_machine_deployment_is_provisioned_through_what_clusterctl_installed(
        installed: clusterctl_init.ClusterctlInit, plane: cp.LocalControlPlane, operator_image: str, ssh_host,
        guest_image, tmp_path: pathlib.Path) -> None:
    access, volume = ssh_host
    host = access.host
    namespace, name = OURS
    deployment = plane.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == operator_image, "clusterctl installed the image make image built"

    marker = f"marker-init-{uuid.uuid4().hex[:10]}"
    pod = pod_runner.PodmanPod(plane, namespace, name, tmp_path / "pod")
    started = time.monotonic()
    try:
        pod.start()
        pod.wait_ready()
        create_objects(plane, access, machine_spec(host, guest_image, volume) | {"host": HOST}, marker)

        def machine() -> dict | None:
            found = items(plane, f"{CAPI}/namespaces/{NAMESPACE}/machines")
            return found[0] if len(found) == 1 else None
        made = wait_for("Cluster API's MachineSet to create 1 Machine", machine)
        infra_name = made["spec"]["infrastructureRef"]["name"]
        infra_path = f"{INFRA}/namespaces/{NAMESPACE}/libvirtmachines/{infra_name}"

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
        uid = body["metadata"]["uid"]
        domain_uuid = naming.domain_uuid(uid)
        assert [r["uid"] for r in body["metadata"]["ownerReferences"] if r["kind"] == "Machine"] == \
            [made["metadata"]["uid"]], "Cluster API's Machine controller owns the LibvirtMachine"
        assert body["spec"]["providerID"] == f"libvirt://{HOST}/{domain_uuid}"
        assert [a for a in body["status"]["addresses"] if a["address"].startswith("192.168.156.")]

        def machine_provisioned() -> dict | None:
            current = plane.request("GET", f"{CAPI}/namespaces/{NAMESPACE}/machines/{made['metadata']['name']}")
            return current if (current.get("status") or {}).get("phase") == "Provisioned" else None
        current = wait_for("the Machine Provisioned", machine_provisioned, 120)
        assert current["spec"]["providerID"] == body["spec"]["providerID"]
        serial_log = pathlib.Path(host.pool_dir) / naming.serial_log_file_name(NAMESPACE, infra_name, uid)
        wait_for("the bootstrap marker on the console",
                 lambda: serial_log.exists() and marker in serial_log.read_text(errors="replace"),
                 PROVISION_DEADLINE_S, 2.0)
        print(f"\n[init] a Machine of the MachineDeployment provisioned and booted after "
              f"{time.monotonic() - started:.1f}s")

        running = domain_id(host, domain_uuid)
        upgrading = time.monotonic()
        pod = upgrade_to_a_bumped_release(installed, plane, operator_image, pod, tmp_path / "pod-upgraded")
        print(f"[init] clusterctl upgrade to {BUMPED} done and its manager ready after "
              f"{time.monotonic() - upgrading:.1f}s")
        assert domain_id(host, domain_uuid) == running, "the VM ran on through the upgrade, never restarted"
        after = plane.request("GET", infra_path)
        assert after["status"]["initialization"]["provisioned"] and after["spec"]["providerID"] == \
            body["spec"]["providerID"]

        scale(plane, 0)  # what follows is the bumped release's manager's work: the only one running
        wait_for("the Machine deleted", lambda: items(plane, f"{CAPI}/namespaces/{NAMESPACE}/machines") == [],
                 DELETE_DEADLINE_S)
        wait_for("the LibvirtMachine deleted", lambda: gone(plane, infra_path), DELETE_DEADLINE_S)
        names = [naming.overlay_volume_name(NAMESPACE, infra_name, uid),
                 naming.nocloud_volume_name(NAMESPACE, infra_name, uid),
                 naming.serial_log_file_name(NAMESPACE, infra_name, uid)]
        assert host_objects(host, domain_uuid, names) == []
        delete_everything(plane)
        assert pod.terminate() == 0, f"SIGTERM: the manager did not exit cleanly:\n{pod.logs()[-4000:]}"
        assert "role: leader" in pod.logs()
    finally:
        pod.stop()
        pod_runner.podman("untag", operator_image, release.image(BUMPED), check=False)
