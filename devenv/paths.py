"""Where the development environment keeps its caches and run-time state, and which upstream versions it uses."""

from __future__ import annotations

import os
import pathlib

# Upstream versions the test bed runs; hack/build-upstream.sh builds the same ones (keep them in step).
KUBERNETES_VERSION = os.environ.get("KUBERNETES_VERSION", "v1.35.4")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "v3.6.6")
CLUSTER_API_VERSION = os.environ.get("CLUSTER_API_VERSION", "v1.12.8")
KUSTOMIZE_VERSION = os.environ.get("KUSTOMIZE_VERSION", "v5.8.1")
# A pseudo-version: the Go module proxy serves no tagged cluster-autoscaler release.
CLUSTER_AUTOSCALER_VERSION = os.environ.get("CLUSTER_AUTOSCALER_VERSION", "v0.0.0-20250613073258-1959f5f61f6c")
# What clusterctl CLUSTER_API_VERSION installs by default; hack/cert-manager/go.mod pins the same.
CERT_MANAGER_VERSION = os.environ.get("CERT_MANAGER_VERSION", "v1.20.2")
CLUSTER_API_OPERATOR_VERSION = os.environ.get("CLUSTER_API_OPERATOR_VERSION", "v0.29.0")


def cache_dir() -> pathlib.Path:
    """The cache outside the work tree: built binaries, the guest image. Survives between runs."""
    default = pathlib.Path.home() / ".cache" / "capi-libvirt"
    return pathlib.Path(os.environ.get("CAPI_LIBVIRT_CACHE", str(default)))


def bin_dir() -> pathlib.Path:
    return cache_dir() / "bin"


def etcd_binary() -> pathlib.Path:
    return bin_dir() / f"etcd-{ETCD_VERSION}"


def kustomize_binary() -> pathlib.Path:
    return bin_dir() / f"kustomize-{KUSTOMIZE_VERSION}"


def kube_apiserver_binary() -> pathlib.Path:
    return bin_dir() / f"kube-apiserver-{KUBERNETES_VERSION}"


def kube_scheduler_binary() -> pathlib.Path:
    return bin_dir() / f"kube-scheduler-{KUBERNETES_VERSION}"


def kube_controller_manager_binary() -> pathlib.Path:
    return bin_dir() / f"kube-controller-manager-{KUBERNETES_VERSION}"


def kubelet_binary() -> pathlib.Path:
    return bin_dir() / f"kubelet-{KUBERNETES_VERSION}"


def kubeadm_binary() -> pathlib.Path:
    return bin_dir() / f"kubeadm-{KUBERNETES_VERSION}"


def kubernetes_module_dir() -> pathlib.Path:
    """The k8s.io/kubernetes module's source (hack/build-upstream.sh links it): the node image's pause.c."""
    return cache_dir() / f"kubernetes-{KUBERNETES_VERSION}"


def cluster_autoscaler_binary() -> pathlib.Path:
    """Named by the commit of its pseudo-version (the part after the last '-') and the backport it carries, as
    hack/build-upstream.sh names it."""
    return bin_dir() / f"cluster-autoscaler-{CLUSTER_AUTOSCALER_VERSION.rsplit('-', 1)[-1]}-setsize0"


def cluster_api_manager_binary() -> pathlib.Path:
    """The Cluster API core controller manager (the module's root main.go), built by hack/build-upstream.sh."""
    return bin_dir() / f"cluster-api-manager-{CLUSTER_API_VERSION}"


def kubeadm_bootstrap_manager_binary() -> pathlib.Path:
    """Cluster API's kubeadm bootstrap provider (bootstrap/kubeadm/main.go of the same module)."""
    return bin_dir() / f"cluster-api-kubeadm-bootstrap-manager-{CLUSTER_API_VERSION}"


def kubeadm_control_plane_manager_binary() -> pathlib.Path:
    """Cluster API's kubeadm control-plane provider (controlplane/kubeadm/main.go of the same module)."""
    return bin_dir() / f"cluster-api-kubeadm-control-plane-manager-{CLUSTER_API_VERSION}"


def cluster_api_components_dir() -> pathlib.Path:
    """core-, bootstrap- and control-plane-components.yaml and metadata.yaml as Cluster API's release makes them
    (kustomized from the cached module by hack/build-upstream.sh)."""
    return cache_dir() / f"cluster-api-components-{CLUSTER_API_VERSION}"


def cert_manager_binary(component: str) -> pathlib.Path:
    """cert-manager's `controller`, `cainjector` or `webhook`, built from hack/cert-manager by hack/build-upstream.sh."""
    return bin_dir() / f"cert-manager-{component}-{CERT_MANAGER_VERSION}"


def cert_manager_manifest() -> pathlib.Path:
    """cert-manager.yaml as the release makes it (helm template of the module's chart), rendered once per version."""
    return cache_dir() / f"cert-manager-{CERT_MANAGER_VERSION}" / "cert-manager.yaml"


def cluster_api_crd_dir() -> pathlib.Path:
    return cache_dir() / f"cluster-api-{CLUSTER_API_VERSION}" / "config" / "crd" / "bases"


def guest_image_dir() -> pathlib.Path:
    return cache_dir() / "images"


def run_dir() -> pathlib.Path:
    """Run-time state of started daemons (sockets, pid files, logs); one sub-folder per daemon."""
    return pathlib.Path(os.environ.get("CAPI_LIBVIRT_RUN", "/run/capi-libvirt"))


def cluster_api_operator_binary() -> pathlib.Path:
    """The Cluster API Operator's manager (its module's cmd package), built by hack/build-upstream.sh."""
    return bin_dir() / f"cluster-api-operator-{CLUSTER_API_OPERATOR_VERSION}"


def cluster_api_operator_module_dir() -> pathlib.Path:
    """The Cluster API Operator module's source (hack/build-upstream.sh links it): its CRDs."""
    return cache_dir() / f"cluster-api-operator-{CLUSTER_API_OPERATOR_VERSION}"
