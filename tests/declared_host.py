"""The whole cluster's host as a user declares it (the README's quick start): a LibvirtHost over `qemu+ssh://` or
`qemu+tls://` with its credentials Secret in the provider's namespace, its access rules letting the cluster's
namespace use the node image, the machines' network and nothing else, and send from the control-plane endpoint
(`allowedAddresses`); the operator running as its least-privilege user with no host of its own, so it reaches the
hypervisor only through that object, as `capi-libvirt console-log` does.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator

from kubernetes_asyncio import client

from capi_libvirt.api import meta
from devenv import control_plane as cp
from devenv.remote_access import RemoteAccess

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from waiting import wait_until

RELEASE_DEADLINE_S = 120.0


def credentials(access: RemoteAccess, transport: str) -> dict[str, bytes]:
    """A credentials Secret's data for `transport` (ssh or tls), as the book's host page lists it: the client's key
    and the host's known_hosts line, or the CA and the client's certificate and key."""
    if transport == "ssh":
        return {"ssh-privatekey": access.ssh_key.read_bytes(), "known_hosts": access.known_hosts.read_bytes()}
    if transport == "tls":
        folder = access.client_dir
        return {"ca.crt": (folder / "cacert.pem").read_bytes(), "tls.crt": (folder / "clientcert.pem").read_bytes(),
                "tls.key": (folder / "clientkey.pem").read_bytes()}
    raise ValueError(f"transport {transport!r}: ssh or tls")


def host_uri(access: RemoteAccess, transport: str) -> str:
    """The URI a LibvirtHost gives for `transport`: no query, the credentials come from its Secret."""
    return f"qemu+ssh://root@{access.address}/system" if transport == "ssh" else f"qemu+tls://{access.address}/system"


def host_object(name: str, uri: str, pool: str, network: str, namespace: str, base_volume: str,
                endpoint: str) -> dict:
    return {"apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
            "spec": {"uri": uri, "storagePool": pool,
                     "credentialsSecretRef": {"name": name, "namespace": PROVIDER_NAMESPACE},
                     "access": {"namespaces": [namespace], "images": [base_volume], "networks": [network],
                                "allowedAddresses": [{"namespaces": [namespace], "cidrs": [f"{endpoint}/32"]}]}}}


@contextlib.asynccontextmanager
async def operator_on_a_declared_host(control_plane: cp.LocalControlPlane, api: client.ApiClient,
                                      access: RemoteAccess, transport: str, namespace: str, base_volume: str,
                                      endpoint: str) -> AsyncIterator[str]:
    """The Secret and the LibvirtHost (named as the test host) made, the operator running with no host of its own;
    yields the URI. On the way out the LibvirtHost is deleted while the operator still runs (it releases the
    finalizer), then the Secret."""
    host = access.host
    uri, data = host_uri(access, transport), credentials(access, transport)
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=host.name),
        data={key: base64.b64encode(value).decode() for key, value in data.items()}))
    try:
        async with operator_running(control_plane, {}):
            await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", host_object(
                host.name, uri, host.pool_name, host.network_name, namespace, base_volume, endpoint))
            failed = True
            try:
                yield uri
                failed = False
            finally:
                await release(objects, host.name, failed)
    finally:
        await core.delete_namespaced_secret(host.name, PROVIDER_NAMESPACE)


async def release(objects: client.CustomObjectsApi, name: str, failed: bool) -> None:
    """The LibvirtHost deleted and its finalizer released by the operator. After a failed test machines may still hold
    it (HostInUse): its finalizer is then taken off, so the next test can declare the host again, and the test's own
    failure is the one reported."""
    await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)

    async def released() -> bool:
        listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
        return name not in {item["metadata"]["name"] for item in listed["items"]}
    try:
        await wait_until("the LibvirtHost released", released, RELEASE_DEADLINE_S)
    except TimeoutError:
        if not failed:
            raise
        await objects.patch_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name,
                                                  {"metadata": {"finalizers": None}},
                                                  _content_type="application/merge-patch+json")
