"""The test bed's holder of a workload cluster's control-plane endpoint: keepalived (Debian's, in the node image) in
place of the kube-vip static pod the shipped flavors carry (capi_libvirt.api.endpoint_holder), whose image cannot be
pulled or built here (no registry; the Go module proxy refuses github.com/kube-vip/kube-vip).

Same address, same machines, same announcement (the control-plane machine holding the address answers ARP for it on
the machines' network); what differs is the election: kube-vip takes a Lease through the workload API server, keepalived
runs VRRP between the control-plane machines. Each machine's keepalived tracks its own API server (a TCP connect to
127.0.0.1:6443 every 2 s): a machine whose API server does not answer has priority 50 instead of 100, so while a new
control-plane machine joins, the address stays on the one that serves, and it moves (3-4 s of VRRP advertisements
missed) only when that one is gone. Alone, a machine holds the address whether its API server answers or not, which
is what `kubeadm init` needs (it reaches its own API server through the endpoint).

`replace_kube_vip(kubeadm_config_spec, address)` swaps kube-vip's file and commands in a KubeadmControlPlane's
kubeadmConfigSpec for keepalived's and leaves everything else as generated.
"""

from __future__ import annotations

from typing import Any

from capi_libvirt.api import endpoint_holder

CONFIG_PATH = "/etc/keepalived/keepalived.conf"
INTERFACE_PLACEHOLDER = "@INTERFACE@"  # the machine's default-route interface, filled in at boot
VIRTUAL_ROUTER_ID = 51


def keepalived_conf(address: str, port: int) -> str:
    return f"""global_defs {{
  router_id capi-libvirt-control-plane
  enable_script_security
  script_user root
}}

vrrp_script api_server {{
  script "/usr/bin/timeout 2 /bin/bash -c '</dev/tcp/127.0.0.1/{port}'"
  interval 2
  fall 2
  rise 1
  weight -50
}}

vrrp_instance control_plane_endpoint {{
  state BACKUP
  interface {INTERFACE_PLACEHOLDER}
  virtual_router_id {VIRTUAL_ROUTER_ID}
  priority 100
  advert_int 1
  virtual_ipaddress {{
    {address}/32
  }}
  track_script {{
    api_server
  }}
}}
"""


def start_command() -> str:
    return (f"sed -i \"s/{INTERFACE_PLACEHOLDER}/$(ip -o -4 route show default | awk '{{print $5; exit}}')/\" "
            f"{CONFIG_PATH} && systemctl start keepalived")


def replace_kube_vip(spec: dict[str, Any], address: str, port: int) -> None:
    """kube-vip's manifest and its super-admin swap out of `spec` (a kubeadmConfigSpec), keepalived's file and start
    in; fails if the spec does not carry kube-vip as the flavor writes it."""
    shipped = endpoint_holder.kubeadm_config("", "")
    files = [f for f in spec.get("files", []) if f["path"] != endpoint_holder.MANIFEST_PATH]
    assert len(files) == len(spec.get("files", [])) - 1, "the spec carries kube-vip's manifest"
    for field in ("preKubeadmCommands", "postKubeadmCommands"):
        [swap] = shipped[field]
        commands = spec.get(field, [])
        assert commands.count(swap) == 1, f"{field} carries kube-vip's kubeconfig swap: {commands}"
        spec[field] = [c for c in commands if c != swap]
        if not spec[field]:
            del spec[field]  # Cluster API refuses an empty list
    spec["files"] = [*files, {"path": CONFIG_PATH, "owner": "root:root", "permissions": "0644",
                              "content": keepalived_conf(address, port)}]
    spec["preKubeadmCommands"] = [start_command(), *spec.get("preKubeadmCommands", [])]
