"""The default flavor's holder of the control-plane endpoint, kube-vip as a static pod, checked as far as this machine
allows (its image cannot be pulled or built here, so no guest runs it; tests/e2e/test_whole_cluster.py runs the same
flavor with keepalived holding the address): the manifest `clusterctl generate cluster` writes is a Pod the real API
server accepts under strict field validation, announcing the endpoint's address and port; and its commands mount
super-admin.conf only on the machine that runs `kubeadm init`, while kubeadm runs, and admin.conf again after.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest
import yaml

from capi_libvirt.api import endpoint_holder
from clusterctl_cli import generate_cluster
from devenv import paths

pytestmark = pytest.mark.integration

ADDRESS = "198.19.10.251"


def control_plane_spec(tmp_path: pathlib.Path, repository: pathlib.Path) -> dict:
    documents = generate_cluster(tmp_path, repository, "", "vip", "default", {
        "KUBERNETES_VERSION": paths.KUBERNETES_VERSION, "CONTROL_PLANE_MACHINE_COUNT": "1",
        "WORKER_MACHINE_COUNT": "0", "CONTROL_PLANE_ENDPOINT_HOST": ADDRESS, "LIBVIRT_BASE_IMAGE": "node.qcow2"})
    [kcp] = [d for d in documents if d["kind"] == "KubeadmControlPlane"]
    return kcp["spec"]["kubeadmConfigSpec"]


def test_the_kube_vip_manifest_is_a_pod_the_api_server_accepts(control_plane, repository, tmp_path):
    spec = control_plane_spec(tmp_path, repository)
    [manifest] = [f for f in spec["files"] if f["path"] == endpoint_holder.MANIFEST_PATH]
    pod = yaml.safe_load(manifest["content"])
    created = control_plane.request(
        "POST", "/api/v1/namespaces/kube-system/pods?dryRun=All&fieldValidation=Strict", pod)
    [container] = created["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["address"] == ADDRESS and env["port"] == "6443" and env["vip_arp"] == "true", env
    assert env["vip_interface"] == "enp1s0", env  # the first virtio NIC of a q35 machine, the provider's default
    assert created["spec"]["hostNetwork"] is True
    assert {"NET_ADMIN", "NET_RAW"} <= set(container["securityContext"]["capabilities"]["add"])


@pytest.mark.parametrize("init_machine", [True, False])
def test_the_init_machine_mounts_super_admin_conf_while_kubeadm_runs(tmp_path, repository, init_machine):
    (tmp_path / "generate").mkdir()
    spec = control_plane_spec(tmp_path / "generate", repository)
    [manifest] = [f for f in spec["files"] if f["path"] == endpoint_holder.MANIFEST_PATH]
    here = tmp_path / "manifest.yaml"
    marker = tmp_path / "kubeadm.yaml"
    here.write_text(manifest["content"])
    if init_machine:
        marker.write_text("")

    def run(commands: list[str]) -> str:
        for command in commands:
            local = command.replace(endpoint_holder.MANIFEST_PATH, str(here)).replace(
                endpoint_holder.INIT_MARKER, str(marker))
            subprocess.run(["bash", "-c", local], check=True)
        volumes = yaml.safe_load(here.read_text())["spec"]["volumes"]
        return volumes[0]["hostPath"]["path"]

    during = run(spec["preKubeadmCommands"])
    assert during == (endpoint_holder.SUPER_ADMIN_CONF if init_machine else endpoint_holder.ADMIN_CONF)
    assert run(spec["postKubeadmCommands"]) == endpoint_holder.ADMIN_CONF
