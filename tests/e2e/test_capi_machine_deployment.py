"""The Cluster API way, end to end: the real Cluster API core controller turns a MachineDeployment of 2 replicas
into Machines and LibvirtMachines, the operator (as the RBAC-restricted user of config/rbac) boots the VMs, each VM's
bootstrap data registers its own Node with its providerID through the API gateway in the libvirt host's namespace
(standing in for kubelet), and the Machines become Running. Scaling to 0 leaves nothing on the host; deleting the
Cluster (after scaling back to 1) removes every object and VM.

The workload cluster's control plane is the test API server itself (devenv/workload_cluster.py).
"""

from __future__ import annotations

import time

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.devenv import capi_objects, node_registration, workload_cluster
from capi_libvirt.devenv.api_gateway import ApiGateway
from guests import machine_spec, provider_objects

from fixtures_control_plane import KUBELET_USER, operator_running
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

SCALE_UP_DEADLINE_S = 900.0  # two TCG boots side by side on a busy 2-core CI machine
SCALE_DOWN_DEADLINE_S = 300.0
DEPLOYMENT = "workers"


async def _list(api: client.ApiClient, namespace: str, group: str, version: str, plural: str) -> list[dict]:
    listing = await client.CustomObjectsApi(api).list_namespaced_custom_object(group, version, namespace, plural)
    return listing["items"]


async def machines(api: client.ApiClient, namespace: str) -> list[dict]:
    return await _list(api, namespace, meta.CAPI_GROUP, meta.CAPI_VERSION, "machines")


async def libvirt_machines(api: client.ApiClient, namespace: str) -> list[dict]:
    return await _list(api, namespace, meta.GROUP, meta.VERSION, "libvirtmachines")


async def test_machine_deployment_2_then_0_then_cluster_deleted(
        control_plane, capi_controller, api_client, namespace, libvirt_host, guest_image, base_image_volume):
    core = client.CoreV1Api(api_client)
    assert provider_objects(libvirt_host, base_image_volume) == [], "the host is clean before the run"
    workload_cluster.install(control_plane)
    node_registration.grant_node_registration(control_plane, KUBELET_USER)
    spec = machine_spec(libvirt_host, guest_image, base_image_volume)

    with ApiGateway(libvirt_host, control_plane) as gateway:
        user_data = node_registration.registration_cloud_config(
            gateway.url, control_plane.ca_file.read_text(), gateway.tls_server_name,
            control_plane.user_tokens[KUBELET_USER])
        cluster = await workload_cluster.create_worker_cluster(api_client, control_plane, namespace, "e2e")
        await capi_objects.create_bootstrap_secret(api_client, namespace, cluster.name, "workers-bootstrap", user_data)

        async with operator_running(control_plane, {libvirt_host.name: libvirt_host.uri}):
            started = time.monotonic()
            await workload_cluster.create_machine_deployment(api_client, cluster, DEPLOYMENT, spec,
                                                             "workers-bootstrap", replicas=2)

            async def two_running_with_nodes():
                found = await machines(api_client, namespace)
                running = [m for m in found if m.get("status", {}).get("phase") == "Running"
                           and m["status"].get("nodeRef", {}).get("name")]
                return found if len(found) == 2 and len(running) == 2 else None

            running = await wait_until("2 Machines Running with their Nodes", two_running_with_nodes,
                                       SCALE_UP_DEADLINE_S, interval=2.0)
            scaled_up = time.monotonic()

            # Each Machine's providerID is its LibvirtMachine's, and its Node (registered by the guest itself)
            # carries the same providerID.
            by_name = {lm["metadata"]["name"]: lm for lm in await libvirt_machines(api_client, namespace)}
            assert len(by_name) == 2
            for machine in running:
                infra = by_name[machine["spec"]["infrastructureRef"]["name"]]
                assert infra["metadata"]["ownerReferences"][0]["uid"] == machine["metadata"]["uid"]
                assert machine["spec"]["providerID"] == infra["spec"]["providerID"]
                assert machine["spec"]["providerID"].startswith(f"libvirt://{libvirt_host.name}/")
                node = await core.read_node(machine["status"]["nodeRef"]["name"])
                assert node.spec.provider_id == machine["spec"]["providerID"]
            assert gateway.connections >= 2, "both guests came through the gateway"
            on_host = provider_objects(libvirt_host, base_image_volume)
            assert len([o for o in on_host if o.startswith("domain ")]) == 2, on_host

            await workload_cluster.scale(api_client, cluster, DEPLOYMENT, 0)
            scale_down_requested = time.monotonic()

            async def nothing_left():
                return (not await machines(api_client, namespace) and not await libvirt_machines(api_client, namespace)
                        and provider_objects(libvirt_host, base_image_volume) == [])

            await wait_until("every Machine, LibvirtMachine, domain and volume gone", nothing_left,
                             SCALE_DOWN_DEADLINE_S, interval=1.0)
            scaled_down = time.monotonic()
            node_names = {m["status"]["nodeRef"]["name"] for m in running}
            remaining = {n.metadata.name for n in (await core.list_node()).items} & node_names
            assert remaining == set(), "Cluster API deleted the Machines' Nodes"
            print(f"\n[numbers] MachineDeployment 0 -> 2 (create -> 2 Machines Running with Nodes): "
                  f"{scaled_up - started:.1f}s; 2 -> 0 (scale request -> host clean): "
                  f"{scaled_down - scale_down_requested:.1f}s; total {scaled_down - started:.1f}s")

            # Deleting the Cluster takes everything with it, a machine in flight included.
            await workload_cluster.scale(api_client, cluster, DEPLOYMENT, 1)
            await wait_until("a domain for the new replica", lambda: _has_domain(libvirt_host, base_image_volume),
                             SCALE_UP_DEADLINE_S)
            await client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
                meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "clusters", cluster.name)

            async def cluster_gone():
                left = {
                    plural: await _list(api_client, namespace, group, version, plural)
                    for group, version, plural in [
                        (meta.CAPI_GROUP, meta.CAPI_VERSION, "clusters"),
                        (meta.CAPI_GROUP, meta.CAPI_VERSION, "machinedeployments"),
                        (meta.CAPI_GROUP, meta.CAPI_VERSION, "machinesets"),
                        (meta.CAPI_GROUP, meta.CAPI_VERSION, "machines"),
                        (meta.GROUP, meta.VERSION, "libvirtmachines"),
                        (meta.GROUP, meta.VERSION, "libvirtclusters"),
                    ]
                }
                return not any(left.values()) and provider_objects(libvirt_host, base_image_volume) == []

            await wait_until("the Cluster and everything of it gone, host clean", cluster_gone,
                             SCALE_DOWN_DEADLINE_S, interval=1.0)


async def _has_domain(host, base_volume: str) -> bool:
    return any(item.startswith("domain ") for item in provider_objects(host, base_volume))
