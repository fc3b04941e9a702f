"""Bootstrap data that stands in for kubelet: the booted guest registers its own Node with the test API server.

`registration_cloud_config()` builds a cloud-config (a dict dumped by pyyaml, never a template) that writes three
files and runs one of them at the end of the first boot:

- the API server's CA certificate (the only certificate the guest will trust),
- a root-only JSON file with the API URL, the TLS server name and the bearer token,
- a small python3 script (the guest image has python3 for cloud-init, not curl) that creates a Node named after the
  guest's hostname (meta-data `local-hostname`) whose `spec.providerID` is the meta-data's `provider-id`, read from
  cloud-init's /run/cloud-init/instance-data.json.

TLS: the script connects to the URL's address (the API gateway in the libvirt host's namespace) and verifies the
server's certificate against that CA alone, for the configured server name (like kubeconfig's tls-server-name),
before the token is ever sent. A certificate that does not verify ends the script at once; an unreachable server is
retried until a deadline. The token is never printed.

`grant_node_registration()` gives a user of the local control plane exactly what the script needs: create and get
Nodes.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from capi_libvirt.devenv.control_plane import LocalControlPlane

CA_PATH = "/etc/capi-libvirt/apiserver-ca.crt"
CONFIG_PATH = "/etc/capi-libvirt/node-registration.json"
SCRIPT_PATH = "/usr/local/sbin/capi-libvirt-register-node"
CLUSTER_ROLE = "capi-libvirt-node-registration"

REGISTER_SCRIPT = r'''#!/usr/bin/env python3
"""Stand-in for kubelet's registration: create this machine's Node, with the provider ID of its meta-data.

Usage: capi-libvirt-register-node [CONFIG [INSTANCE_DATA]]. CONFIG (JSON): server (https URL), serverName (the name
the certificate must be valid for), caFile, token. Exit 0 once the Node exists with this provider ID.
"""
import http.client
import json
import os
import socket
import ssl
import sys
import time
import urllib.parse

CONFIG = "/etc/capi-libvirt/node-registration.json"
INSTANCE_DATA = "/run/cloud-init/instance-data.json"
DEADLINE_S = 900


def log(message):
    print(f"capi-libvirt-register-node: {message}", file=sys.stderr, flush=True)


class VerifiedConnection(http.client.HTTPSConnection):
    """HTTPS to the server's address; the certificate must verify for `server_name`, not for that address."""

    def __init__(self, host, port, context, server_name):
        super().__init__(host, port, timeout=15, context=context)
        self.tls_context, self.server_name = context, server_name

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self.tls_context.wrap_socket(sock, server_hostname=self.server_name)


def identity(instance_data_path):
    """(hostname, provider ID) from cloud-init's instance data: the NoCloud meta-data as the provider wrote it."""
    with open(instance_data_path) as file:
        data = json.load(file)
    meta = data["ds"]["meta_data"]
    hostname = meta.get("local-hostname") or data["v1"]["local_hostname"]
    return hostname, meta["provider-id"]


def request(config, context, method, path, body=None):
    url = urllib.parse.urlsplit(config["server"])
    connection = VerifiedConnection(url.hostname, url.port or 443, context, config["serverName"])
    headers = {"Authorization": "Bearer " + config["token"], "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    try:
        return response.status, json.loads(payload)
    except ValueError:
        return response.status, {}


def resources():
    """What kubelet reports of the machine: its CPUs, its memory and a pod count."""
    with open("/proc/meminfo") as file:
        memory_kib = next(int(line.split()[1]) for line in file if line.startswith("MemTotal:"))
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{memory_kib}Ki", "pods": "110"}


def register(config, context, hostname, provider_id):
    """True once the Node is there with our provider ID, False to try again; raises when it never can be."""
    labels = {"kubernetes.io/hostname": hostname, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": hostname, "labels": labels},
            "spec": {"providerID": provider_id},
            "status": {"capacity": resources(), "allocatable": resources()}}
    status, answer = request(config, context, "POST", "/api/v1/nodes", node)
    if status == 201:
        log(f"created Node {hostname} with providerID {provider_id}")
        return True
    if status == 409:
        status, answer = request(config, context, "GET", "/api/v1/nodes/" + hostname)
        found = answer.get("spec", {}).get("providerID") if status == 200 else None
        if found == provider_id:
            log(f"Node {hostname} already registered with providerID {provider_id}")
            return True
        raise RuntimeError(f"Node {hostname} exists with providerID {found!r} (HTTP {status})")
    log(f"HTTP {status}: {answer.get('message', '')}")
    if status in (401, 403):
        raise RuntimeError(f"refused: HTTP {status}")
    return False


def main():
    config_path = sys.argv[1] if len(sys.argv) > 1 else CONFIG
    instance_data = sys.argv[2] if len(sys.argv) > 2 else INSTANCE_DATA
    with open(config_path) as file:
        config = json.load(file)
    context = ssl.create_default_context(cafile=config["caFile"])  # this CA only; hostname checked
    hostname, provider_id = identity(instance_data)
    log(f"registering Node {hostname} (providerID {provider_id}) at {config['server']} as {config['serverName']}")
    deadline, attempt = time.monotonic() + DEADLINE_S, 0
    while True:
        attempt += 1
        try:
            if register(config, context, hostname, provider_id):
                return 0
        except ssl.SSLCertVerificationError as error:
            log(f"certificate not trusted, giving up: {error}")
            return 2
        except RuntimeError as error:
            log(f"giving up: {error}")
            return 1
        except (OSError, http.client.HTTPException) as error:
            log(f"attempt {attempt}: {type(error).__name__}: {error}")
        if time.monotonic() > deadline:
            log(f"giving up after {DEADLINE_S} s")
            return 1
        time.sleep(min(2 * attempt, 10))


if __name__ == "__main__":
    sys.exit(main())
'''


def registration_config(server: str, server_name: str, token: str, ca_path: str = CA_PATH) -> dict[str, str]:
    """The script's configuration file (it holds the token: written root-only)."""
    return {"server": server, "serverName": server_name, "caFile": ca_path, "token": token}


def registration_cloud_config(server: str, ca_pem: str, server_name: str, token: str) -> str:
    """cloud-config writing the CA, the configuration and the script, and running the script once networking is up
    (runcmd runs in cloud-init's final stage). `server` is the https URL the guest reaches, `server_name` a name the
    server's certificate is valid for, `token` the registering user's bearer token."""
    config = json.dumps(registration_config(server, server_name, token), indent=2) + "\n"
    document = {
        "write_files": [
            {"path": CA_PATH, "owner": "root:root", "permissions": "0644", "content": ca_pem},
            {"path": CONFIG_PATH, "owner": "root:root", "permissions": "0600", "content": config},
            {"path": SCRIPT_PATH, "owner": "root:root", "permissions": "0755", "content": REGISTER_SCRIPT},
        ],
        "runcmd": [["python3", SCRIPT_PATH]],
    }
    return "#cloud-config\n" + yaml.dump(document, Dumper=BlockStyleDumper, sort_keys=False, default_flow_style=False)


class BlockStyleDumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings as literal blocks (readable seeds); others as SafeDumper does."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


BlockStyleDumper.add_representer(str, _represent_str)


def node_registration_role() -> dict[str, Any]:
    """The ClusterRole of the kubelet stand-in: create a Node, and read one (to see that it is already there)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": CLUSTER_ROLE},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "get"]}],
    }


def grant_node_registration(plane: LocalControlPlane, user: str) -> None:
    """Bind the ClusterRole (created or replaced) to `user`, one of the control plane's token users."""
    plane.grant(node_registration_role(), user)
