"""cert-manager as three local processes, run as the Deployments `clusterctl init` installed from cert-manager.yaml say.

The programs are thin mains over cert-manager's own packages (hack/cert-manager, built by hack/build-upstream.sh):
- `webhook` serves cert-manager's admission webhooks on the port the EndpointSlice of the Service
  `cert-manager/cert-manager-webhook` names (devenv/service_address.py), with the dynamic serving CA and DNS names of
  its Deployment's args, in a WebhookConfiguration file;
- `cainjector` copies CAs into webhook configurations and CRD conversions (`cert-manager.io/inject-ca-from*`);
- `controller` runs the issuers and the certificates controllers (CA and self-signed issuers; no ACME, Vault, Venafi).

Each logs in as its Deployment's ServiceAccount (a TokenRequest token, as a kubelet mounts it), so cert-manager's own
RBAC from cert-manager.yaml is what lets it work. What differs from pods: no leader election, health and metrics on
loopback ports, and the processes start when the caller says (once cert-manager's CRDs are established, as its pods
would only start after clusterctl created them).
"""

from __future__ import annotations

import logging
import pathlib
import time
from typing import Any

import yaml

from devenv import paths
from devenv.autoscaling import UpstreamProcess
from devenv.control_plane import ControlPlaneError, LocalControlPlane, free_port

log = logging.getLogger(__name__)

NAMESPACE = "cert-manager"
WEBHOOK_SERVICE = "cert-manager-webhook"
DEPLOYMENTS = {"webhook": "cert-manager-webhook", "cainjector": "cert-manager-cainjector", "controller": "cert-manager"}


class CertManagerProcess(UpstreamProcess):
    def __init__(self, workdir: pathlib.Path, component: str, argv: list[str]) -> None:
        super().__init__(workdir)
        self.component = component
        self.name = f"cert-manager-{component}"
        self._argv = argv

    def binary(self) -> pathlib.Path:
        return paths.cert_manager_binary(self.component)

    def argv(self) -> list[str]:
        return self._argv


def container_args(deployment: dict) -> list[str]:
    """The container's args with the `$(POD_NAMESPACE)` references the kubelet would expand, expanded."""
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    namespace = deployment["metadata"]["namespace"]
    return [arg.replace("$(POD_NAMESPACE)", namespace) for arg in container.get("args") or []]


def flag_values(args: list[str], flag: str) -> list[str]:
    return [arg.split("=", 1)[1] for arg in args if arg.startswith(f"--{flag}=")]


def webhook_configuration(args: list[str], secure_port: int) -> dict[str, Any]:
    """The webhook Deployment's flags as a WebhookConfiguration (the thin main reads a config file), the port ours."""
    [secret_namespace] = flag_values(args, "dynamic-serving-ca-secret-namespace")
    [secret_name] = flag_values(args, "dynamic-serving-ca-secret-name")
    return {
        "apiVersion": "webhook.config.cert-manager.io/v1alpha1", "kind": "WebhookConfiguration",
        "securePort": secure_port,
        "healthzPort": free_port(),
        "metricsListenAddress": f"127.0.0.1:{free_port()}",
        "tlsConfig": {"dynamic": {"secretNamespace": secret_namespace, "secretName": secret_name,
                                  "dnsNames": flag_values(args, "dynamic-serving-dns-names")}},
    }


class LocalCertManager:
    """cert-manager's webhook, cainjector and controller as child processes; a context manager."""

    def __init__(self, plane: LocalControlPlane, workdir: pathlib.Path, webhook_port: int) -> None:
        """`webhook_port`: where the EndpointSlice of the webhook's Service sends the API server."""
        self.plane = plane
        self.workdir = workdir
        self.webhook_port = webhook_port
        self.processes: list[CertManagerProcess] = []

    def start(self) -> LocalCertManager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for component in ("webhook", "cainjector", "controller"):
                process = self._process(component)
                self.processes.append(process)
                process.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _process(self, component: str) -> CertManagerProcess:
        deployment = self._deployment(DEPLOYMENTS[component])
        args = container_args(deployment)
        account = deployment["spec"]["template"]["spec"].get("serviceAccountName", "default")
        kubeconfig = self.plane.service_account_kubeconfig(NAMESPACE, account, self.workdir / f"{component}.kubeconfig")
        argv = ["--v=2", f"--kubeconfig={kubeconfig}"]
        if component == "webhook":
            config = self.workdir / "webhook-config.yaml"
            config.write_text(yaml.safe_dump(webhook_configuration(args, self.webhook_port)))
            argv.append(f"--config={config}")
        elif component == "cainjector":
            argv.append(f"--health-address=127.0.0.1:{free_port()}")
        else:
            argv += [f"--cluster-resource-namespace={value}"
                     for value in flag_values(args, "cluster-resource-namespace")]
        return CertManagerProcess(self.workdir, component, argv)

    def _deployment(self, name: str) -> dict:
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}"
        for _ in range(120):
            try:
                return self.plane.request("GET", path)
            except ControlPlaneError as error:
                if error.status != 404:
                    raise
            time.sleep(0.5)
        raise ControlPlaneError(f"no Deployment {NAMESPACE}/{name}: has clusterctl installed cert-manager?")

    def check_alive(self) -> None:
        for process in self.processes:
            process.check_alive()

    def stop(self) -> None:
        while self.processes:
            self.processes.pop().stop()

    def __enter__(self) -> LocalCertManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
