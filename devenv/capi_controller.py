"""The real Cluster API controller managers, run out of cluster against a LocalControlPlane: the core provider, the
kubeadm bootstrap provider (CABPK) and the kubeadm control-plane provider (KCP), all built from the same Cluster API
module.

Each is installed the way clusterctl installs it (the module's config/default, or bootstrap/kubeadm/config/default),
webhooks on, with these differences: the manager is a child process (hack/build-upstream.sh builds it), authenticated as the control plane's
admin; the API server reaches its webhook server by URL, https://127.0.0.1:<port>, instead of through a Service; the
serving certificate is issued by a CA made here (openssl), where cert-manager would issue and inject one.

start() installs the provider's CRDs where the API server does not have them yet (the kubeadm bootstrap provider's), adds
its Mutating/ValidatingWebhookConfigurations (config/webhook/manifests.yaml, named and labelled as kustomize names them)
and the conversion webhook of every CRD config/crd/patches enables; stop() removes the webhooks and restores each CRD's
conversion and the annotation CAPI's CRD migrator writes on it, so a shared API server is left with the CRDs as it had
them. What the controllers did to Cluster API objects (finalizers, owner references,
status) stays: delete the objects while the controller still runs.

Installed by clusterctl (`installed_by_clusterctl=True`, devenv/clusterctl_init.py): the API server already has what
`clusterctl init` created (CRDs, webhook configurations and conversions by Service, the CA injected by cert-manager's
cainjector, the ServiceAccount and RBAC), so nothing is installed or patched here. The manager runs as its Deployment
says: the Deployment's args (but addresses, ports and leader election, which are this process's), logged in as the
Deployment's ServiceAccount, serving the certificate cert-manager issued into the Secret its Certificate names, on the
port the Service's EndpointSlice names (devenv/service_address.py).

Only one of each provider may run per API server at a time (the webhook configurations have fixed names), and it
reconciles every object of its kinds in every namespace, as a real installation does.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import pathlib
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from devenv import paths
from devenv.control_plane import ControlPlaneError, LocalControlPlane, free_port
from devenv.remote_access import issue_certificate, make_ca

log = logging.getLogger(__name__)

ADDRESS = "127.0.0.1"
NAME_PREFIX = "capi-"  # the core provider's kustomize namePrefix in config/default
MIGRATION_ANNOTATION = "crd-migration.cluster.x-k8s.io/observed-generation"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WEBHOOK_COLLECTIONS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}
PROBE_VERSION = "1.35.0"  # the Machine webhook prefixes a "v": the probe's proof of a webhook round trip
PROBE_NAME = "capi-controller-probe"
# Flags the test bed sets itself in place of the Deployment's (addresses, ports, files, leader election).
OWN_FLAGS = ("kubeconfig", "leader-elect", "webhook-port", "webhook-cert-dir", "health-addr", "diagnostics-address",
             "metrics-bind-addr")


class CapiControllerError(RuntimeError):
    """The manager could not be started, or did not become ready; the message ends with the tail of its log."""


def module_dir() -> pathlib.Path:
    """The Cluster API module's source, which hack/build-upstream.sh links into the cache."""
    return paths.cache_dir() / f"cluster-api-{paths.CLUSTER_API_VERSION}"


@dataclasses.dataclass(frozen=True)
class Provider:
    """What differs between the Cluster API managers: their binary, where their config is in the module, the names
    kustomize gives their objects, their feature gates, and how a webhook round trip is proven."""

    name: str
    binary: Callable[[], pathlib.Path]
    config: str  # the provider's config folder, relative to the module
    name_prefix: str  # kustomize's namePrefix in its config/default
    label: str  # cluster.x-k8s.io/provider
    feature_gates: Mapping[str, bool]
    probe: Callable[[LocalControlPlane], None]
    install_crds: bool  # the test API server starts with the core provider's CRDs only

    @property
    def config_dir(self) -> pathlib.Path:
        return module_dir() / self.config

    # What clusterctl installs of the provider, named by kustomize's namePrefix.
    @property
    def namespace(self) -> str:
        return f"{self.name_prefix}system"

    @property
    def deployment(self) -> str:
        return f"{self.name_prefix}controller-manager"

    @property
    def webhook_service(self) -> str:
        return f"{self.name_prefix}webhook-service"

    @property
    def certificate_secret(self) -> str:
        """The Secret cert-manager writes for the provider's Certificate (its webhook serving certificate)."""
        return f"{self.webhook_service}-cert"


def probe_core(plane: LocalControlPlane) -> None:
    """A dry-run create of a v1beta1 Machine: converted by /convert, defaulted by the Machine webhook."""
    created = plane.request("POST", "/apis/cluster.x-k8s.io/v1beta1/namespaces/default/machines?dryRun=All",
                            probe_machine())
    if created["spec"].get("version") != f"v{PROBE_VERSION}":
        raise CapiControllerError(f"the probe Machine was not defaulted: {created['spec']}")


def probe_kubeadm_bootstrap(plane: LocalControlPlane) -> None:
    """A dry-run create of a v1beta1 KubeadmConfig: converted by /convert (v1beta2 is stored), validated by the
    KubeadmConfig webhook; both are called with failurePolicy Fail, so an answer proves the round trip."""
    plane.request("POST", "/apis/bootstrap.cluster.x-k8s.io/v1beta1/namespaces/default/kubeadmconfigs?dryRun=All", {
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta1", "kind": "KubeadmConfig",
        "metadata": {"name": PROBE_NAME, "namespace": "default"},
        "spec": {"format": "cloud-config", "joinConfiguration": {"nodeRegistration": {"name": PROBE_NAME}}},
    })


def probe_kubeadm_control_plane(plane: LocalControlPlane) -> None:
    """A dry-run create of a v1beta1 KubeadmControlPlane: converted by /convert (v1beta2 is stored), defaulted and
    validated by the KubeadmControlPlane webhooks (failurePolicy Fail), so an answer proves the round trip; the
    default rollout strategy proves the defaulting one."""
    created = plane.request(
        "POST", "/apis/controlplane.cluster.x-k8s.io/v1beta1/namespaces/default/kubeadmcontrolplanes?dryRun=All", {
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane",
            "metadata": {"name": PROBE_NAME, "namespace": "default"},
            "spec": {"version": f"v{PROBE_VERSION}", "kubeadmConfigSpec": {"format": "cloud-config"},
                     "machineTemplate": {"infrastructureRef": {
                         "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtMachineTemplate",
                         "name": PROBE_NAME}}},
        })
    if not created["spec"].get("rolloutStrategy"):
        raise CapiControllerError(f"the probe KubeadmControlPlane was not defaulted: {created['spec']}")


CORE = Provider(name="cluster-api-manager", binary=paths.cluster_api_manager_binary, config="config",
                name_prefix=NAME_PREFIX, label="cluster-api",
                feature_gates={"ClusterTopology": True, "MachinePool": True}, probe=probe_core, install_crds=False)
KUBEADM_BOOTSTRAP = Provider(name="kubeadm-bootstrap-manager", binary=paths.kubeadm_bootstrap_manager_binary,
                             config="bootstrap/kubeadm/config", name_prefix="capi-kubeadm-bootstrap-",
                             label="bootstrap-kubeadm", feature_gates={"MachinePool": True},
                             probe=probe_kubeadm_bootstrap, install_crds=True)
KUBEADM_CONTROL_PLANE = Provider(name="kubeadm-control-plane-manager",
                                 binary=paths.kubeadm_control_plane_manager_binary,
                                 config="controlplane/kubeadm/config", name_prefix="capi-kubeadm-control-plane-",
                                 label="control-plane-kubeadm", feature_gates={"ClusterTopology": True},
                                 probe=probe_kubeadm_control_plane, install_crds=True)


def provider_crds(provider: Provider) -> list[dict]:
    """The provider's CRDs as its config/crd kustomization makes them: its resources with its labels (the contract
    versions Cluster API reads) and the provider label config/default adds."""
    crd_dir = provider.config_dir / "crd"
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    labels = {"cluster.x-k8s.io/provider": provider.label}
    for entry in kustomization.get("labels", []):
        labels.update(entry.get("pairs", {}))
    crds = [yaml.safe_load((crd_dir / resource).read_text()) for resource in kustomization["resources"]]
    for crd in crds:
        crd["metadata"]["labels"] = {**crd["metadata"].get("labels", {}), **labels}
    return crds


def conversion_crd_names(config_dir: pathlib.Path) -> list[str]:
    """The CRDs whose conversion webhook a provider enables (its config/crd/patches/webhook_in_*.yaml)."""
    patches = sorted((config_dir / "crd" / "patches").glob("webhook_in_*.yaml"))
    return [yaml.safe_load(patch.read_text())["metadata"]["name"] for patch in patches]


def webhook_configurations(provider: Provider, base_url: str, ca_bundle: str) -> list[dict]:
    """A provider's webhook configurations, each webhook's Service replaced by `base_url` + its path, with
    `ca_bundle`."""
    configurations = []
    manifests = provider.config_dir / "webhook" / "manifests.yaml"
    for document in yaml.safe_load_all(manifests.read_text()):
        if not document or document.get("kind") not in WEBHOOK_COLLECTIONS:
            continue
        metadata = {"name": provider.name_prefix + document["metadata"]["name"],
                    "labels": {"cluster.x-k8s.io/provider": provider.label}}
        webhooks = [{**webhook, "clientConfig": {"url": base_url + webhook["clientConfig"]["service"]["path"],
                                                 "caBundle": ca_bundle}}
                    for webhook in document["webhooks"]]
        configurations.append({**document, "metadata": metadata, "webhooks": webhooks})
    return configurations


def conversion_patch(base_url: str, ca_bundle: str) -> dict:
    """A merge patch: the CRD's conversion by the manager's /convert, as config/crd/patches sets it."""
    return {"spec": {"conversion": {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1", "v1beta1"],
        "clientConfig": {"url": f"{base_url}/convert", "caBundle": ca_bundle},
    }}}}


def restore_patch(original: dict) -> dict:
    """A merge patch putting back a CRD's conversion and the CRD migrator's annotation as `original` had them."""
    conversion = original["spec"].get("conversion", {"strategy": "None"})
    annotation = original["metadata"].get("annotations", {}).get(MIGRATION_ANNOTATION)
    return {"metadata": {"annotations": {MIGRATION_ANNOTATION: annotation}},
            "spec": {"conversion": {"webhook": None, **conversion}}}


def probe_machine() -> dict:
    """A v1beta1 Machine for a dry-run create: converted to v1beta2 and back, defaulted by the mutating webhook."""
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": {"name": PROBE_NAME, "namespace": "default"},
        "spec": {
            "clusterName": PROBE_NAME,
            "version": PROBE_VERSION,
            "bootstrap": {"dataSecretName": PROBE_NAME},
            "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtMachine",
                                  "name": PROBE_NAME},
        },
    }


class CapiController:
    """A Cluster API provider's manager (the core one unless told otherwise) as a child process, with its webhooks
    installed; a context manager like LocalControlPlane. `start()` returns when its readyz answers and a webhook
    round trip works."""

    def __init__(self, plane: LocalControlPlane, *, provider: Provider = CORE,
                 feature_gates: Mapping[str, bool] | None = None, extra_args: tuple[str, ...] = (),
                 timeout: float = 180.0, installed_by_clusterctl: bool = False,
                 webhook_port: int | None = None) -> None:
        """`installed_by_clusterctl`: run from what clusterctl installed (see the module's docstring); `webhook_port`:
        the port the webhook Service's EndpointSlice names then."""
        self.plane = plane
        self.installed_by_clusterctl = installed_by_clusterctl
        self.deployment_args: list[str] = []  # the Deployment's container args, when installed by clusterctl
        self.provider = provider
        self.feature_gates = dict(provider.feature_gates if feature_gates is None else feature_gates)
        self.extra_args = list(extra_args)
        self.timeout = timeout
        self.workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"{provider.name}-", dir=plane.workdir))
        self.webhook_port = webhook_port or free_port()
        self.health_port = free_port()
        self.diagnostics_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._webhooks: list[tuple[str, str]] = []  # (collection, name) created by start()
        self._crds: dict[str, dict] = {}  # name -> the CRD as it was before start() patched it

    @property
    def base_url(self) -> str:
        return f"https://{ADDRESS}:{self.webhook_port}"

    @property
    def cert_dir(self) -> pathlib.Path:
        return self.workdir / "certs"

    @property
    def log_path(self) -> pathlib.Path:
        return self.workdir / f"{self.provider.name}.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def kubeconfig(self) -> pathlib.Path:
        """The admin's, or the Deployment's ServiceAccount's when installed by clusterctl."""
        return self.workdir / "kubeconfig" if self.installed_by_clusterctl else self.plane.kubeconfig_path

    def argv(self) -> list[str]:
        gates = ",".join(f"{gate}={str(enabled).lower()}" for gate, enabled in sorted(self.feature_gates.items()))
        if self.installed_by_clusterctl:
            theirs = [arg for arg in self.deployment_args
                      if arg.lstrip("-").split("=", 1)[0] not in OWN_FLAGS]
            return [str(self.provider.binary()), *theirs, *self._own_flags(), *self.extra_args]
        return [str(self.provider.binary()), *self._own_flags(), f"--feature-gates={gates}", *self.extra_args]

    def _own_flags(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-cert-dir={self.cert_dir}",
            f"--health-addr={ADDRESS}:{self.health_port}",
            f"--diagnostics-address={ADDRESS}:{self.diagnostics_port}",
        ]

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> CapiController:
        binary = self.provider.binary()
        if not binary.exists():
            raise CapiControllerError(f"{binary} is missing: run `make upstream` (hack/build-upstream.sh)")
        started = time.monotonic()
        try:
            if self.installed_by_clusterctl:
                self._run_as_installed()
            elif self.provider.install_crds:
                self.plane.install_crd_documents(provider_crds(self.provider))
            if not self.installed_by_clusterctl:
                ca_bundle = self._write_certificates()
                self._install_webhooks(ca_bundle)
                self._patch_crds(ca_bundle)
            self._spawn()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("%s ready in %.1fs (pid %d)", self.provider.name, time.monotonic() - started, self.pid)
        return self

    def stop(self) -> None:
        """Webhook configurations out first (nothing calls a stopping server), the manager next (its CRD migrator
        would annotate the CRDs again), the CRDs' conversion and annotation last. The manager is stopped even when
        the API server no longer answers."""
        try:
            self._remove_webhooks()
        finally:
            self._terminate()
            self._restore_crds()

    def __enter__(self) -> CapiController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- certificates and API server configuration -----------------------------------------------------------------

    def _run_as_installed(self) -> None:
        """What a kubelet would give the Deployment's pod: its args, its ServiceAccount's token, the Secret cert-manager
        issued mounted as the certificate folder."""
        provider = self.provider
        deployment = self._wait_for(f"/apis/apps/v1/namespaces/{provider.namespace}/deployments/{provider.deployment}")
        pod = deployment["spec"]["template"]["spec"]
        [container] = [c for c in pod["containers"] if c["name"] == "manager"]
        self.deployment_args = list(container.get("args") or [])
        self.plane.service_account_kubeconfig(provider.namespace, pod.get("serviceAccountName", "default"),
                                              self.kubeconfig)
        secret = self._wait_for(f"/api/v1/namespaces/{provider.namespace}/secrets/{provider.certificate_secret}")
        self.cert_dir.mkdir(mode=0o700)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            (self.cert_dir / key).write_bytes(base64.b64decode(secret["data"][key]))

    def _wait_for(self, path: str) -> dict:
        """The object at `path`, once it exists (cert-manager issues the Secret a few seconds after the install)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self.plane.request("GET", path)
            except ControlPlaneError as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise CapiControllerError(f"{self.provider.name}: {path} not found after {self.timeout:.0f}s: "
                                              "was it installed by clusterctl, and does cert-manager run?") from None
            time.sleep(0.5)

    def _write_certificates(self) -> str:
        """A CA and a serving certificate for 127.0.0.1 (tls.crt, tls.key: the manager's default names); the CA's
        PEM, base64-encoded, is the caBundle."""
        self.cert_dir.mkdir(mode=0o700)
        ca_key, ca_cert = self.cert_dir / "ca.key", self.cert_dir / "ca.crt"
        make_ca(ca_key, ca_cert, f"capi-libvirt {self.provider.name} webhooks")
        issue_certificate(ca_cert, ca_key, self.cert_dir / "tls.key", self.cert_dir / "tls.crt",
                          f"CN={ADDRESS},O=capi-libvirt", ip=ADDRESS)
        return base64.b64encode(ca_cert.read_bytes()).decode()

    def _install_webhooks(self, ca_bundle: str) -> None:
        for configuration in webhook_configurations(self.provider, self.base_url, ca_bundle):
            collection = WEBHOOK_COLLECTIONS[configuration["kind"]]
            self.plane.apply(collection, configuration)
            self._webhooks.append((collection, configuration["metadata"]["name"]))
        log.info("installed %d webhook configurations for %s", len(self._webhooks), self.base_url)

    def _patch_crds(self, ca_bundle: str) -> None:
        patch = conversion_patch(self.base_url, ca_bundle)
        for name in conversion_crd_names(self.provider.config_dir):
            try:
                original = self.plane.request("GET", f"{CRDS}/{name}")
            except ControlPlaneError as error:
                if error.status != 404:
                    raise
                log.warning("CRD %s is not installed: no conversion webhook for it", name)
                continue
            self._crds[name] = original
            self._merge_patch(f"{CRDS}/{name}", patch)
        log.info("conversion webhook set on %d CRDs", len(self._crds))

    def _remove_webhooks(self) -> None:
        if self._webhooks:
            log.info("removing %d webhook configurations", len(self._webhooks))
        while self._webhooks:
            collection, name = self._webhooks.pop()
            try:
                self.plane.request("DELETE", f"{collection}/{name}")
            except ControlPlaneError as error:
                if error.status != 404:
                    raise

    def _restore_crds(self) -> None:
        restored = 0
        while self._crds:
            name, original = self._crds.popitem()
            self._merge_patch(f"{CRDS}/{name}", restore_patch(original))
            restored += 1
        if restored:
            log.info("conversion and CRD-migrator annotation of %d CRDs restored", restored)

    def _merge_patch(self, path: str, patch: dict) -> Any:
        return self.plane.request("PATCH", path, patch, content_type="application/merge-patch+json")

    # -- the process -------------------------------------------------------------------------------------------------

    def _spawn(self) -> None:
        env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}  # --kubeconfig says which
        with open(self.log_path, "wb") as logfile:
            self._process = subprocess.Popen(self.argv(), stdout=logfile, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        log.info("started %s (pid %d), log %s", self.provider.name, self._process.pid, self.log_path)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.info("stopped %s (pid %d, exit %s)", self.provider.name, process.pid, process.returncode)

    def _wait_ready(self) -> None:
        """readyz (the webhook server serves), then a webhook round trip through the API server."""
        process = self._process
        if process is None:
            raise CapiControllerError(f"{self.provider.name} is not started")
        deadline = time.monotonic() + self.timeout
        last_error = "not started"
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise self._failure(f"{self.provider.name} exited with {process.returncode}")
            try:
                self._check_readyz()
                self.provider.probe(self.plane)
                return
            except (OSError, ControlPlaneError, CapiControllerError) as error:
                last_error = str(error)
            time.sleep(0.5)
        raise self._failure(f"{self.provider.name} not ready after {self.timeout:.0f}s: {last_error}")

    def _check_readyz(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
        try:
            with opener.open(f"http://{ADDRESS}:{self.health_port}/readyz", timeout=5) as response:
                response.read()
        except urllib.error.HTTPError as error:
            raise CapiControllerError(f"readyz: {error.code}") from None

    def _failure(self, message: str) -> CapiControllerError:
        try:
            tail = self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            tail = "(no log)"
        return CapiControllerError(f"{message}; log {self.log_path}:\n{tail}")
