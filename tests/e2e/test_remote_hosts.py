"""Machines booted on hosts reached the way users reach theirs: qemu+ssh (host key verified) and qemu+tls (server
certificate verified, client certificate presented), both through LibvirtHost objects and their credentials Secrets.

One libvirtd in its own network namespace serves both transports (devenv.remote_access): the operator knows it only
as two LibvirtHosts, `remote-ssh` and `remote-tls`, whose URIs name its address on the link into that namespace. A
machine pinned to each is created at once; each must be placed on its host, have its overlay made and its NoCloud ISO
streamed over that transport, boot, run its bootstrap data, get an address from the host's network, and be deleted
leaving nothing on the host.
"""

from __future__ import annotations

import asyncio
import base64
import pathlib
import shutil
import uuid

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import naming
from capi_libvirt.hypervisor.connection import THREADS_PER_HOST
from declared_host import credentials, host_uri
from devenv import base_image, capi_objects
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost
from guests import host_access, host_objects, machine_spec

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from prereq import require
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SUBNET, LINK = "192.168.153.0/24", 153
PROVISION_DEADLINE_S = 600.0
DELETE_DEADLINE_S = 120.0
TRANSPORTS = ("ssh", "tls")


@pytest.fixture(scope="module")
def remote_host(guest_image):
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost("e2e-remote", SUBNET), link_index=LINK) as access:
        with access.host.connect() as conn:  # the test's own setup, over the host's local socket
            volume = base_image.upload_base_image(conn, access.host.pool_name, guest_image)
        yield access, volume


async def test_machines_boot_and_are_deleted_over_qemu_ssh_and_qemu_tls(
        control_plane, api_client, namespace, remote_host, guest_image):
    access, volume = remote_host
    host = access.host
    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    await capi_objects.create_cluster(api_client, namespace, "remote", infrastructure_kind="ProxmoxCluster")
    machines, markers = {}, {}
    for transport in TRANSPORTS:  # credentials in the provider's namespace, the only one they may be in
        await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name=f"remote-{transport}"),
            data={k: base64.b64encode(v).decode() for k, v in credentials(access, transport).items()}))
        await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": f"remote-{transport}"},
            "spec": {"uri": host_uri(access, transport), "storagePool": host.pool_name,
                     "access": host_access(machine_spec(host, guest_image, volume)),
                     "credentialsSecretRef": {"name": f"remote-{transport}", "namespace": PROVIDER_NAMESPACE}}})
    async with operator_running(control_plane, {}) as memo:
        try:
            for transport in TRANSPORTS:
                markers[transport] = f"marker-{transport}-{uuid.uuid4().hex[:10]}"
                spec = machine_spec(host, guest_image, volume) | {"host": f"remote-{transport}"}
                machines[transport] = await capi_objects.create_machine(
                    api_client, namespace, "remote", f"over-{transport}-{uuid.uuid4().hex[:5]}",
                    capi_objects.marker_user_data(markers[transport]), spec)

            async def get(transport):
                return await objects.get_namespaced_custom_object(
                    meta.GROUP, meta.VERSION, namespace, "libvirtmachines", machines[transport].libvirt_machine)

            async def provisioned(transport):
                async def check():
                    body = await get(transport)
                    return body if body.get("status", {}).get("initialization", {}).get("provisioned") else None
                return await wait_until(f"the machine over qemu+{transport} provisioned", check,
                                        PROVISION_DEADLINE_S, interval=1.0)

            bodies = dict(zip(TRANSPORTS, await asyncio.gather(*(provisioned(t) for t in TRANSPORTS)), strict=True))
            deps = memo.runtime.deps
            for transport, body in bodies.items():
                name = f"remote-{transport}"
                connection = deps.hosts.get(name)
                assert connection.uri == host_uri(access, transport), connection.uri
                assert 1 <= connection.opened <= THREADS_PER_HOST, "a connection per pool thread at most, reused"
                domain_uuid = naming.domain_uuid(body["metadata"]["uid"])
                assert body["spec"]["providerID"] == f"libvirt://{name}/{domain_uuid}"
                assert body["status"]["host"] == name and body["status"]["state"] == "running"
                internal = [a["address"] for a in body["status"]["addresses"] if a["type"] == "InternalIP"]
                assert internal and all(a.startswith("192.168.153.") for a in internal), body["status"]["addresses"]
                with host.connect() as conn:  # the domain really is on that libvirtd, running
                    assert conn.lookupByUUIDString(domain_uuid).isActive() == 1

            # The bootstrap data came through the ISO each transport streamed: its marker on the serial console.
            for transport, made in machines.items():
                uid = bodies[transport]["metadata"]["uid"]
                serial_log = pathlib.Path(host.pool_dir) / naming.serial_log_file_name(namespace, made.machine, uid)

                async def marker_logged(serial_log=serial_log, marker=markers[transport]):
                    return serial_log.exists() and marker in serial_log.read_text(errors="replace")

                await wait_until(f"the bootstrap marker over qemu+{transport}", marker_logged,
                                 PROVISION_DEADLINE_S, 2.0)

            for made in machines.values():
                await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                              "libvirtmachines", made.libvirt_machine)
            for transport in TRANSPORTS:
                async def gone(transport=transport):
                    try:
                        await get(transport)
                        return False
                    except client.exceptions.ApiException as error:
                        return error.status == 404
                await wait_until(f"the machine over qemu+{transport} deleted", gone, DELETE_DEADLINE_S)
        finally:  # while the operator runs, so it releases the hosts' finalizers
            for transport in TRANSPORTS:
                await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts",
                                                           f"remote-{transport}")

    for transport, made in machines.items():
        uid = bodies[transport]["metadata"]["uid"]
        names = [naming.overlay_volume_name(namespace, made.machine, uid),
                 naming.nocloud_volume_name(namespace, made.machine, uid),
                 naming.serial_log_file_name(namespace, made.machine, uid)]
        assert host_objects(host, naming.domain_uuid(uid), names) == [], f"left on the host over qemu+{transport}"
