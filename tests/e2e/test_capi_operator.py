"""The provider installed by the Cluster API Operator, for real, and a machine provisioned through what it installed.

On a fresh API server (with the controllers of kube-controller-manager a management cluster needs here): cert-manager
from its release manifest, then the Cluster API Operator v0.29.0 (built from its module, devenv/capi_operator.py).
Cluster API's core and our provider are installed the operator's way, declaratively, from ConfigMaps holding each
release's metadata.yaml and components (the operator's offline source): a CoreProvider `cluster-api`, then an
InfrastructureProvider `libvirt` whose `spec.manager` asks for a verbosity, a sync period, leader election with its
durations and id, LibvirtMachine concurrency, and the health and metrics addresses.

What is proved:
- the operator installs both: each provider's Deployment and CRDs are there, each provider object names the version
  it installed (and ours the v1beta2 contract of its metadata.yaml), says ProviderInstalled and then Ready (the operator's health check reads the
  Deployment's Available condition);
- our Deployment carries the flags the operator wrote from `spec.manager`, spelled as Cluster API's managers spell
  them, and our manager, run from the image `make image` built exactly as that Deployment says (devenv/pod_runner.py),
  accepts every one of them: it becomes ready, leads through the Lease the operator named, and runs with the settings
  (its first log line says them);
- Cluster API's core manager, run from what the operator installed, and our manager provision a MachineDeployment's
  Machine on a libvirt host over qemu+ssh: the LibvirtMachine owned by the Machine, its providerID on both, its
  address the DHCP lease the host's network gave the guest, the Machine Provisioned; scaled to 0, nothing is left on
  the host.

The guest is Debian's iPXE image (devenv/ipxe_image.py): it boots in a second and takes a lease, so "provisioned" is
real, but it runs no operating system, so nothing runs its bootstrap data here. That a Linux guest provisioned over
qemu+ssh from an installed provider boots and runs its bootstrap data is tests/e2e/test_clusterctl_init.py's proof.

Stand-ins, and why: no kubelet runs pods here, so the test bed starts each Deployment's pod itself (our manager under
podman, Cluster API's core manager as a process with the Deployment's args, devenv/capi_controller.py) and writes the
Deployment's Available status as its controller would once the pod is Ready (capi_operator.deployment_available);
the operator runs as a process with the admin's credentials, its own webhooks not installed (its Helm chart, which
carries them and its RBAC, is not served here).
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import pytest
import yaml

from capi_libvirt.api import meta, release
from devenv import capi_controller as capi
from devenv import capi_operator as op
from devenv import clusterctl_repository, ipxe_image, paths, pod_runner
from devenv import control_plane as cp
from devenv.autoscaling import MANAGEMENT_CLUSTER, KubeControllerManager
from devenv.cert_manager import NAMESPACE as CERT_MANAGER_NAMESPACE
from devenv.cert_manager import WEBHOOK_SERVICE as CERT_MANAGER_WEBHOOK
from devenv.cert_manager import LocalCertManager
from devenv.management_cluster import OPERATOR, OPERATOR_PORTS
from devenv.service_address import ServiceAddress, webhook_services
from installed_provider import (
    Names,
    condition,
    create_objects,
    delete_everything,
    items,
    provisioned_machine,
    scaled_to_zero_leaves_nothing,
    ssh_host_with_image,
    wait_for,
)

from prereq import require

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

SERVICE_ADDRESS = "198.19.255.4"  # this bed's own (devenv/service_address.py): others may run beside it
SUBNET, LINK = "192.168.158.0/24", 158
NAMES = Names(namespace="operator-demo", cluster="by-operator", host="operator-host")
CORE_NAMESPACE = capi.CORE.namespace
OUR_NAMESPACE, OUR_DEPLOYMENT = OPERATOR
INSTALL_TIMEOUT_S = 300.0
LEASE = "capi-libvirt-by-operator"
# What the InfrastructureProvider asks of our manager, and the args Cluster API Operator v0.29.0 writes for it
# (internal/controller/component_customizer.go): the container ports stay those of config/manager.
MANAGER_SPEC = {
    "verbosity": 2,
    "syncPeriod": "5m",
    "controller": {"groupKindConcurrency": {"LibvirtMachine": 3}},
    "health": {"healthProbeBindAddress": f":{OPERATOR_PORTS[1]}"},
    "metrics": {"bindAddress": f":{OPERATOR_PORTS[0]}"},
    "leaderElection": {"leaderElect": True, "resourceName": LEASE, "resourceNamespace": OUR_NAMESPACE,
                       "leaseDuration": "20s", "renewDeadline": "15s", "retryPeriod": "3s",
                       "resourceLock": "leases"},
}
WRITTEN_ARGS = {"--v=2", "--sync-period=300s", "--libvirtmachine-concurrency=3",
                f"--health-addr=:{OPERATOR_PORTS[1]}", f"--metrics-bind-addr=:{OPERATOR_PORTS[0]}",
                "--leader-elect=true", f"--leader-election-id={OUR_NAMESPACE}/{LEASE}",
                "--leader-elect-lease-duration=20s", "--leader-elect-renew-deadline=15s",
                "--leader-elect-retry-period=3s"}

SETTINGS_LOGGED = ("3 concurrent LibvirtMachine reconciles, sync period 300s, watch filter none, leader election over "
                   f"the Lease {OUR_NAMESPACE}/{LEASE} (duration 20s, renew deadline 15s, retry period 3s)")


def documents(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def provider(plane: cp.LocalControlPlane, kind: str, namespace: str, name: str) -> dict:
    return plane.request("GET", f"{op.collection(kind, namespace)}/{name}")


def ready(plane: cp.LocalControlPlane, kind: str, namespace: str, name: str) -> dict | None:
    found = provider(plane, kind, namespace, name)
    return found if condition(found, "Ready") == "True" else None


def installed(plane: cp.LocalControlPlane, kind: str, namespace: str, name: str, operator: op.CapiOperator) -> dict:
    """The provider object once the operator says ProviderInstalled (its Deployment is then there)."""
    def probe() -> dict | None:
        operator.check_alive()
        found = provider(plane, kind, namespace, name)
        return found if condition(found, "ProviderInstalled") == "True" else None
    return wait_for(f"{kind} {namespace}/{name} installed by the operator", probe, INSTALL_TIMEOUT_S, 2.0)


class OperatorBed:
    """API server, kube-controller-manager, cert-manager, the Cluster API Operator, and the core provider it
    installed, running; a context manager."""

    def __init__(self, workdir: pathlib.Path, repository: clusterctl_repository.Repository) -> None:
        self.workdir = workdir
        self.repository = repository
        self.plane = cp.LocalControlPlane(workdir=workdir / "control-plane")
        self.address = ServiceAddress(SERVICE_ADDRESS)
        self.ports: dict[tuple[str, str], int] = {}
        self.stack: list = []  # what started, stopped last first
        self.operator: op.CapiOperator | None = None
        self.core: capi.CapiController | None = None

    def __enter__(self) -> OperatorBed:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _started(self, thing):
        self.stack.append(thing)
        return thing.start()

    def start(self) -> None:
        self.plane.workdir.mkdir(parents=True, exist_ok=True)
        self._started(self.plane)
        self._started(KubeControllerManager(self.plane, controllers=MANAGEMENT_CLUSTER))
        self._started(self.address)
        cert_manager, core_components, ours = self.repository.components[0], *self._release_files()
        for (namespace, service), port_name in webhook_services(
                documents(cert_manager) + documents(core_components) + documents(ours)).items():
            port = self.ports[(namespace, service)] = cp.free_port()
            self.address.point(self.plane, namespace, service, port_name, port)
        # cert-manager as its release manifest installs it (kubectl apply), its programs started once it is.
        self.plane.apply_objects(documents(cert_manager))
        self._started(LocalCertManager(self.plane, self.workdir / "cert-manager",
                                       self.ports[(CERT_MANAGER_NAMESPACE, CERT_MANAGER_WEBHOOK)]))
        self.operator = self._started(op.CapiOperator(self.plane, self.workdir / "operator"))
        # The core provider, the operator's way: its ConfigMap and a CoreProvider in the namespace it goes to.
        self._provider_config_map(CORE_NAMESPACE, "cluster-api", paths.CLUSTER_API_VERSION, core_components)
        self.plane.request("POST", op.collection("CoreProvider", CORE_NAMESPACE), op.provider_object(
            "CoreProvider", CORE_NAMESPACE, "cluster-api", paths.CLUSTER_API_VERSION))
        installed(self.plane, "CoreProvider", CORE_NAMESPACE, "cluster-api", self.operator)
        self.core = self._started(capi.CapiController(
            self.plane, provider=op.CORE, installed_by_clusterctl=True,
            webhook_port=self.ports[(CORE_NAMESPACE, capi.CORE.webhook_service)]))
        op.deployment_available(self.plane, CORE_NAMESPACE, capi.CORE.deployment)
        wait_for("the CoreProvider Ready", lambda: ready(self.plane, "CoreProvider", CORE_NAMESPACE, "cluster-api"),
                 INSTALL_TIMEOUT_S, 2.0)

    def _release_files(self) -> tuple[pathlib.Path, pathlib.Path]:
        core = next(f for f in self.repository.components if f.name == "core-components.yaml")
        ours = release.release_dir(self.repository.root, self.repository.version) / release.COMPONENTS
        return core, ours

    def _provider_config_map(self, namespace: str, name: str, version: str, components: pathlib.Path) -> None:
        self.plane.request("PATCH", f"/api/v1/namespaces/{namespace}?fieldManager=test-bed&force=true",
                           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                           content_type="application/apply-patch+yaml")
        metadata = (components.parent / "metadata.yaml").read_text()
        self.plane.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", op.provider_config_map(
            namespace, name, version, metadata, components.read_text()))

    def install_ours(self) -> dict:
        """Our release's ConfigMap and the InfrastructureProvider with MANAGER_SPEC; the provider object once
        installed."""
        _, ours = self._release_files()
        self._provider_config_map(OUR_NAMESPACE, "libvirt", self.repository.version, ours)
        self.plane.request("POST", op.collection("InfrastructureProvider", OUR_NAMESPACE), op.provider_object(
            "InfrastructureProvider", OUR_NAMESPACE, "libvirt", self.repository.version, manager=MANAGER_SPEC))
        assert self.operator is not None
        return installed(self.plane, "InfrastructureProvider", OUR_NAMESPACE, "libvirt", self.operator)

    def stop(self) -> None:
        while self.stack:
            thing = self.stack.pop()
            try:
                thing.stop()
            except Exception as error:  # noqa: BLE001  the rest must stop too
                print(f"[operator] stopping {type(thing).__name__}: {error}")


@pytest.fixture(scope="module")
def bed(init_repository: clusterctl_repository.Repository,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorBed]:
    for binary in (paths.cluster_api_operator_binary(), paths.cluster_api_manager_binary()):
        require(binary.exists(), f"{binary} (make test builds it: hack/build-upstream.sh)")
    started = time.monotonic()
    with OperatorBed(tmp_path_factory.mktemp("capi-operator"), init_repository) as bed:
        print(f"\n[operator] cert-manager, the Cluster API Operator and the CoreProvider it installed ready after "
              f"{time.monotonic() - started:.1f}s")
        yield bed


@pytest.fixture(scope="module")
def ssh_host(tmp_path_factory: pytest.TempPathFactory):
    require(ipxe_image.IPXE_ISO.exists(), f"{ipxe_image.IPXE_ISO} (Debian's ipxe package, make system-deps)")
    image = ipxe_image.ipxe_qcow2(tmp_path_factory.mktemp("ipxe"))
    with ssh_host_with_image(NAMES, SUBNET, LINK,
                             lambda conn, pool: ipxe_image.upload_base(conn, pool, image)) as found:
        yield found


def test_the_operator_installs_our_provider_with_its_manager_settings_and_a_machine_is_provisioned(
        bed: OperatorBed, operator_image: str, ssh_host, tmp_path: pathlib.Path) -> None:
    plane = bed.plane
    started = time.monotonic()
    ours = bed.install_ours()
    assert ours["status"]["installedVersion"] == bed.repository.version, ours["status"]
    core = provider(plane, "CoreProvider", CORE_NAMESPACE, "cluster-api")
    assert (core["status"]["installedVersion"], ours["status"]["contract"]) == (paths.CLUSTER_API_VERSION, "v1beta2")
    crds = {c["metadata"]["name"] for c in items(plane, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")}
    assert {f"{plural}.{meta.GROUP}" for plural in ("libvirtmachines", "libvirtclusters", "libvirthosts",
                                                     "libvirtmachinetemplates")} <= crds

    deployment = plane.request("GET", f"/apis/apps/v1/namespaces/{OUR_NAMESPACE}/deployments/{OUR_DEPLOYMENT}")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == operator_image, "the operator installed the image make image built"
    args = container["args"]
    assert set(args) >= WRITTEN_ARGS, (sorted(WRITTEN_ARGS - set(args)), args)
    assert args[0] == "run", args  # the subcommand stays first

    pod = pod_runner.PodmanPod(plane, OUR_NAMESPACE, OUR_DEPLOYMENT, tmp_path / "pod",
                               port_map={port: cp.free_port() for port in OPERATOR_PORTS},
                               name=f"pod-{tmp_path.name}-{OUR_DEPLOYMENT}")
    try:
        pod.start()
        pod.wait_ready()
        op.deployment_available(plane, OUR_NAMESPACE, OUR_DEPLOYMENT)
        wait_for("the InfrastructureProvider Ready",
                 lambda: ready(plane, "InfrastructureProvider", OUR_NAMESPACE, "libvirt"), INSTALL_TIMEOUT_S, 2.0)
        lease = wait_for("our manager leading through the Lease the operator named", lambda: plane.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{OUR_NAMESPACE}/leases/{LEASE}"), 120)
        assert lease["spec"]["leaseDurationSeconds"] == 20, lease["spec"]
        assert SETTINGS_LOGGED in pod.logs(), pod.logs()[-4000:]
        print(f"\n[operator] InfrastructureProvider libvirt installed by the operator, its manager ready and "
              f"leading after {time.monotonic() - started:.1f}s")

        access, volume = ssh_host
        host = access.host
        create_objects(plane, NAMES, access, ipxe_image.machine_spec(host.pool_name, host.network_name, volume),
                       "#cloud-config\n")
        machine = provisioned_machine(plane, NAMES, pod, host)
        print(f"[operator] a Machine of the MachineDeployment provisioned after "
              f"{time.monotonic() - started:.1f}s")
        scaled_to_zero_leaves_nothing(plane, NAMES, host, machine)
        delete_everything(plane, NAMES)
        logs = pod.logs()
        assert pod.terminate() == 0, f"SIGTERM: the manager did not exit cleanly:\n{pod.logs()[-4000:]}"
        assert "role: leader" in logs
    finally:
        pod.stop()

