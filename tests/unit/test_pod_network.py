"""The flavors' pod network: flannel's objects as its release manifest has them, on the cluster's pod CIDR, in a
ConfigMap that the flavor's ClusterResourceSet applies to the flavor's own Cluster."""

from __future__ import annotations

import json

import pytest
import yaml

from capi_libvirt.api import pod_network, templates

pytestmark = pytest.mark.unit


def _by_kind(documents: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for document in documents:
        kinds.setdefault(document["kind"], []).append(document)
    return kinds


@pytest.mark.parametrize("flavor", sorted(templates.FLAVORS))
def test_every_flavor_applies_flannel_to_its_own_cluster(flavor: str) -> None:
    kinds = _by_kind(templates.FLAVORS[flavor]())
    [cluster], [config_map], [resource_set] = kinds["Cluster"], kinds["ConfigMap"], kinds["ClusterResourceSet"]
    selector = resource_set["spec"]["clusterSelector"]["matchLabels"]
    assert selector and selector.items() <= cluster["metadata"]["labels"].items()
    assert resource_set["spec"]["resources"] == [{"name": config_map["metadata"]["name"], "kind": "ConfigMap"}]
    assert resource_set["spec"]["strategy"] == "ApplyOnce"
    [stream] = config_map["data"].values()
    applied = _by_kind(list(yaml.safe_load_all(stream)))
    assert sorted(applied) == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Namespace",
                               "ServiceAccount"]
    [flannel_config] = applied["ConfigMap"]
    network = json.loads(flannel_config["data"]["net-conf.json"])
    assert [network["Network"]] == cluster["spec"]["clusterNetwork"]["pods"]["cidrBlocks"]
    assert network["Backend"] == {"Type": "vxlan"}
    # flanneld talks to the API server through the cluster's endpoint, not the `kubernetes` Service (kube-proxy's):
    # both values stay strings once clusterctl substitutes them.
    substituted = stream.replace("${CONTROL_PLANE_ENDPOINT_HOST}", "198.51.100.10").replace(
        "${CONTROL_PLANE_ENDPOINT_PORT:=6443}", "6443")
    [daemon_set] = _by_kind(list(yaml.safe_load_all(substituted)))["DaemonSet"]
    [flanneld] = daemon_set["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in flanneld["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("198.51.100.10", "6443")
    # Its VXLAN address is the node's (the pod's, in the host's network), not the interface's first one.
    [iface] = [e for e in flanneld["env"] if e["name"] == "FLANNELD_IFACE"]
    assert iface["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert daemon_set["spec"]["template"]["spec"]["hostNetwork"] is True


def test_the_daemon_set_runs_the_images_the_node_image_carries_and_installs_the_cni_configuration() -> None:
    [daemon_set] = [d for d in pod_network.manifest("10.244.0.0/16", ("198.51.100.10", "6443")) if d["kind"] == "DaemonSet"]
    pod = daemon_set["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["initContainers"] + pod["containers"]} == {
        pod_network.FLANNEL_IMAGE, pod_network.CNI_PLUGIN_IMAGE}
    assert pod_network.FLANNEL_IMAGE.endswith(":" + pod_network.FLANNEL_VERSION)
    assert pod["serviceAccountName"] == pod_network.NAME and pod["hostNetwork"] is True
    [install_conf] = [c for c in pod["initContainers"] if c["name"] == "install-cni"]
    assert install_conf["args"][-1] == pod_network.CNI_CONF
    [plugin] = [c for c in pod["initContainers"] if c["name"] == "install-cni-plugin"]
    assert plugin["args"][-1] == f"{pod_network.CNI_BIN_DIR}/flannel"
    assert daemon_set["spec"]["selector"]["matchLabels"].items() <= pod_network.manifest("x", ("h", "1"))[-1][
        "spec"]["template"]["metadata"]["labels"].items()


def test_the_cni_configuration_delegates_to_a_bridge_with_port_mapping() -> None:
    configuration = pod_network.cni_configuration()
    assert [plugin["type"] for plugin in configuration["plugins"]] == ["flannel", "portmap"]
    assert configuration["cniVersion"] == pod_network.CNI_VERSION
