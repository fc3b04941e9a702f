"""The kubeadm configuration the test API server is made from, and cluster-info pointed at an API gateway."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from devenv import kubeadm_phases, paths

pytestmark = pytest.mark.unit


def test_configuration_puts_the_gateway_addresses_in_the_serving_certificate(tmp_path: pathlib.Path) -> None:
    init, cluster = kubeadm_phases.kubeadm_configuration(tmp_path, 6443, "100.64.0.0/24", ["192.168.122.1"])
    assert (init["kind"], cluster["kind"]) == ("InitConfiguration", "ClusterConfiguration")
    assert init["localAPIEndpoint"] == {"advertiseAddress": "192.168.122.1", "bindPort": 6443}
    assert cluster["apiServer"]["certSANs"] == ["127.0.0.1", "192.168.122.1"]
    assert cluster["certificatesDir"] == str(tmp_path)
    assert cluster["kubernetesVersion"] == paths.KUBERNETES_VERSION  # no lookup of the latest release
    assert cluster["networking"]["serviceSubnet"] == "100.64.0.0/24"


def test_written_configuration_is_private_and_reads_back(tmp_path: pathlib.Path) -> None:
    documents = kubeadm_phases.kubeadm_configuration(tmp_path, 1234, "100.64.0.0/24")
    assert documents[0]["localAPIEndpoint"]["advertiseAddress"] == kubeadm_phases.UNROUTED_ADDRESS  # not loopback
    path = kubeadm_phases.write_configuration(tmp_path / "kubeadm.yaml", documents)
    assert path.stat().st_mode & 0o777 == 0o600
    assert list(yaml.safe_load_all(path.read_text())) == documents


def test_cluster_info_names_the_gateway_and_keeps_the_ca() -> None:
    kubeconfig = yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [
        {"name": "", "cluster": {"server": "https://127.0.0.1:36443", "certificate-authority-data": "Q0E="}}]})
    changed = yaml.safe_load(kubeadm_phases.with_server(kubeconfig, "https://192.168.122.1:6443"))
    assert changed["clusters"] == [{"name": "", "cluster": {"server": "https://192.168.122.1:6443",
                                                            "certificate-authority-data": "Q0E="}}]


def test_configuration_for_nodes_keeps_kubeadms_certificates_dir() -> None:
    """Joining nodes derive the kubelet's client CA path from it: it must be theirs, not the test bed's folder."""
    _, cluster = kubeadm_phases.kubeadm_configuration(None, 6443, "100.64.0.0/24")
    assert "certificatesDir" not in cluster
