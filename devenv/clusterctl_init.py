"""`clusterctl init` against a LocalControlPlane, with the test bed playing the kubelet's part.

clusterctl installs cert-manager and the providers from a local repository (devenv/clusterctl_repository.py) and waits
until cert-manager's webhook answers: it creates a test Issuer and Certificate, which the webhook (failurePolicy Fail,
its CA injected by cainjector) must admit. In a cluster the kubelet would start the Deployments' pods; here:

1. before clusterctl runs, every webhook Service of the components gets an EndpointSlice to a local port on
   ServiceAddress's address (devenv/service_address.py);
2. once clusterctl has established `certificates.cert-manager.io`, cert-manager's webhook, cainjector and controller
   start (devenv/cert_manager.py), as cert-manager's pods would start after their CRDs exist;
3. after clusterctl exits 0, the Cluster API managers start from what it installed, with the certificates cert-manager
   issued (devenv/capi_controller.py, installed_by_clusterctl).

Our own manager is not started here: it is an image, run by the caller with devenv.pod_runner from its Deployment.
stop() ends what start() started and takes the address off `lo`; the API server keeps what clusterctl installed, so
give it one of its own. The kubeadm control-plane manager is not built (hack/build-upstream.sh), so its webhook Service has a slice and no
server; nothing calls it unless a KubeadmControlPlane is made.
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import time
from collections.abc import Iterable

import yaml

from devenv import capi_controller as capi
from devenv import paths
from devenv.cert_manager import NAMESPACE as CERT_MANAGER_NAMESPACE
from devenv.cert_manager import WEBHOOK_SERVICE as CERT_MANAGER_WEBHOOK
from devenv.cert_manager import LocalCertManager
from devenv.clusterctl_repository import Repository
from devenv.control_plane import ControlPlaneError, LocalControlPlane, free_port
from devenv.service_address import ServiceAddress, webhook_services

log = logging.getLogger(__name__)

CERT_MANAGER_CRD = "certificates.cert-manager.io"
INIT_ARGS = ("--core", "cluster-api", "--bootstrap", "kubeadm", "--control-plane", "kubeadm",
             "--infrastructure", "libvirt")
INIT_TIMEOUT_S = 300.0
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ClusterctlError(RuntimeError):
    """clusterctl failed, or what it installed could not be run; the message ends with its output."""


def clusterctl_binary() -> pathlib.Path:
    return paths.bin_dir() / f"clusterctl-{paths.CLUSTER_API_VERSION}"


class ClusterctlInit:
    """`clusterctl init` run and its providers' managers kept running; a context manager. `result` is the finished
    init (returncode 0, its output), `cert_manager` and `managers` what runs since."""

    def __init__(self, plane: LocalControlPlane, repository: Repository, workdir: pathlib.Path, *,
                 providers: Iterable[capi.Provider] = (capi.CORE, capi.KUBEADM_BOOTSTRAP),
                 init_args: Iterable[str] = INIT_ARGS, address: ServiceAddress | None = None) -> None:
        self.plane = plane
        self.repository = repository
        self.workdir = workdir
        self.providers = list(providers)
        self.init_args = list(init_args)
        self.address = address or ServiceAddress()
        self.ports: dict[tuple[str, str], int] = {}  # webhook Service -> local port of its server
        self.result: subprocess.CompletedProcess[str] | None = None
        self.cert_manager: LocalCertManager | None = None
        self.managers: list[capi.CapiController] = []

    # -- clusterctl itself -------------------------------------------------------------------------------------------

    def command(self, *args: str) -> list[str]:
        return [str(clusterctl_binary()), *args, "--config", str(self.repository.config)]

    def environment(self) -> dict[str, str]:
        """Its own HOME (nothing from ~/.config/cluster-api), no version check, the control plane's kubeconfig."""
        home = self.workdir / "clusterctl-home"
        home.mkdir(parents=True, exist_ok=True)
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                "CLUSTERCTL_DISABLE_VERSIONCHECK": "true", "KUBECONFIG": str(self.plane.kubeconfig_path)}

    def clusterctl(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Another clusterctl command against the same API server and repository (`upgrade plan`, ...)."""
        return subprocess.run(self.command(*args), env=self.environment(), capture_output=True, text=True,
                              timeout=timeout)

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    def start(self) -> ClusterctlInit:
        binary = clusterctl_binary()
        if not binary.exists():
            raise ClusterctlError(f"{binary} is missing: run `make upstream` (hack/build-upstream.sh)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.address.start()
            self._point_webhook_services()
            self._init()
            for provider in self.providers:
                service = (provider.namespace, provider.webhook_service)
                manager = capi.CapiController(self.plane, provider=provider, installed_by_clusterctl=True,
                                              webhook_port=self.ports[service])
                self.managers.append(manager)
                manager.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            while self.managers:
                self.managers.pop().stop()
            if self.cert_manager is not None:
                self.cert_manager.stop()
        finally:
            self.address.stop()

    def __enter__(self) -> ClusterctlInit:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _point_webhook_services(self) -> None:
        documents = [d for file in self.repository.components for d in yaml.load_all(file.read_text(), Loader=Loader)]
        for (namespace, service), port_name in webhook_services(documents).items():
            port = self.ports[(namespace, service)] = free_port()
            self.address.point(self.plane, namespace, service, port_name, port)

    def _init(self) -> None:
        """clusterctl init in the background; cert-manager started once its CRD is established; exit 0 required."""
        output = self.workdir / "clusterctl-init.log"
        started = time.monotonic()
        with open(output, "w") as log_file:
            process = subprocess.Popen(self.command("init", *self.init_args, "-v", "3"), env=self.environment(),
                                       stdout=log_file, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            self._wait_established(CERT_MANAGER_CRD, process)
            self.cert_manager = LocalCertManager(self.plane, self.workdir / "cert-manager",
                                                 self.ports[(CERT_MANAGER_NAMESPACE, CERT_MANAGER_WEBHOOK)])
            self.cert_manager.start()
            returncode = process.wait(timeout=max(1.0, INIT_TIMEOUT_S - (time.monotonic() - started)))
        except BaseException:
            if process.poll() is None:
                process.kill()
                process.wait()
            raise
        text = output.read_text(errors="replace")
        self.result = subprocess.CompletedProcess(process.args, returncode, text, "")
        if returncode != 0:
            raise ClusterctlError(f"clusterctl init exited {returncode}:\n{text[-4000:]}")
        log.info("clusterctl init exited 0 after %.1fs", time.monotonic() - started)

    def _wait_established(self, name: str, process: subprocess.Popen, timeout: float = INIT_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ClusterctlError(f"clusterctl exited {process.returncode} before {name} was established")
            try:
                crd = self.plane.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                if any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or []):
                    return
            except ControlPlaneError as error:
                if error.status != 404:
                    raise
            time.sleep(0.3)
        raise ClusterctlError(f"CRD {name} not established after {timeout:.0f}s")


def clusterctl_init(plane: LocalControlPlane, repository: Repository, workdir: pathlib.Path,
                    **options: object) -> ClusterctlInit:
    """`clusterctl init` with everything it needs running; stop() (or `with`) ends what it started."""
    return ClusterctlInit(plane, repository, workdir, **options).start()  # type: ignore[arg-type]
