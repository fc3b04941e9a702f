"""The kubelet stand-in's script, run here against the real kube-apiserver on loopback (no guest): it registers the
Node with its provider ID, verifies the server's certificate for the configured name against the given CA only, and
its user may do nothing but create and read Nodes."""

from __future__ import annotations

import json
import pathlib
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest

from capi_libvirt.devenv import node_registration as nr
from capi_libvirt.devenv.api_gateway import TLS_SERVER_NAME
from capi_libvirt.devenv.control_plane import ControlPlaneError

from fixtures_control_plane import KUBELET_USER

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registration_granted(control_plane):
    nr.grant_node_registration(control_plane, KUBELET_USER)


def run_script(tmp_path: pathlib.Path, control_plane, server_name: str = TLS_SERVER_NAME,
               ca_file: pathlib.Path | None = None) -> tuple[str, str, subprocess.CompletedProcess[str]]:
    """Run the script as cloud-init would, with a fake instance-data.json; (hostname, provider ID, result)."""
    hostname, provider_id = f"node-{uuid.uuid4().hex[:8]}", f"libvirt://test-host/{uuid.uuid4()}"
    (tmp_path / "script").write_text(nr.REGISTER_SCRIPT)
    (tmp_path / "config.json").write_text(json.dumps(nr.registration_config(
        control_plane.server, server_name, control_plane.user_tokens[KUBELET_USER],
        str(ca_file or control_plane.ca_file))))
    (tmp_path / "instance-data.json").write_text(json.dumps({
        "ds": {"meta_data": {"instance-id": "i-1", "local-hostname": hostname, "provider-id": provider_id}},
        "v1": {"local_hostname": hostname}}))
    result = subprocess.run([sys.executable, str(tmp_path / "script"), str(tmp_path / "config.json"),
                             str(tmp_path / "instance-data.json")], capture_output=True, text=True, timeout=60)
    return hostname, provider_id, result


def node(control_plane, name: str) -> dict | None:
    try:
        return control_plane.request("GET", f"/api/v1/nodes/{name}")
    except ControlPlaneError as error:
        if error.status == 404:
            return None
        raise


def test_registers_the_node_with_its_provider_id_once(tmp_path, control_plane, registration_granted):
    hostname, provider_id, result = run_script(tmp_path, control_plane)
    assert result.returncode == 0, result.stderr
    assert node(control_plane, hostname)["spec"]["providerID"] == provider_id
    again = subprocess.run([sys.executable, str(tmp_path / "script"), str(tmp_path / "config.json"),
                            str(tmp_path / "instance-data.json")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already registered" in again.stderr
    assert control_plane.user_tokens[KUBELET_USER] not in result.stderr + again.stderr
    control_plane.request("DELETE", f"/api/v1/nodes/{hostname}")


def test_a_name_the_certificate_is_not_valid_for_is_refused_before_any_request(tmp_path, control_plane,
                                                                                registration_granted):
    hostname, _, result = run_script(tmp_path, control_plane, server_name="apiserver.invalid")
    assert result.returncode == 2 and "certificate not trusted" in result.stderr, result.stderr
    assert node(control_plane, hostname) is None


def test_only_the_given_ca_is_trusted(tmp_path, control_plane, registration_granted):
    other_ca = tmp_path / "other-ca.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "key"),
                    "-out", str(other_ca), "-days", "1", "-subj", f"/CN={TLS_SERVER_NAME}",
                    "-addext", f"subjectAltName=DNS:{TLS_SERVER_NAME},IP:127.0.0.1"], check=True, capture_output=True)
    hostname, _, result = run_script(tmp_path, control_plane, ca_file=other_ca)
    assert result.returncode == 2 and "certificate not trusted" in result.stderr, result.stderr
    assert node(control_plane, hostname) is None


@pytest.mark.parametrize("method, path", [("GET", "/api/v1/nodes"), ("GET", "/api/v1/secrets"),
                                          ("DELETE", "/api/v1/nodes/anything"), ("GET", "/api/v1/namespaces")])
def test_the_registering_user_may_do_nothing_else(control_plane, registration_granted, method, path):
    request = urllib.request.Request(control_plane.server + path, method=method,
                                     headers={"Authorization": f"Bearer {control_plane.user_tokens[KUBELET_USER]}"})
    context = ssl.create_default_context(cafile=str(control_plane.ca_file))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=context, timeout=10)
    assert refused.value.code == 403
