"""How kopf logs in to the Kubernetes API: with the same credentials as the operator's own client (kube.kubeconfig).

In a pod the ServiceAccount (its token read again at each login, so a rotated token is picked up), elsewhere the
kubeconfig, relative paths and exec plugins included. kopf's own `login_with_kubeconfig` reads only a kubeconfig's
current context, without either, and its `login_with_service_account` connects to kubernetes.default.svc, a name only
cluster DNS resolves (a pod on the host network without it would never connect).
"""

from __future__ import annotations

import asyncio
import base64

import kopf

from capi_libvirt.kube import kubeconfig


def _text(data: bytes | None) -> str | None:
    """kopf takes PEM data base64-encoded, as a kubeconfig's *-data fields are."""
    return base64.b64encode(data).decode("ascii") if data else None


def connection_info(credentials: kubeconfig.Credentials,
                    exec_credential: kubeconfig.ExecCredential | None = None) -> kopf.ConnectionInfo:
    certificate = exec_credential.certificate_data if exec_credential and exec_credential.certificate_data else None
    key = exec_credential.key_data if certificate and exec_credential else None
    token = exec_credential.token if exec_credential and exec_credential.token else credentials.token
    if token is None and credentials.token_file is not None:
        with open(credentials.token_file, encoding="utf-8") as file:
            token = file.read().strip()
    return kopf.ConnectionInfo(
        server=credentials.server, ca_path=credentials.ca_path, ca_data=_text(credentials.ca_data),
        insecure=credentials.insecure or None,
        certificate_path=None if certificate else credentials.certificate_path,
        certificate_data=_text(certificate or credentials.certificate_data),
        private_key_path=None if key else credentials.key_path, private_key_data=_text(key or credentials.key_data),
        username=credentials.username, password=credentials.password,
        scheme="Bearer" if token else None, token=token, default_namespace=credentials.namespace)


def _login() -> kopf.ConnectionInfo:
    credentials = kubeconfig.load()
    exec_credential = kubeconfig.run_exec_plugin(credentials) if credentials.exec_plugin is not None else None
    return connection_info(credentials, exec_credential)


async def connection() -> kopf.ConnectionInfo:
    """Read in a thread: files, and an exec plugin's command, are blocking work."""
    return await asyncio.to_thread(_login)
