"""Fixtures of the real Cluster API parts: the core manager and the kubeadm bootstrap provider (CABPK) against the test
API server, each with its webhooks on, and the release as a clusterctl repository."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from clusterctl_cli import CLUSTERCTL, write_repository
from devenv import capi_controller as capi
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
