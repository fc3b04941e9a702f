"""The pod network the shipped flavors install: flannel (VXLAN between the nodes), as its own release manifest
lays it out (kube-flannel.yml: a namespace, RBAC, its configuration and a DaemonSet of `flanneld` with two init
containers that put the flannel CNI plugin in /opt/cni/bin and its CNI configuration in /etc/cni/net.d), and
installed the Cluster API way: the flavors carry it as a ConfigMap that a ClusterResourceSet applies to the workload
cluster once its API server answers (templates).

One change from kube-flannel.yml: flanneld reaches the API server through the cluster's control-plane endpoint
(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, which client-go's in-cluster configuration reads; the
endpoint's address is in the API server's certificate), not through the `kubernetes` Service's address. That address
answers on a node only once kube-proxy has written its rules there, and until then flanneld exits ("Failed to create
SubnetManager ... dial tcp 10.96.0.1:443") and the kubelet starts it again after ever longer back-offs, while no pod
of the node gets an address: on a whole cluster under TCG (2026-12-07) the control plane's kube-proxy took three
minutes to write its rules and flanneld had restarted three times by then.

Another: flanneld's own address for VXLAN is the node's (`--iface` as FLANNELD_IFACE, from the pod's `status.podIP`,
which is the node's address: flanneld runs in the host's network), not the first address of the interface with the
default route. On a control-plane machine that may be the cluster's virtual IP, which moves to another machine when
this one goes: the other nodes would then send this node's pod traffic to the wrong machine (seen on a whole cluster
here: flanneld announced the virtual IP as the control-plane node's address).

Nothing here imports beyond the standard library: hack/build-upstream.sh and hack/build-guest-image.sh read the image
references below (the test node image carries those images, built from source, under these names).
"""

from __future__ import annotations

import json
from typing import Any

FLANNEL_VERSION = "v0.28.10"
FLANNEL_IMAGE = f"ghcr.io/flannel-io/flannel:{FLANNEL_VERSION}"
CNI_PLUGIN_IMAGE = "ghcr.io/flannel-io/flannel-cni-plugin:v1.9.1-flannel3"  # the one kube-flannel.yml v0.28.10 names
NAMESPACE = "kube-flannel"
NAME = "flannel"
CNI_CONF = "/etc/cni/net.d/10-flannel.conflist"
CNI_BIN_DIR = "/opt/cni/bin"  # where image-builder's images keep the CNI plugins, and where flannel puts its own
# CNI spec 0.4.0, not kube-flannel.yml's 1.0.0: every CNI plugin release since 2019 reads it, and the node image's
# flannel plugin is an older build of the same code (docs/book/src/development/stand-ins.md).
CNI_VERSION = "0.4.0"
HEALTH_PORT = 8081


def cni_configuration() -> dict[str, Any]:
    """The node's CNI network: the flannel plugin (a bridge per node, addresses from the node's pod CIDR) and portmap."""
    return {
        "name": "cbr0",
        "cniVersion": CNI_VERSION,
        "plugins": [
            {"type": "flannel", "delegate": {"hairpinMode": True, "isDefaultGateway": True}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def network_configuration(pod_cidr: str) -> dict[str, Any]:
    """flanneld's network: the cluster's pod CIDR (kube-controller-manager gives each node its slice), VXLAN."""
    return {"Network": pod_cidr, "EnableNFTables": False, "Backend": {"Type": "vxlan"}}


def _labelled(kind: str, api_version: str, name: str, namespaced: bool = True, **rest: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"k8s-app": NAME}}
    if namespaced:
        metadata["namespace"] = NAMESPACE
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, **rest}


def _rbac() -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io/v1"
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    ]
    return [
        _labelled("ClusterRole", rbac, NAME, namespaced=False, rules=rules),
        _labelled("ClusterRoleBinding", rbac, NAME, namespaced=False,
                  roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
                  subjects=[{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]),
        _labelled("ServiceAccount", "v1", NAME),
    ]


def _daemon_set(api_server: tuple[str, str]) -> dict[str, Any]:
    config_mount = {"name": "flannel-cfg", "mountPath": "/etc/kube-flannel/"}
    field = [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{path}"}}}
             for name, path in (("POD_NAME", "name"), ("POD_NAMESPACE", "namespace"))]
    flanneld = {
        "name": "kube-flannel",
        "image": FLANNEL_IMAGE,
        "command": ["/opt/bin/flanneld"],
        "args": ["--ip-masq", "--kube-subnet-mgr", f"--healthz-port={HEALTH_PORT}"],
        "ports": [{"name": "healthz", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "healthz"}, "initialDelaySeconds": 10,
                          "periodSeconds": 30},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "healthz"}, "initialDelaySeconds": 5,
                           "periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "50Mi"}},
        "securityContext": {"privileged": False, "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}},
        "env": [*field, {"name": "EVENT_QUEUE_DEPTH", "value": "5000"},
                {"name": "CONT_WHEN_CACHE_NOT_READY", "value": "false"},
                {"name": "KUBERNETES_SERVICE_HOST", "value": api_server[0]},
                {"name": "KUBERNETES_SERVICE_PORT", "value": api_server[1]},
                {"name": "FLANNELD_IFACE", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "volumeMounts": [{"name": "run", "mountPath": "/run/flannel"}, config_mount,
                         {"name": "xtables-lock", "mountPath": "/run/xtables.lock"}],
    }
    init_containers = [
        {"name": "install-cni-plugin", "image": CNI_PLUGIN_IMAGE, "command": ["cp"],
         "args": ["-f", "/flannel", f"{CNI_BIN_DIR}/flannel"],
         "volumeMounts": [{"name": "cni-plugin", "mountPath": CNI_BIN_DIR}]},
        {"name": "install-cni", "image": FLANNEL_IMAGE, "command": ["/opt/bin/install-conf"],
         "args": ["/etc/kube-flannel/cni-conf.json", CNI_CONF],
         "volumeMounts": [{"name": "cni", "mountPath": "/etc/cni/net.d"}, config_mount]},
    ]
    volumes = [
        {"name": "run", "hostPath": {"path": "/run/flannel"}},
        {"name": "cni-plugin", "hostPath": {"path": CNI_BIN_DIR}},
        {"name": "cni", "hostPath": {"path": "/etc/cni/net.d"}},
        {"name": "flannel-cfg", "configMap": {"name": "kube-flannel-cfg"}},
        {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
    ]
    linux = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
    labels = {"tier": "node", "app": NAME, "k8s-app": NAME}
    daemon_set = _labelled("DaemonSet", "apps/v1", "kube-flannel-ds", spec={
        "selector": {"matchLabels": {"app": NAME}},
        "template": {
            "metadata": {"labels": {"tier": "node", "app": NAME}},
            "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [linux]}]}}},
                "hostNetwork": True,
                "priorityClassName": "system-node-critical",
                "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                "serviceAccountName": NAME,
                "initContainers": init_containers,
                "containers": [flanneld],
                "volumes": volumes,
            },
        },
    })
    daemon_set["metadata"]["labels"] = labels
    return daemon_set


def manifest(pod_cidr: str, api_server: tuple[str, str]) -> list[dict[str, Any]]:
    """Every object flannel needs in the workload cluster, in the order they apply; `api_server` is the cluster's
    control-plane endpoint (host, port), which flanneld talks to (the module docstring says why)."""
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NAMESPACE, "labels": {"k8s-app": NAME,
                                                            "pod-security.kubernetes.io/enforce": "privileged"}}}
    config = _labelled("ConfigMap", "v1", "kube-flannel-cfg", data={
        "cni-conf.json": json.dumps(cni_configuration(), indent=2) + "\n",
        "net-conf.json": json.dumps(network_configuration(pod_cidr), indent=2) + "\n",
    })
    return [namespace, *_rbac(), config, _daemon_set(api_server)]
