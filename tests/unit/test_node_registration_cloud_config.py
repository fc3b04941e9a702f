"""The kubelet stand-in's cloud-config: plain YAML from a dict, the token only in a root-only file, a script that
compiles, and a role that grants nothing but creating and reading Nodes."""

from __future__ import annotations

import json

import pytest
import yaml

from capi_libvirt.devenv import node_registration as nr

pytestmark = pytest.mark.unit

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
TOKEN = "0123456789abcdef-token"


def cloud_config() -> str:
    return nr.registration_cloud_config("https://192.168.122.1:6443", CA, "kubernetes.default.svc", TOKEN)


def files(text: str) -> dict[str, dict]:
    return {entry["path"]: entry for entry in yaml.safe_load(text)["write_files"]}


def test_is_a_cloud_config_writing_the_ca_the_config_and_the_script_and_running_the_script():
    text = cloud_config()
    assert text.startswith("#cloud-config\n")
    written = files(text)
    assert written[nr.CA_PATH]["content"] == CA
    assert written[nr.SCRIPT_PATH]["content"] == nr.REGISTER_SCRIPT
    assert written[nr.SCRIPT_PATH]["permissions"] == "0755"
    assert yaml.safe_load(text)["runcmd"] == [["python3", nr.SCRIPT_PATH]]


def test_the_token_is_only_in_the_root_only_config_file():
    written = files(cloud_config())
    config = json.loads(written[nr.CONFIG_PATH]["content"])
    assert config == {"server": "https://192.168.122.1:6443", "serverName": "kubernetes.default.svc",
                      "caFile": nr.CA_PATH, "token": TOKEN}
    assert written[nr.CONFIG_PATH]["permissions"] == "0600"
    assert [path for path, entry in written.items() if TOKEN in entry["content"]] == [nr.CONFIG_PATH]
    assert yaml.safe_load(cloud_config())["runcmd"] == [["python3", nr.SCRIPT_PATH]]  # never in a command line


@pytest.mark.parametrize("hostile", ["x\nruncmd: [reboot]", "'; reboot; '", "{{ ds.meta_data }}"])
def test_values_cannot_add_yaml_of_their_own(hostile):
    document = yaml.safe_load(nr.registration_cloud_config(hostile, CA, hostile, hostile))
    assert set(document) == {"write_files", "runcmd"}
    assert json.loads(files(nr.registration_cloud_config(hostile, CA, "n", "t"))[nr.CONFIG_PATH]["content"])[
        "server"] == hostile


def test_the_script_compiles():
    compile(nr.REGISTER_SCRIPT, nr.SCRIPT_PATH, "exec")


def test_the_role_creates_and_reads_nodes_and_nothing_else():
    assert nr.node_registration_role()["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "get"]}]
