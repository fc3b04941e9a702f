"""Fixtures of the real Cluster API core controller (its manager with webhooks on) against the test API server."""

from __future__ import annotations

from typing import Iterator

import pytest

from capi_libvirt.devenv import capi_controller as capi
from capi_libvirt.devenv import control_plane as cp
from capi_libvirt.devenv import paths

from prereq import require


@pytest.fixture(scope="module")
def capi_controller(control_plane: cp.LocalControlPlane) -> Iterator[capi.CapiController]:
    """Cluster API's controllers and webhooks, for one test module.

    Module-scoped, not session-scoped: the real controllers reconcile every Cluster API object on the shared API
    server, and other modules play Cluster API's part themselves (they set a Cluster's status, create Machines and
    their LibvirtMachines by hand), which the controllers would undo. Delete what a test made while it runs: the
    finalizers the controllers add need them to go away. On teardown the API server's webhook configurations and CRD
    conversions are as they were before."""
    require(paths.cluster_api_manager_binary().exists(),
            f"Cluster API manager binary {paths.cluster_api_manager_binary()} (make upstream)")
    require((capi.module_dir() / "config" / "webhook" / "manifests.yaml").exists(),
            f"Cluster API module {capi.module_dir()} (make upstream)")
    with capi.CapiController(control_plane) as controller:
        yield controller
