"""Where the Kubernetes API is and who the provider is there: a kubeconfig, or the pod's ServiceAccount.

One reading of them for every client of the process (kopf's watches, the operator's own requests, the CLI), as
client-go reads them:
- in a pod (KUBERNETES_SERVICE_HOST set) with no KUBECONFIG and no context asked for: the ServiceAccount's token
  (read again while the process runs, as the kubelet rotates it), its CA, its namespace, and the server at
  https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (not kubernetes.default.svc, a name only cluster DNS
  resolves);
- else $KUBECONFIG (a list of files, the first value of each name winning) or ~/.kube/config, its current context or
  the one asked for: the cluster's server and CA (file or data), the user's client certificate and key (files or
  data), token or token file, basic auth, or an exec credential plugin (client.authentication.k8s.io), with file paths
  read relative to the kubeconfig that names them.
A workload cluster's kubeconfig, read from a Secret a tenant may write, is taken with its inline data only: no file
of the operator's is opened and no command run on its word.
No network I/O here; `kube.client` makes the connections.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pathlib
import subprocess
from collections.abc import Mapping
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_ACCOUNT_NAMESPACE = str(SERVICE_ACCOUNT_DIR / "namespace")
EXEC_TIMEOUT_S = 60.0  # an exec credential plugin that says nothing in this time has failed


class KubeconfigError(Exception):
    """The kubeconfig (or the ServiceAccount) cannot say how to reach the API: absent, malformed, a missing context."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    """How to reach one API server. PEM data is bytes; a path is read when the connection is made."""

    server: str
    ca_path: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False  # insecure-skip-tls-verify: only where a kubeconfig says so
    certificate_path: str | None = None
    certificate_data: bytes | None = None
    key_path: str | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None  # read again while the process runs (a rotated ServiceAccount token)
    username: str | None = None
    password: str | None = None
    namespace: str | None = None  # the context's (or the ServiceAccount's) namespace
    exec_plugin: Mapping[str, Any] | None = None  # users[].user.exec, run for a token or a client certificate
    base_dir: str | None = None  # where the kubeconfig that named the exec plugin lies (its working directory)

    def __repr__(self) -> str:  # tokens, keys and passwords never in a log line or a traceback
        return f"Credentials(server={self.server!r}, namespace={self.namespace!r})"


def in_a_pod() -> bool:
    """Kubernetes sets KUBERNETES_SERVICE_HOST in every pod's environment."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def in_cluster(context: str | None = None) -> bool:
    """The ServiceAccount is the way in: in a pod, with no KUBECONFIG given and no kubeconfig context asked for."""
    return in_a_pod() and not os.environ.get("KUBECONFIG") and context is None


def in_cluster_server() -> str:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def service_account(folder: pathlib.Path = SERVICE_ACCOUNT_DIR) -> Credentials:
    token_file = folder / "token"
    if not token_file.exists():
        raise KubeconfigError(f"in a pod, but no ServiceAccount token at {token_file}")
    namespace_file = folder / "namespace"
    namespace = namespace_file.read_text(encoding="utf-8").strip() if namespace_file.exists() else None
    return Credentials(server=in_cluster_server(), ca_path=str(folder / "ca.crt"), token_file=str(token_file),
                       namespace=namespace or None)


def kubeconfig_paths() -> list[pathlib.Path]:
    listed = os.environ.get("KUBECONFIG")
    if listed:
        return [pathlib.Path(path).expanduser() for path in listed.split(os.pathsep) if path.strip()]
    return [pathlib.Path("~/.kube/config").expanduser()]


@dataclasses.dataclass
class _Merged:
    current: str | None = None
    entries: dict[str, dict[str, tuple[dict[str, Any], pathlib.Path]]] = dataclasses.field(
        default_factory=lambda: {"contexts": {}, "clusters": {}, "users": {}})


def _merge(paths: list[pathlib.Path]) -> _Merged:
    merged = _Merged()
    found = False
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except OSError as error:
            raise KubeconfigError(f"cannot read kubeconfig {path}: {error.strerror}") from None
        found = True
        try:
            config = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            raise KubeconfigError(f"kubeconfig {path} is not YAML") from None
        if not isinstance(config, dict):
            raise KubeconfigError(f"kubeconfig {path} is not a mapping")
        merged.current = merged.current or config.get("current-context") or None
        for section, field in (("contexts", "context"), ("clusters", "cluster"), ("users", "user")):
            for item in config.get(section) or []:
                if isinstance(item, dict) and isinstance(item.get("name"), str):
                    merged.entries[section].setdefault(item["name"], (item.get(field) or {}, path.parent))
    if not found:
        raise KubeconfigError(f"no kubeconfig: none of {', '.join(map(str, paths))} exists")
    return merged


def from_kubeconfig(context: str | None = None, paths: list[pathlib.Path] | None = None) -> Credentials:
    merged = _merge(paths if paths is not None else kubeconfig_paths())
    name = context or merged.current
    if not name:
        raise KubeconfigError("the kubeconfig names no current context")
    if name not in merged.entries["contexts"]:
        raise KubeconfigError(f"context {name!r} not found in the kubeconfig")
    chosen, _ = merged.entries["contexts"][name]
    cluster_name, user_name = chosen.get("cluster"), chosen.get("user")
    if cluster_name not in merged.entries["clusters"]:
        raise KubeconfigError(f"context {name!r} names cluster {cluster_name!r}, which the kubeconfig lacks")
    cluster, cluster_dir = merged.entries["clusters"][cluster_name]
    if user_name and user_name not in merged.entries["users"]:
        raise KubeconfigError(f"context {name!r} names user {user_name!r}, which the kubeconfig lacks")
    user, user_dir = merged.entries["users"][user_name] if user_name else ({}, cluster_dir)
    return _credentials(cluster, user, chosen.get("namespace"), files=(cluster_dir, user_dir))


def from_kubeconfig_data(config: Any) -> Credentials:
    """A kubeconfig read from somewhere a tenant may write (a workload cluster's `<cluster>-kubeconfig` Secret): its
    current context, with inline data only. A file path, a token file or an exec plugin in it is refused."""
    if not isinstance(config, dict):
        raise KubeconfigError("the kubeconfig is not a mapping")

    def named(section: str, field: str, name: Any) -> dict[str, Any]:
        for item in config.get(section) or []:
            if isinstance(item, dict) and item.get("name") == name:
                value = item.get(field) or {}
                return value if isinstance(value, dict) else {}
        raise KubeconfigError(f"the kubeconfig has no {field} {name!r}")

    context = named("contexts", "context", config.get("current-context"))
    cluster = named("clusters", "cluster", context.get("cluster"))
    user = named("users", "user", context.get("user")) if context.get("user") else {}
    return _credentials(cluster, user, context.get("namespace"), files=None)


def _pem(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode("".join(str(value).split()), validate=True)  # line breaks allowed, as client-go does
    except ValueError:
        raise KubeconfigError(f"the kubeconfig's {what} is not base64") from None


def _credentials(cluster: dict[str, Any], user: dict[str, Any], namespace: Any,
                 files: tuple[pathlib.Path, pathlib.Path] | None) -> Credentials:
    """`files`: the folders the cluster's and the user's paths are relative to; None: no file or command allowed."""
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"the kubeconfig's cluster has no http(s) server (it says {server!r})")
    local = [key for key in ("certificate-authority", "client-certificate", "client-key", "tokenFile", "exec")
             if key in cluster or key in user]
    if files is None and local:
        raise KubeconfigError(f"the kubeconfig names {', '.join(local)}: only inline data is taken from it")
    both = [key for key, where in (("certificate-authority", cluster), ("client-certificate", user),
                                   ("client-key", user)) if where.get(key) and where.get(f"{key}-data")]
    if both:
        raise KubeconfigError(f"the kubeconfig gives both a file and data for {', '.join(both)}")
    cluster_dir, user_dir = files or (pathlib.Path("."), pathlib.Path("."))

    def path(value: Any, folder: pathlib.Path) -> str | None:
        return None if not value else str(folder / pathlib.Path(str(value)).expanduser())

    exec_plugin = user.get("exec")
    if exec_plugin is not None and not (isinstance(exec_plugin, dict) and exec_plugin.get("command")):
        raise KubeconfigError("the kubeconfig's exec plugin names no command")
    return Credentials(
        server=server.rstrip("/"),
        ca_path=path(cluster.get("certificate-authority"), cluster_dir),
        ca_data=_pem(cluster["certificate-authority-data"], "certificate-authority-data")
        if cluster.get("certificate-authority-data") else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        certificate_path=path(user.get("client-certificate"), user_dir),
        certificate_data=_pem(user["client-certificate-data"], "client-certificate-data")
        if user.get("client-certificate-data") else None,
        key_path=path(user.get("client-key"), user_dir),
        key_data=_pem(user["client-key-data"], "client-key-data") if user.get("client-key-data") else None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=path(user.get("tokenFile"), user_dir),
        username=user.get("username"), password=user.get("password"),
        namespace=str(namespace) if namespace else None,
        exec_plugin=exec_plugin, base_dir=str(user_dir) if exec_plugin else None)


@dataclasses.dataclass(frozen=True)
class ExecCredential:
    """What an exec plugin answered: a token, or a client certificate and key (PEM)."""

    token: str | None = None
    certificate_data: bytes | None = None
    key_data: bytes | None = None

    def __repr__(self) -> str:
        return "ExecCredential(<hidden>)"


def run_exec_plugin(credentials: Credentials) -> ExecCredential:
    """Run the kubeconfig's exec plugin (blocking: callers in the event loop run it in a thread)."""
    plugin = credentials.exec_plugin or {}
    api_version = plugin.get("apiVersion") or "client.authentication.k8s.io/v1"
    environment = dict(os.environ)
    for item in plugin.get("env") or []:
        if not isinstance(item, dict) or "name" not in item or "value" not in item:
            raise KubeconfigError("the kubeconfig's exec plugin has an env entry without a name and a value")
        environment[str(item["name"])] = str(item["value"])
    environment["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}})
    command = [str(plugin["command"]), *map(str, plugin.get("args") or [])]
    try:
        done = subprocess.run(command, env=environment, cwd=credentials.base_dir, capture_output=True,
                              timeout=EXEC_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise KubeconfigError(f"exec credential plugin {command[0]!r} failed: {type(error).__name__}") from None
    if done.returncode != 0:
        raise KubeconfigError(f"exec credential plugin {command[0]!r} exited with {done.returncode}")
    try:
        status = json.loads(done.stdout)["status"]
        if not isinstance(status, dict):
            raise TypeError(status)
    except (ValueError, KeyError, TypeError):
        raise KubeconfigError(f"exec credential plugin {command[0]!r} did not answer an ExecCredential") from None
    certificate, key = status.get("clientCertificateData"), status.get("clientKeyData")
    if not status.get("token") and not (certificate and key):
        raise KubeconfigError(f"exec credential plugin {command[0]!r} answered no token and no certificate")
    return ExecCredential(token=str(status["token"]) if status.get("token") else None,
                          certificate_data=str(certificate).encode() if certificate else None,
                          key_data=str(key).encode() if key else None)


def load(context: str | None = None) -> Credentials:
    """The process's way to its management cluster's API."""
    return service_account() if in_cluster(context) else from_kubeconfig(context)


def default_namespace(context: str | None = None) -> str:
    """The namespace kubectl would use: the kubeconfig context's (the current one, or `context`), in a pod the
    ServiceAccount's, else `default`."""
    if in_cluster(context):
        try:
            return pathlib.Path(SERVICE_ACCOUNT_NAMESPACE).read_text(encoding="utf-8").strip() or "default"
        except OSError:
            return "default"
    return from_kubeconfig(context).namespace or "default"
