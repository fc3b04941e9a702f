"""Fixtures of the real Cluster API parts: the core manager, the kubeadm bootstrap provider (CABPK) and the kubeadm
control-plane provider (KCP) against the test API server, each with its webhooks on, the release as a clusterctl repository, and what `clusterctl init` test beds
need (devenv/clusterctl_init.py, devenv/management_cluster.py): their prerequisites, the repository `clusterctl init`
installs from, and our operator's image."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from capi_libvirt.api import release
from clusterctl_cli import CLUSTERCTL, write_repository
from devenv import capi_controller as capi
from devenv import clusterctl_init, clusterctl_repository, paths
from devenv import control_plane as cp

from prereq import require


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The release written as a clusterctl local repository, for the real clusterctl (clusterctl_cli.py)."""
    require(CLUSTERCTL.exists(), f"clusterctl binary {CLUSTERCTL} (make upstream)")
    return write_repository(tmp_path_factory.mktemp("release"))


def require_provider(provider: capi.Provider) -> None:
    require(provider.binary().exists(), f"{provider.name} binary {provider.binary()} (make upstream)")
    manifests = provider.config_dir / "webhook" / "manifests.yaml"
    require(manifests.exists(), f"Cluster API module file {manifests} (make upstream)")


@pytest.fixture(scope="module")
def capi_controller(control_plane: cp.LocalControlPlane) -> Iterator[capi.CapiController]:
    """Cluster API's controllers and webhooks, for one test module.

    Module-scoped, not session-scoped: the real controllers reconcile every Cluster API object on the shared API
    server, and other modules play Cluster API's part themselves (they set a Cluster's status, create Machines and
    their LibvirtMachines by hand), which the controllers would undo. Delete what a test made while it runs: the
    finalizers the controllers add need them to go away. On teardown the API server's webhook configurations and CRD
    conversions are as they were before."""
    require_provider(capi.CORE)
    with capi.CapiController(control_plane) as controller:
        yield controller


@pytest.fixture(scope="module")
def kubeadm_bootstrap_controller(control_plane: cp.LocalControlPlane,
                                 capi_controller: capi.CapiController) -> Iterator[capi.CapiController]:
    """Cluster API's kubeadm bootstrap provider (KubeadmConfig -> cloud-init with `kubeadm join`), its CRDs and
    webhooks, for one test module, beside the core controller."""
    require_provider(capi.KUBEADM_BOOTSTRAP)
    with capi.CapiController(control_plane, provider=capi.KUBEADM_BOOTSTRAP) as controller:
        yield controller


@pytest.fixture(scope="module")
def kubeadm_control_plane_controller(control_plane: cp.LocalControlPlane,
                                    kubeadm_bootstrap_controller: capi.CapiController) -> Iterator[capi.CapiController]:
    """Cluster API's kubeadm control-plane provider (KubeadmControlPlane -> control-plane Machines, their
    KubeadmConfigs, the cluster's certificates and `<cluster>-kubeconfig`), its CRDs and webhooks, for one test module,
    beside the core and bootstrap controllers."""
    require_provider(capi.KUBEADM_CONTROL_PLANE)
    with capi.CapiController(control_plane, provider=capi.KUBEADM_CONTROL_PLANE) as controller:
        yield controller


def require_clusterctl_bed() -> None:
    """What a `clusterctl init` test bed runs: root (an address on lo), the upstream programs and manifests."""
    require(os.geteuid() == 0, "root (an address on lo, libvirt hosts)")
    require(shutil.which("ip") is not None, "ip (iproute2)")
    for binary in (paths.etcd_binary(), paths.kube_apiserver_binary(), paths.kubeadm_binary(),
                   paths.kube_controller_manager_binary(), clusterctl_init.clusterctl_binary(),
                   paths.cluster_api_manager_binary(), paths.kubeadm_bootstrap_manager_binary(),
                   *(paths.cert_manager_binary(c) for c in ("controller", "cainjector", "webhook"))):
        require(binary.exists(), f"{binary} (make upstream)")
    require(paths.cert_manager_manifest().exists(), f"{paths.cert_manager_manifest()} (make upstream)")
    components = paths.cluster_api_components_dir() / "core-components.yaml"
    require(components.exists(), f"{components} (make upstream)")


@pytest.fixture(scope="session")
def init_repository(tmp_path_factory: pytest.TempPathFactory) -> clusterctl_repository.Repository:
    """The local repository `clusterctl init` installs everything from (devenv/clusterctl_repository.py)."""
    require_clusterctl_bed()
    return clusterctl_repository.write_repository(tmp_path_factory.mktemp("init-repository"))


@pytest.fixture(scope="session")
def operator_image() -> str:
    """The image `make image` built (hack/build-image.sh), tagged as config/manager names it."""
    require(shutil.which("podman") is not None, "podman (make test installs it)")
    image = release.image(clusterctl_repository.VERSION)
    exists = subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode == 0
    require(exists, f"the operator image {image} (make image)")
    return image
