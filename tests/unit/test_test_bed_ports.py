"""Two management clusters side by side in the test bed: our manager's pods get their own host ports, and the stand-in
control plane's CRD moves with `clusterctl move` (no process is started here)."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from devenv import pod_runner, workload_cluster

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]


def manager_args() -> list[str]:
    documents = yaml.safe_load_all((REPO / "config" / "manager" / "manager.yaml").read_text())
    [deployment] = [d for d in documents if d and d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]


def test_port_map_rewrites_the_manager_s_bind_addresses_and_nothing_else() -> None:
    pod = pod_runner.PodmanPod(None, "ns", "deploy", pathlib.Path("/nonexistent"),  # type: ignore[arg-type]
                               port_map={8080: 18080, 8081: 18081}, name="pod-a")
    args = [pod.remap(arg) for arg in manager_args()]
    assert "--health-addr=0.0.0.0:18081" in args and "--metrics-bind-addr=:18080" in args
    assert "--leader-elect" in args and "run" in args
    assert pod.remap("--other=host:9999") == "--other=host:9999"
    assert pod.name == "pod-a"


def test_without_a_port_map_the_args_are_the_deployment_s() -> None:
    pod = pod_runner.PodmanPod(None, "ns", "deploy", pathlib.Path("/nonexistent"))  # type: ignore[arg-type]
    assert [pod.remap(arg) for arg in manager_args()] == manager_args()
    assert pod.name == "pod-ns-deploy"


def test_the_stand_in_control_plane_is_listed_by_clusterctl_move_and_readable_by_the_core_manager() -> None:
    crd = workload_cluster.hosted_control_plane_crd()
    assert "clusterctl.cluster.x-k8s.io" in crd["metadata"]["labels"]
    role = workload_cluster.core_manager_role()
    assert role["metadata"]["labels"] == {"cluster.x-k8s.io/aggregate-to-manager": "true"}
    assert role["rules"][0]["resources"] == [workload_cluster.CP_PLURAL, f"{workload_cluster.CP_PLURAL}/status"]
