"""How the operator logs in to the Kubernetes API: in a pod with its ServiceAccount, elsewhere with a kubeconfig.

In a pod (KUBERNETES_SERVICE_HOST set, no KUBECONFIG) the server is https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT,
as client-go's in-cluster configuration has it and as the operator's own client (kube.api) connects. kopf's
`login_with_service_account` would use https://kubernetes.default.svc instead, a name only cluster DNS resolves:
a pod on the host network without it, or a manager run outside a pod with the in-cluster files, would never connect.
"""

from __future__ import annotations

import os
import pathlib

import kopf

SERVICE_ACCOUNT_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")


def in_cluster_server() -> str:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def service_account_connection(folder: pathlib.Path = SERVICE_ACCOUNT_DIR) -> kopf.ConnectionInfo:
    """The ServiceAccount's token (read again at each login, so a rotated token is picked up), CA and namespace."""
    token = (folder / "token").read_text(encoding="utf-8").strip()
    namespace_file = folder / "namespace"
    namespace = namespace_file.read_text(encoding="utf-8").strip() if namespace_file.exists() else None
    return kopf.ConnectionInfo(server=in_cluster_server(), ca_path=str(folder / "ca.crt"), scheme="Bearer",
                               token=token, default_namespace=namespace)
