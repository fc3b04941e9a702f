"""The Cluster API Operator (sigs.k8s.io/cluster-api-operator) installing providers on a LocalControlPlane, the way a
platform team installs them declaratively: a CoreProvider and an InfrastructureProvider object, their components read
from ConfigMaps (`spec.fetchConfig.selector`, the operator's offline source; nothing here reaches GitHub).

CapiOperator runs the operator's manager, built from its module by hack/build-upstream.sh, against the API server:
its CRDs (the module's config/crd/bases, v1alpha2) installed first; its webhook server serving a self-signed
certificate nobody calls (the operator cannot run without one; its defaulting and validating webhook configurations
are not installed, so objects made here set what the defaulting webhook would: `configSecret.namespace` is never
needed, as no provider here takes variables without defaults). It runs with the admin's kubeconfig rather than its
own ServiceAccount (its RBAC comes with its Helm chart, which is not served here).

provider_config_map() is the ConfigMap a release's `metadata.yaml` and components become (gzipped: Cluster API's
core components are larger than a ConfigMap may hold). deployment_available() writes what the Deployment controller
would write once the kubelet reports the pod Ready: no kubelet runs pods here (devenv/pod_runner.py says why), and the
operator's health check reads a provider's readiness from its Deployment's Available condition.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import logging
import pathlib
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import yaml

from devenv import capi_controller as capi
from devenv import paths
from devenv.control_plane import ControlPlaneError, LocalControlPlane, free_port
from devenv.remote_access import issue_certificate, make_ca

log = logging.getLogger(__name__)

API = "/apis/operator.cluster.x-k8s.io/v1alpha2"
NAME_LABEL = "provider.cluster.x-k8s.io/name"
VERSION_LABEL = "provider.cluster.x-k8s.io/version"  # the operator reads the version from it
COMPRESSED = "provider.cluster.x-k8s.io/compressed"
READY_TIMEOUT_S = 120.0


class CapiOperatorError(RuntimeError):
    """The operator could not be started, or exited; the message ends with its log."""


def crd_documents() -> list[dict[str, Any]]:
    """The operator's CRDs as its module ships them (config/crd/bases; hack/build-upstream.sh links the module)."""
    folder = paths.cluster_api_operator_module_dir() / "config" / "crd" / "bases"
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise CapiOperatorError(f"no CRDs in {folder}: run `make upstream` (hack/build-upstream.sh)")
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def probe_core_alone(plane: LocalControlPlane) -> None:
    """A dry-run create of a v1beta1 Cluster that refers to nothing, which the Cluster validating webhook must refuse
    (failurePolicy Fail: the refusal is the webhook's own answer, after /convert took it to v1beta2).
    capi_controller.probe_core's Machine names a LibvirtMachine, and a Cluster that names anything is converted back
    through that kind's CRD, which the operator installs only once the core provider is Ready."""
    try:
        plane.request("POST", "/apis/cluster.x-k8s.io/v1beta1/namespaces/default/clusters?dryRun=All", {
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": capi.PROBE_NAME, "namespace": "default"}, "spec": {}})
    except ControlPlaneError as error:
        if error.status == 422 and "validation.cluster.cluster.x-k8s.io" in str(error):
            return
        raise
    raise capi.CapiControllerError("the Cluster webhook admitted a Cluster that refers to nothing")


# Cluster API's core manager as the operator installed it, proven ready before any infrastructure provider is there.
CORE = dataclasses.replace(capi.CORE, probe=probe_core_alone)


def provider_config_map(namespace: str, name: str, version: str, metadata: str, components: str) -> dict[str, Any]:
    """The ConfigMap an operator's provider object selects by NAME_LABEL and VERSION_LABEL: `metadata` as text,
    `components` gzipped in binaryData (the operator's compressed form)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{name}-{version}", "namespace": namespace,
                         "labels": {NAME_LABEL: name, VERSION_LABEL: version}, "annotations": {COMPRESSED: "true"}},
            "data": {"metadata": metadata},
            "binaryData": {"components": base64.b64encode(gzip.compress(components.encode())).decode()}}


def provider_object(kind: str, namespace: str, name: str, version: str, **spec: Any) -> dict[str, Any]:
    """A CoreProvider, InfrastructureProvider, ... installing `version` from the ConfigMap provider_config_map made."""
    return {"apiVersion": "operator.cluster.x-k8s.io/v1alpha2", "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"version": version,
                     "fetchConfig": {"selector": {"matchLabels": {NAME_LABEL: name, VERSION_LABEL: version}}},
                     **spec}}


def collection(kind: str, namespace: str) -> str:
    """The API path of a provider kind's objects in `namespace` (CoreProvider -> .../coreproviders)."""
    return f"{API}/namespaces/{namespace}/{kind.lower()}s"


def deployment_available(plane: LocalControlPlane, namespace: str, name: str) -> None:
    """The Deployment's status as its controller writes it once its one pod is Ready (see the module's docstring)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
    deployment = plane.request("GET", path)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    replicas = deployment["spec"].get("replicas", 1)
    plane.request("PATCH", f"{path}/status", {"status": {
        "observedGeneration": deployment["metadata"]["generation"], "replicas": replicas,
        "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                        "message": "Deployment has minimum availability.", "lastUpdateTime": now,
                        "lastTransitionTime": now}]}}, content_type="application/merge-patch+json")


class CapiOperator:
    """The operator's manager as a child process; a context manager."""

    def __init__(self, plane: LocalControlPlane, workdir: pathlib.Path) -> None:
        self.plane = plane
        self.workdir = workdir
        self.health_port = free_port()
        self.webhook_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> pathlib.Path:
        return self.workdir / "cluster-api-operator.log"

    def argv(self) -> list[str]:
        return [str(paths.cluster_api_operator_binary()), f"--kubeconfig={self.plane.kubeconfig_path}",
                "--leader-elect=false", f"--health-addr=127.0.0.1:{self.health_port}",
                "--diagnostics-address=127.0.0.1:0", "--insecure-diagnostics", "--profiler-address=",
                f"--webhook-port={self.webhook_port}", f"--webhook-cert-dir={self.workdir / 'certs'}", "--v=2"]

    def start(self) -> CapiOperator:
        binary = paths.cluster_api_operator_binary()
        if not binary.exists():
            raise CapiOperatorError(f"{binary} is missing: run `make upstream` (hack/build-upstream.sh)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.plane.install_crd_documents(crd_documents())
            self._write_certificate()
            with open(self.log_path, "wb") as output:
                self._process = subprocess.Popen(self.argv(), stdout=output, stderr=subprocess.STDOUT,
                                                 start_new_session=True)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_certificate(self) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(mode=0o700, exist_ok=True)
        make_ca(certs / "ca.key", certs / "ca.crt", "capi-libvirt test bed: cluster-api-operator webhooks")
        issue_certificate(certs / "ca.crt", certs / "ca.key", certs / "tls.key", certs / "tls.crt",
                          "CN=127.0.0.1,O=capi-libvirt", ip="127.0.0.1")

    def _wait_ready(self) -> None:
        deadline, last = time.monotonic() + READY_TIMEOUT_S, "no answer"
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=5) as response:
                    if response.status == 200:
                        log.info("cluster-api-operator ready (pid %d)", self.pid)
                        return
            except urllib.error.HTTPError as error:
                last = f"HTTP {error.code}"
            except OSError as error:
                last = str(error)
            time.sleep(0.5)
        raise CapiOperatorError(f"cluster-api-operator not ready after {READY_TIMEOUT_S:.0f}s ({last}):\n"
                                f"{self.log()[-4000:]}")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise CapiOperatorError(f"cluster-api-operator exited {self._process.returncode}:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self) -> CapiOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
