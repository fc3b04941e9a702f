"""Day 2 on a whole cluster (tests/e2e/test_whole_cluster.py): a MachineDeployment rollout (to a new
LibvirtMachineTemplate, or from a changed ClusterClass variable), waiting on 1-second snapshots of the Machines and the workload Nodes and asserting the order
Cluster API promises (the new machine serves before the old one is deleted); and the workload reads those snapshots
are made of, which say what they saw (a Pending) while the workload API server does not answer through the endpoint."""

from __future__ import annotations

import base64
import pathlib
import ssl
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import yaml
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from devenv.libvirt_host import LibvirtHost
from guests import provider_objects
from kubeadm_workers import is_ready, libvirt_machines, machines

from waiting import Clock, Pending, wait_until

DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
ROLLOUT_DEADLINE_S = 1500.0  # a TCG boot and kubeadm join beside the other pytest worker, then a drain
DELETE_DEADLINE_S = 600.0

T = TypeVar("T")


def endpoint_answers(kubeconfig: pathlib.Path) -> bool:
    """/readyz of the workload API server through the endpoint, TLS verified against the cluster CA the kubeconfig
    carries (an anonymous request: an answer, even 401/403, proves TLS and the address)."""
    cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    context = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(f"{cluster['server']}/readyz", timeout=5) as response:
            return response.status == 200
    except urllib.error.HTTPError as error:
        return error.code in (401, 403)
    except OSError:
        return False


async def workload_read(call: Awaitable[T]) -> T | Pending:
    """A read of the workload API server through the endpoint; a Pending naming the error while it does not answer
    (restarting under load, or the endpoint moving: the caller's next poll asks again)."""
    try:
        return await call
    except (TimeoutError, aiohttp.ClientError) as error:
        return Pending(workload_api_server=f"{type(error).__name__}: {error}")
    except client.ApiException as error:
        if error.status >= 500:
            return Pending(workload_api_server=f"HTTP {error.status}: {error.reason}")
        raise


async def workload_snapshot(workload_api: client.ApiClient) -> tuple[dict[str, client.V1Node], set[str]] | Pending:
    """The workload cluster's Nodes by name and the Nodes whose etcd Pod runs (or a Pending, as workload_read)."""
    core = client.CoreV1Api(workload_api)
    listed = await workload_read(core.list_node(_request_timeout=10))
    if isinstance(listed, Pending):
        return listed
    pods = await workload_read(core.list_namespaced_pod("kube-system", label_selector="component=etcd",
                                                        _request_timeout=10))
    if isinstance(pods, Pending):
        return pods
    nodes = {n.metadata.name: n for n in listed.items}
    return nodes, {p.spec.node_name for p in pods.items if p.status.phase == "Running" and p.spec.node_name in nodes}


def machine_states(found: list[dict], nodes: dict[str, client.V1Node]) -> list[str]:
    """Each Machine as `name phase [node Ready|NotReady|missing] [deleting]`, for a Pending."""
    states = []
    for machine in found:
        node = _node_of(machine)
        state = f"{machine['metadata']['name']} {(machine.get('status') or {}).get('phase')}"
        if node:
            state += f" node {node} " + ("missing" if node not in nodes else
                                         "Ready" if is_ready(nodes[node]) else "NotReady")
        if machine["metadata"].get("deletionTimestamp"):
            state += " deleting"
        states.append(state)
    return states


def _node_of(machine: dict) -> str | None:
    return ((machine.get("status") or {}).get("nodeRef") or {}).get("name")


async def _new_template(objects: client.CustomObjectsApi, namespace: str, name: str, changes: dict) -> str:
    """A copy `<name>-v2` of the LibvirtMachineTemplate `name` with `changes` in its machine spec (templates are
    immutable, so a new shape is a new template); its name."""
    old = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates",
                                                     name)
    spec = old["spec"]
    spec["template"]["spec"].update(changes)
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachinetemplates", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate",
        "metadata": {"name": f"{name}-v2", "namespace": namespace}, "spec": spec})
    return f"{name}-v2"


def a_new_template(api: client.ApiClient, namespace: str, deployment: str,
                   memory_mib: int) -> Callable[[], Awaitable[None]]:
    """The change that rolls a MachineDeployment of our own: a new LibvirtMachineTemplate of `memory_mib`, and the
    MachineDeployment pointed at it."""
    objects = client.CustomObjectsApi(api)

    async def change() -> None:
        name = await _new_template(objects, namespace, deployment, {"memoryMiB": memory_mib})
        await objects.patch_namespaced_custom_object(
            meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "machinedeployments", deployment,
            {"spec": {"template": {"spec": {"infrastructureRef": {"name": name}}}}},
            _content_type="application/merge-patch+json")

    return change


async def roll_the_workers(api: client.ApiClient, workload_api: client.ApiClient, namespace: str, deployment: str,
                           change: Callable[[], Awaitable[None]], memory_mib: int, host: LibvirtHost,
                           base_volume: str, clock: Clock) -> str:
    """`change` made (a new template, or a ClusterClass variable), the MachineDeployment `deployment` rolls: a new
    Machine joins, of `memory_mib`, and its Node is Ready while the old Machine is not yet being deleted, then the old
    Machine, its Node and its VM go, leaving nothing on the host. Returns the phases."""
    def of_deployment(found: list[dict]) -> list[dict]:
        return [m for m in found if (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == deployment]

    [before] = of_deployment(await machines(api, namespace))
    old_infra = before["spec"]["infrastructureRef"]["name"]  # the LibvirtMachine, whose name its VM and files carry
    await change()
    rolled = Clock()
    rolled_out = _replacement(api, workload_api, namespace, of_deployment, before, rolled)
    replaced = await wait_until("the workers rolled", rolled_out, ROLLOUT_DEADLINE_S, interval=1.0)
    infra = {m["metadata"]["name"]: m for m in await libvirt_machines(api, namespace)}
    assert infra[replaced["spec"]["infrastructureRef"]["name"]]["spec"]["memoryMiB"] == memory_mib
    await _wait_vm_gone(host, base_volume, old_infra, "the old worker's VM gone from the host")
    rolled.mark("the old worker's VM, disk and ISO gone from the host")
    clock.mark("the workers rolled")
    return rolled.report()


def _replacement(api: client.ApiClient, workload_api: client.ApiClient, namespace: str,
                 select: Callable[[list[dict]], list[dict]], before: dict,
                 rolled: Clock) -> Callable[[], Awaitable[dict | Pending]]:
    """The poll of a rollout of one worker among those `select` picks: the new Machine once it serves (Running, its
    Node Ready) and the old Machine and Node are gone. Asserts that the old one was not being deleted before the new
    one served; marks the phases on `rolled`."""
    old_uid, old_node = before["metadata"]["uid"], _node_of(before)

    async def poll() -> dict | Pending:
        found = select(await machines(api, namespace))
        snapshot = await workload_snapshot(workload_api)
        if isinstance(snapshot, Pending):
            return snapshot
        nodes, _ = snapshot
        new = [m for m in found if m["metadata"]["uid"] != old_uid]
        serving = [m for m in new if (m.get("status") or {}).get("phase") == "Running" and _node_of(m) in nodes
                   and is_ready(nodes[_node_of(m)])]
        if new:
            rolled.mark("a new worker Machine")
        if serving:
            rolled.mark("its Node Ready (joined through the endpoint)")
        old_left = [m for m in found if m["metadata"]["uid"] == old_uid]
        if not old_left or old_left[0]["metadata"].get("deletionTimestamp"):
            assert serving, "the old worker was being deleted before the new one's Node was Ready"
            rolled.mark("the old Machine being deleted")
        if old_left or old_node in nodes or len(serving) != 1:
            return Pending(machines=machine_states(found, nodes))
        rolled.mark("the old Machine and Node gone")
        return serving[0]

    return poll


async def _wait_vm_gone(host: LibvirtHost, base_volume: str, infra_name: str, what: str) -> None:
    async def gone():
        return all(infra_name not in name for name in provider_objects(host, base_volume))

    await wait_until(what, gone, DELETE_DEADLINE_S, interval=2.0)
