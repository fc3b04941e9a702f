"""What holds the control-plane endpoint in the shipped flavors: kube-vip as a static pod on every control-plane
machine, announcing `CONTROL_PLANE_ENDPOINT_HOST` by ARP on the machines' network (the address must be outside the
network's DHCP range, and the network an L2 one: a libvirt NAT or routed network, or a host bridge).

kube-vip elects its leader through the workload API server with the kubeconfig it mounts. During `kubeadm init`
kubeadm's admin.conf has no rights yet (kubeadm 1.29 moved cluster-admin to super-admin.conf), so on the machine that
runs `kubeadm init` (the one whose bootstrap data carries /run/kubeadm/kubeadm.yaml) the manifest mounts
super-admin.conf until kubeadm is done, then admin.conf again; joining machines use admin.conf throughout.

Its image is pulled at run time by the kubelet (`KUBE_VIP_IMAGE`), so the machines' network must reach that registry,
or the image must be in the node image.
"""

from __future__ import annotations

from typing import Any

from capi_libvirt.api.quoting import Quoted, dump

MANIFEST_PATH = "/etc/kubernetes/manifests/kube-vip.yaml"
ADMIN_CONF = "/etc/kubernetes/admin.conf"
SUPER_ADMIN_CONF = "/etc/kubernetes/super-admin.conf"
INIT_MARKER = "/run/kubeadm/kubeadm.yaml"  # written by the kubeadm bootstrap provider on the `kubeadm init` machine

KUBE_VIP_IMAGE = "${KUBE_VIP_IMAGE:=ghcr.io/kube-vip/kube-vip:v1.0.1}"
# The machines' interface on the endpoint's network: enp1s0 is the first virtio NIC of a q35 machine (the provider's
# default machine type); `pc` machines name it ens3.
KUBE_VIP_INTERFACE = "${KUBE_VIP_INTERFACE:=enp1s0}"


def kube_vip_pod(address: str, port: str) -> dict[str, Any]:
    """The static Pod: ARP mode, control-plane VIP only, leader election by Lease in kube-system."""
    env = {
        "vip_arp": "true",
        "vip_interface": KUBE_VIP_INTERFACE,
        "port": port,
        "address": address,
        "vip_cidr": "32",
        "cp_enable": "true",
        "cp_namespace": "kube-system",
        "svc_enable": "false",
        "vip_leaderelection": "true",
        "vip_leasename": "plndr-cp-lock",
        "vip_leaseduration": "15",
        "vip_renewdeadline": "10",
        "vip_retryperiod": "2",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kube-vip", "namespace": "kube-system"},
        "spec": {
            "containers": [{
                "name": "kube-vip",
                "image": KUBE_VIP_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "args": ["manager"],
                "env": [{"name": name, "value": Quoted(value)} for name, value in env.items()],
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]}},
                "volumeMounts": [{"name": "kubeconfig", "mountPath": ADMIN_CONF}],
            }],
            "hostAliases": [{"ip": "127.0.0.1", "hostnames": ["kubernetes"]}],
            "hostNetwork": True,
            "volumes": [{"name": "kubeconfig", "hostPath": {"path": ADMIN_CONF, "type": "FileOrCreate"}}],
        },
    }


def _swap_kubeconfig(source: str, target: str) -> str:
    return f"if [ -f {INIT_MARKER} ]; then sed -i 's#path: {source}#path: {target}#' {MANIFEST_PATH}; fi"


def kubeadm_config(address: str, port: str) -> dict[str, Any]:
    """The KubeadmConfigSpec fields of the control plane that run kube-vip: its manifest as a file, and the
    super-admin.conf swap around `kubeadm init`."""
    return {
        "files": [{"path": MANIFEST_PATH, "owner": "root:root", "permissions": "0644",
                   "content": dump(kube_vip_pod(address, port))}],
        "preKubeadmCommands": [_swap_kubeconfig(ADMIN_CONF, SUPER_ADMIN_CONF)],
        "postKubeadmCommands": [_swap_kubeconfig(SUPER_ADMIN_CONF, ADMIN_CONF)],
    }
