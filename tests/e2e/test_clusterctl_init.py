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

import os
import pathlib
import time
import uuid
from collections.abc import Iterator

import pytest

from capi_libvirt.api import meta, release
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
from devenv.libvirt_host import LibvirtHost
from guests import machine_spec
from installed_provider import (
    Names,
    bootstrap_ran,
    condition,
    create_objects,
    delete_everything,
    items,
    provisioned_machine,
    scaled_to_zero_leaves_nothing,
    ssh_host_with_image,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

SUBNET, LINK = "192.168.156.0/24", 156
NAMES = Names(namespace="init-demo", cluster="init", host="init-host")
OURS = management_cluster.OPERATOR
PROVIDERS = {  # the inventory clusterctl writes: provider name -> (type, version)
    "cluster-api": ("CoreProvider", paths.CLUSTER_API_VERSION),
    "bootstrap-kubeadm": ("BootstrapProvider", paths.CLUSTER_API_VERSION),
    "control-plane-kubeadm": ("ControlPlaneProvider", paths.CLUSTER_API_VERSION),
    "infrastructure-libvirt": ("InfrastructureProvider", clusterctl_repository.VERSION),
}
# Each provider's webhook Service and the Secret cert-manager writes for its Certificate. The kubeadm control plane's is
# installed and issued; its manager is not built nor run here.
WEBHOOK_SECRETS = {(p.namespace, p.webhook_service): p.certificate_secret for p in (capi.CORE, capi.KUBEADM_BOOTSTRAP)}
WEBHOOK_SECRETS[("capi-kubeadm-control-plane-system", "capi-kubeadm-control-plane-webhook-service")] = \
    "capi-kubeadm-control-plane-webhook-service-cert"
WEBHOOK_SECRETS[("cert-manager", "cert-manager-webhook")] = "cert-manager-webhook-ca"  # its webhook's dynamic CA


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
    with ssh_host_with_image(NAMES, SUBNET, LINK,
                             lambda conn, pool: base_image.upload_base_image(conn, pool, guest_image)) as found:
        yield found


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
        create_objects(plane, NAMES, access, machine_spec(host, guest_image, volume),
                       capi_objects.marker_user_data(marker))
        machine = provisioned_machine(plane, NAMES, pod, host)
        bootstrap_ran(host, machine, marker)
        body, domain_uuid = machine.infra, machine.domain_uuid
        print(f"\n[init] a Machine of the MachineDeployment provisioned and booted after "
              f"{time.monotonic() - started:.1f}s")

        running = domain_id(host, domain_uuid)
        upgrading = time.monotonic()
        pod = upgrade_to_a_bumped_release(installed, plane, operator_image, pod, tmp_path / "pod-upgraded")
        print(f"[init] clusterctl upgrade to {BUMPED} done and its manager ready after "
              f"{time.monotonic() - upgrading:.1f}s")
        assert domain_id(host, domain_uuid) == running, "the VM ran on through the upgrade, never restarted"
        after = plane.request("GET", machine.infra_path)
        assert after["status"]["initialization"]["provisioned"] and after["spec"]["providerID"] == \
            body["spec"]["providerID"]

        # What follows is the bumped release's manager's work: the only one running.
        scaled_to_zero_leaves_nothing(plane, NAMES, host, machine)
        delete_everything(plane, NAMES)
        assert pod.terminate() == 0, f"SIGTERM: the manager did not exit cleanly:\n{pod.logs()[-4000:]}"
        assert "role: leader" in pod.logs()
    finally:
        pod.stop()
        pod_runner.podman("untag", operator_image, release.image(BUMPED), check=False)
