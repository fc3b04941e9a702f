"""The operator's login and its own client read one set of credentials (kube.kubeconfig): the ServiceAccount at the
in-cluster paths and KUBERNETES_SERVICE_HOST/PORT in a pod, never kopf's hard-coded kubernetes.default.svc; a
kubeconfig elsewhere, its contexts, relative paths and exec plugins as kubectl reads them; a workload cluster's
kubeconfig (a tenant may write its Secret) with its inline data only."""

from __future__ import annotations

import base64
import json
import sys

import pytest

from capi_libvirt.kube import kubeconfig
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
    assert kubeconfig.in_cluster()
    credentials = kubeconfig.service_account(account)
    assert credentials.server == "https://10.96.0.1:443" and credentials.token_file == str(account / "token")
    info = login.connection_info(credentials)
    assert info.server == "https://10.96.0.1:443"
    assert info.token == "the-token" and info.scheme == "Bearer"
    assert info.ca_path == str(account / "ca.crt") and info.default_namespace == "capi-libvirt-system"
    assert "the-token" not in repr(credentials)


def test_an_ipv6_service_address_is_bracketed(account, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert kubeconfig.service_account(account).server == "https://[fd00::1]:6443"


def test_a_kubeconfig_wins_over_the_in_cluster_variables(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBECONFIG", "/somewhere/kubeconfig")
    assert not kubeconfig.in_cluster()
    monkeypatch.delenv("KUBECONFIG")
    assert not kubeconfig.in_cluster(context="other")  # a context asked for is a kubeconfig's
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert not kubeconfig.in_cluster()


def _write(path, config):
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_contexts_merged_files_and_relative_paths_as_kubectl_reads_them(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _write(tmp_path / "a" / "config", {
        "current-context": "one",
        "contexts": [{"name": "one", "context": {"cluster": "c1", "user": "u1", "namespace": "ns1"}}],
        "clusters": [{"name": "c1", "cluster": {"server": "https://127.0.0.1:6443/", "certificate-authority": "ca.pem"}}],
        "users": [{"name": "u1", "user": {"client-certificate": "u.crt", "client-key": "/abs/u.key"}}]})
    second = _write(tmp_path / "b" / "config", {
        "current-context": "two",  # the first file's current-context wins
        "contexts": [{"name": "two", "context": {"cluster": "c2", "user": "u2"}},
                     {"name": "one", "context": {"cluster": "ignored", "user": "ignored"}}],
        "clusters": [{"name": "c2", "cluster": {"server": "https://127.0.0.2:6443",
                                                "certificate-authority-data": _b64("PEM")}}],
        "users": [{"name": "u2", "user": {"token": "t2"}}]})
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    current = kubeconfig.from_kubeconfig()
    assert current.server == "https://127.0.0.1:6443" and current.namespace == "ns1"
    assert current.ca_path == str(tmp_path / "a" / "ca.pem")
    assert current.certificate_path == str(tmp_path / "a" / "u.crt") and current.key_path == "/abs/u.key"
    other = kubeconfig.from_kubeconfig("two")
    assert other.server == "https://127.0.0.2:6443" and other.ca_data == b"PEM" and other.token == "t2"
    assert kubeconfig.default_namespace("two") == "default" and kubeconfig.default_namespace() == "ns1"
    with pytest.raises(kubeconfig.KubeconfigError, match="context 'three' not found"):
        kubeconfig.from_kubeconfig("three")
    info = login.connection_info(other)
    assert info.ca_data == _b64("PEM") and info.token == "t2"


def test_an_absent_or_malformed_kubeconfig_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nothing"))
    with pytest.raises(kubeconfig.KubeconfigError, match="no kubeconfig"):
        kubeconfig.load()
    (tmp_path / "bad").write_text("- [")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "bad"))
    with pytest.raises(kubeconfig.KubeconfigError, match="not YAML"):
        kubeconfig.load()


def test_an_exec_plugin_is_run_for_its_token(tmp_path, monkeypatch):
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import json, os\n"
                      "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
                      "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',"
                      " 'status': {'token': 'from-' + os.environ['WHO']}}))\n")
    _write(tmp_path / "config", {
        "current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(plugin)],
            "env": [{"name": "WHO", "value": "plugin"}]}}}]})
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    credentials = kubeconfig.load()
    answered = kubeconfig.run_exec_plugin(credentials)
    assert answered.token == "from-plugin" and "from-plugin" not in repr(answered)
    assert login.connection_info(credentials, answered).token == "from-plugin"
    plugin.write_text("raise SystemExit(3)\n")
    with pytest.raises(kubeconfig.KubeconfigError, match="exited with 3"):
        kubeconfig.run_exec_plugin(credentials)


def _workload(user: dict, cluster: dict | None = None) -> dict:
    return {"current-context": "w", "contexts": [{"name": "w", "context": {"cluster": "c", "user": "u"}}],
            "clusters": [{"name": "c", "cluster": cluster or {"server": "https://198.19.0.1:6443",
                                                              "certificate-authority-data": _b64("CA")}}],
            "users": [{"name": "u", "user": user}]}


def test_a_workload_kubeconfig_gives_inline_data_only(tmp_path):
    """Its Secret is a tenant's to write: an exec plugin would run a command in the operator, a path would have the
    operator read its own files (its ServiceAccount token) as the workload's credentials."""
    fine = kubeconfig.from_kubeconfig_data(_workload({"client-certificate-data": _b64("CERT"),
                                                      "client-key-data": _b64("KEY")}))
    assert (fine.ca_data, fine.certificate_data, fine.key_data) == (b"CA", b"CERT", b"KEY")
    marker = tmp_path / "ran"
    hostile = [
        _workload({"exec": {"command": "touch", "args": [str(marker)]}}),
        _workload({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}),
        _workload({"client-certificate": "/etc/ssl/private/x.crt", "client-key": "/etc/ssl/private/x.key"}),
        _workload({}, {"server": "https://198.19.0.1:6443", "certificate-authority": "/etc/passwd"}),
        _workload({}, {"server": "file:///etc/passwd"}),
        ["not", "a", "mapping"],
        {"current-context": "missing"},
    ]
    for config in hostile:
        with pytest.raises(kubeconfig.KubeconfigError):
            kubeconfig.from_kubeconfig_data(config)
    assert not marker.exists()


def test_what_client_go_refuses_is_refused_by_name(tmp_path, monkeypatch):
    base = {"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c", "user": "ghost"}}],
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}], "users": []}
    monkeypatch.setenv("KUBECONFIG", str(_write(tmp_path / "a", base)))
    with pytest.raises(kubeconfig.KubeconfigError, match="names user 'ghost'"):
        kubeconfig.load()
    both = {**base, "contexts": [{"name": "x", "context": {"cluster": "c"}}],
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority": "ca",
                                                   "certificate-authority-data": _b64("CA")}}]}
    monkeypatch.setenv("KUBECONFIG", str(_write(tmp_path / "b", both)))
    with pytest.raises(kubeconfig.KubeconfigError, match="both a file and data for certificate-authority"):
        kubeconfig.load()
    wrapped = {**both, "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                                              "certificate-authority-data": _b64("C" * 80)[:40] + "\n"
                                                              + _b64("C" * 80)[40:]}}]}
    monkeypatch.setenv("KUBECONFIG", str(_write(tmp_path / "c", wrapped)))
    assert kubeconfig.load().ca_data == b"C" * 80  # a line break in data is taken, as client-go takes it
