"""The operator's login: the ServiceAccount at the in-cluster paths and KUBERNETES_SERVICE_HOST/PORT in a pod, a
kubeconfig elsewhere; never kopf's hard-coded kubernetes.default.svc."""

from __future__ import annotations

import pytest

from capi_libvirt.kube import api
from capi_libvirt.operator import login

pytestmark = pytest.mark.unit


@pytest.fixture
def account(tmp_path):
    (tmp_path / "token").write_text("the-token\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "namespace").write_text("capi-libvirt-system")
    return tmp_path


def test_in_a_pod_the_service_account_and_the_service_variables_are_used(account, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert api.in_cluster()
    info = login.service_account_connection(account)
    assert info.server == "https://10.96.0.1:443"
    assert info.token == "the-token" and info.scheme == "Bearer"
    assert info.ca_path == str(account / "ca.crt") and info.default_namespace == "capi-libvirt-system"


def test_an_ipv6_service_address_is_bracketed(account, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert login.service_account_connection(account).server == "https://[fd00::1]:6443"


def test_a_kubeconfig_wins_over_the_in_cluster_variables(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBECONFIG", "/somewhere/kubeconfig")
    assert not api.in_cluster()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    monkeypatch.delenv("KUBECONFIG")
    assert not api.in_cluster()
