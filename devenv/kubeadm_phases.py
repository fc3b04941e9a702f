"""The test API server made and prepared the way `kubeadm init` makes a control plane, by kubeadm's own phases.

- Certificates: `kubeadm init phase certs ca|apiserver|sa` make the cluster CA (the API server's client CA, the key
  kube-controller-manager signs kubelet certificates with), the API server's serving certificate (loopback, the
  in-cluster names, and the addresses guests reach it at through API gateways) and the service-account key pair.
- Joins: `kubeadm init phase upload-config kubeadm|kubelet` and `kubeadm init phase bootstrap-token` upload the
  ClusterConfiguration and the kubelet configuration that `kubeadm join` reads, create a bootstrap token, the
  `cluster-info` ConfigMap in kube-public, and the RBAC that lets bootstrap tokens read those, get Nodes, post CSRs
  and have them approved (by kube-controller-manager's csrapproving controller).

One thing differs from a kubeadm cluster: kubeadm writes into cluster-info the server of the kubeconfig it runs with,
here the loopback address; joining nodes use that server for their TLS bootstrap, and guests reach the API server
only through an API gateway, so accept_joins() then names the gateway's URL there (kube-controller-manager's
bootstrap signer re-signs the changed ConfigMap for every token).
"""

from __future__ import annotations

import logging
import pathlib
import subprocess
from collections.abc import Iterable

import yaml

from devenv import paths

log = logging.getLogger(__name__)

KUBEADM_API = "kubeadm.k8s.io/v1beta4"
NODE_NAME = "local-control-plane"  # kubeadm's configuration needs a node name; no such node joins
CLUSTER_NAME = "capi-libvirt-local"
CRI_SOCKET = "unix:///run/containerd/containerd.sock"  # kubeadm's default; named so kubeadm detects nothing here
CLUSTER_INFO = "/api/v1/namespaces/kube-public/configmaps/cluster-info"
UNROUTED_ADDRESS = "192.0.2.1"  # TEST-NET-1 (RFC 5737)


class KubeadmPhaseError(RuntimeError):
    """A kubeadm phase failed; the message has its output."""


def kubeadm_configuration(cert_dir: pathlib.Path | None, port: int, service_subnet: str,
                          serving_addresses: Iterable[str] = ()) -> list[dict]:
    """The InitConfiguration and ClusterConfiguration the phases read: the API server on 127.0.0.1:`port`, its
    certificate also valid for `serving_addresses`.

    `cert_dir`: where the certs phases write; None for the configuration uploaded for joining nodes, which keeps
    kubeadm's default (/etc/kubernetes/pki, where `kubeadm join` puts the CA: the kubelet configuration derived
    from it names the CA file there).

    kubeadm takes a loopback advertise address as "pick a global address of lo", which there is none of, so the
    first serving address is advertised (it only goes into the certificate; the API server itself advertises
    127.0.0.1), or, with none, an address of the documentation range that nothing routes."""
    serving_addresses = list(serving_addresses)
    return [
        {"apiVersion": KUBEADM_API, "kind": "InitConfiguration",
         "localAPIEndpoint": {"advertiseAddress": (serving_addresses or [UNROUTED_ADDRESS])[0], "bindPort": port},
         "nodeRegistration": {"name": NODE_NAME, "criSocket": CRI_SOCKET}},
        {"apiVersion": KUBEADM_API, "kind": "ClusterConfiguration",
         "clusterName": CLUSTER_NAME,
         "kubernetesVersion": paths.KUBERNETES_VERSION,
         **({"certificatesDir": str(cert_dir)} if cert_dir is not None else {}),
         "networking": {"serviceSubnet": service_subnet, "dnsDomain": "cluster.local"},
         "apiServer": {"certSANs": ["127.0.0.1", *serving_addresses]}},
    ]


def write_configuration(path: pathlib.Path, documents: list[dict]) -> pathlib.Path:
    path.write_text(yaml.safe_dump_all(documents))
    path.chmod(0o600)
    return path


def run_phase(*args: str) -> str:
    """`kubeadm init phase ARGS...`; its output, or KubeadmPhaseError with it."""
    binary = paths.kubeadm_binary()
    if not binary.exists():
        raise KubeadmPhaseError(f"{binary} is missing: run `make upstream` (hack/build-upstream.sh)")
    result = subprocess.run([str(binary), "init", "phase", *args], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=120)
    if result.returncode != 0:
        raise KubeadmPhaseError(f"kubeadm init phase {' '.join(args)} failed ({result.returncode}):\n"
                                f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def make_certificates(config: pathlib.Path) -> None:
    """The cluster CA, the API server's serving certificate and the service-account keys, into the configuration's
    certificatesDir (ca.crt/key, apiserver.crt/key, sa.key/pub)."""
    for certificate in ("ca", "apiserver"):
        run_phase("certs", certificate, f"--config={config}")
    run_phase("certs", "sa", f"--config={config}")


def prepare_for_joins(config: pathlib.Path, kubeconfig: pathlib.Path) -> None:
    """What `kubeadm init` leaves for joining nodes: its configuration (`config`, made with no cert_dir), the
    kubelet's, a bootstrap token, cluster-info and the bootstrap RBAC. Re-running it is harmless (kubeadm creates
    or updates)."""
    for phase in (("upload-config", "kubeadm"), ("upload-config", "kubelet"), ("bootstrap-token",)):
        run_phase(*phase, f"--config={config}", f"--kubeconfig={kubeconfig}",
                  *(["--skip-token-print"] if phase == ("bootstrap-token",) else []))
    log.info("the API server accepts kubeadm joins (kubeadm init phase upload-config, bootstrap-token)")


def with_server(cluster_info_kubeconfig: str, server: str) -> str:
    """cluster-info's kubeconfig with every cluster's server set to `server` (its CA kept)."""
    kubeconfig = yaml.safe_load(cluster_info_kubeconfig)
    for cluster in kubeconfig["clusters"]:
        cluster["cluster"]["server"] = server
    return yaml.safe_dump(kubeconfig)
