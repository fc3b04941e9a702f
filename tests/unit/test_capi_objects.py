"""Cluster API's Machine and Cluster as the reconciles read them (core.capi_objects): v1beta2's fields, v1beta1's
where it kept the same fact elsewhere, and an object that has none of them yet."""

from __future__ import annotations

import pytest

from capi_libvirt.core.capi_objects import ClusterView, MachineView

pytestmark = pytest.mark.unit


def test_a_machine_view_reads_its_cluster_bootstrap_secret_failure_domain_and_node():
    machine = MachineView.of({"metadata": {"name": "m0"}, "spec": {
        "clusterName": "c1", "bootstrap": {"dataSecretName": "m0-boot"}, "failureDomain": "rack-a"},
        "status": {"nodeRef": {"name": "node-0"}}})
    assert machine == MachineView("m0", "c1", "m0-boot", "rack-a", "node-0") and machine.node_joined
    fresh = MachineView.of({"metadata": {"name": "m1"}, "spec": {"bootstrap": {}}})
    assert fresh == MachineView("m1") and not fresh.node_joined


@pytest.mark.parametrize("status, provisioned, initialized", [
    ({"initialization": {"infrastructureProvisioned": True, "controlPlaneInitialized": True}}, True, True),  # v1beta2
    ({"infrastructureReady": True, "conditions": [{"type": "ControlPlaneInitialized", "status": "True"}]},
     True, True),  # v1beta1
    ({"conditions": [{"type": "ControlPlaneInitialized", "status": "False"}]}, False, False),
    (None, False, False),
])
def test_a_cluster_view_reads_both_api_versions_facts(status, provisioned, initialized):
    cluster = ClusterView.of({"metadata": {"name": "c1"}, "spec": {"paused": True}, "status": status})
    assert (cluster.name, cluster.paused) == ("c1", True)
    assert (cluster.infrastructure_provisioned, cluster.control_plane_initialized) == (provisioned, initialized)
    assert not ClusterView.of({"metadata": {"name": "c2"}}).paused
