"""A booted guest registers its own Node, as kubelet would: its bootstrap data creates a Node named after its hostname
with the provider ID of its meta-data, through the API gateway in the libvirt host's namespace, TLS verified.

Real kube-apiserver, real libvirtd in its network namespace, the cached guest image, the operator running in the
test's event loop. There is no workload-cluster kubeconfig Secret, so the operator cannot touch Nodes: the Node and
its providerID come from the guest alone.
"""

from __future__ import annotations

import pathlib
import time
import uuid

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import naming
from capi_libvirt.devenv import capi_objects, node_registration
from capi_libvirt.devenv.api_gateway import ApiGateway
from guests import host_objects, machine_spec

from fixtures_control_plane import KUBELET_USER, operator_running
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROVISION_DEADLINE_S = 600.0  # TCG boot on a busy 2-core CI machine
REGISTRATION_DEADLINE_S = 300.0  # after provisioning: cloud-init's final stage runs the script
DELETE_DEADLINE_S = 120.0


@pytest.fixture
def api_gateway(libvirt_host, control_plane):
    with ApiGateway(libvirt_host, control_plane) as gateway:
        yield gateway


async def nodes_with_provider_id(core: client.CoreV1Api, provider_id: str) -> list[client.V1Node]:
    return [n for n in (await core.list_node()).items if n.spec.provider_id == provider_id]


async def test_guest_registers_its_node_through_the_gateway_with_tls_verified(
        control_plane, api_client, namespace, libvirt_host, guest_image, base_image_volume, api_gateway, caplog):
    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    node_registration.grant_node_registration(control_plane, KUBELET_USER)
    token = control_plane.user_tokens[KUBELET_USER]
    user_data = node_registration.registration_cloud_config(
        api_gateway.url, control_plane.ca_file.read_text(), api_gateway.tls_server_name, token)
    machine_name = f"worker-{uuid.uuid4().hex[:6]}"
    await capi_objects.create_cluster(api_client, namespace, "demo")
    made = await capi_objects.create_machine(api_client, namespace, "demo", machine_name, user_data,
                                             machine_spec(libvirt_host, guest_image, base_image_volume))

    async def get():
        return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                          made.libvirt_machine)

    async with operator_running(control_plane, {libvirt_host.name: libvirt_host.uri}):
        started, running_at = time.monotonic(), None

        async def provider_id_published():
            nonlocal running_at
            body = await get()
            if running_at is None and body.get("status", {}).get("state") == "running":
                running_at = time.monotonic()
            return body if body.get("spec", {}).get("providerID") else None

        body = await wait_until("the providerID", provider_id_published, PROVISION_DEADLINE_S, interval=0.5)
        provider_id = body["spec"]["providerID"]

        async def registered():
            return await nodes_with_provider_id(core, provider_id)

        nodes = await wait_until(f"a Node with providerID {provider_id}", registered,
                                 PROVISION_DEADLINE_S + REGISTRATION_DEADLINE_S, interval=1.0)
        registered_at = time.monotonic()
        print(f"\n[numbers] creation -> domain running: {(running_at or registered_at) - started:.1f}s; "
              f"domain running -> Node registered by the guest: {registered_at - (running_at or started):.1f}s; "
              f"gateway connections: {api_gateway.connections}")
        uid = body["metadata"]["uid"]
        domain_uuid = naming.domain_uuid(uid)
        assert provider_id == f"libvirt://{libvirt_host.name}/{domain_uuid}"
        assert [n.metadata.name for n in nodes] == [naming.hostname(machine_name)]
        assert api_gateway.connections >= 1, "the guest came through the gateway"

        # The guest did it, not the operator (it has no workload kubeconfig), and said so on its serial console.
        events = await core.list_namespaced_event(namespace)
        assert "NodeProviderIDSet" not in [e.reason for e in events.items]
        serial_log = pathlib.Path(libvirt_host.pool_dir) / naming.serial_log_file_name(namespace, machine_name, uid)
        console = serial_log.read_text(errors="replace") if serial_log.exists() else ""
        assert f"created Node {naming.hostname(machine_name)}" in console

        # The token is in the bootstrap Secret only: not in the status, the events, the console, or any log line.
        body = await get()
        assert token not in str(body) and token not in str([(e.reason, e.message) for e in events.items])
        assert token not in console
        assert not [r for r in caplog.records if token in r.getMessage()]

        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                      made.libvirt_machine)

        async def gone():
            try:
                await get()
                return False
            except client.exceptions.ApiException as error:
                return error.status == 404

        await wait_until("the LibvirtMachine to be gone (finalizer released)", gone, DELETE_DEADLINE_S)

    names = [naming.overlay_volume_name(namespace, machine_name, uid),
             naming.nocloud_volume_name(namespace, machine_name, uid),
             naming.serial_log_file_name(namespace, machine_name, uid)]
    assert host_objects(libvirt_host, domain_uuid, names) == []
    await core.delete_node(naming.hostname(machine_name))
