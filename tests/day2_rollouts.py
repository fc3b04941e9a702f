"""Day 2 on a whole cluster (tests/e2e/test_whole_cluster.py): a MachineDeployment rollout (from a changed ClusterClass
variable, to the new LibvirtMachineTemplate the topology controller writes) and a rollout of the control-plane
machine (the KubeadmControlPlane's `spec.rollout.after`), each waiting on 1-second snapshots of the Machines and the
workload Nodes and asserting the order Cluster API promises (the new machine serves before the old one is deleted;
for the control plane, etcd then runs on the new machine only), the control plane's while the endpoint is asked
every second and its failed answers counted; and the workload reads those snapshots are made of, which say what they
saw (a Pending) while the workload API server does not answer through the endpoint."""

from __future__ import annotations

import asyncio
import base64
import datetime
import pathlib
import ssl
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import yaml
from kubernetes_asyncio import client

from capi_libvirt.api import meta, templates
from devenv.libvirt_host import LibvirtHost
from guests import provider_objects
from kubeadm_workers import is_ready, libvirt_machines, machines

from waiting import Clock, Pending, wait_until

DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
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
    (restarting under load, or the endpoint moving; or 429 "storage is (re)initializing" from an API server that just
    started beside a changing etcd membership): the caller's next poll asks again."""
    try:
        return await call
    except (TimeoutError, aiohttp.ClientError) as error:
        return Pending(workload_api_server=f"{type(error).__name__}: {error}")
    except client.ApiException as error:
        if error.status >= 500 or error.status == 429:
            return Pending(workload_api_server=f"HTTP {error.status}: {error.reason}")
        raise


async def workload_write(what: str, call: Callable[[], Awaitable[object]], *, done_if: tuple[int, ...] = (),
                         deadline_s: float = 300.0) -> object:
    """A write to the workload API server, made again while it does not answer (as workload_read); an answer with a
    status in `done_if` counts as done (409 for a create whose earlier try reached the server before its answer was
    lost, 404 for a delete). Every other refusal fails the test."""
    async def attempt() -> object:
        try:
            answered = await workload_read(call())
        except client.ApiException as error:
            if error.status in done_if:
                return True
            raise
        return answered if isinstance(answered, Pending) else (answered or True)

    return await wait_until(what, attempt, deadline_s, interval=3.0)


async def workload_snapshot(workload_api: client.ApiClient) -> tuple[dict[str, client.V1Node], set[str]] | Pending:
    """The workload cluster's Nodes by name and the nodes with a Running etcd Pod, whether their Node object is still
    there or not (or a Pending, as workload_read)."""
    core = client.CoreV1Api(workload_api)
    listed = await workload_read(core.list_node(_request_timeout=10))
    if isinstance(listed, Pending):
        return listed
    pods = await workload_read(core.list_namespaced_pod("kube-system", label_selector="component=etcd",
                                                        _request_timeout=10))
    if isinstance(pods, Pending):
        return pods
    nodes = {n.metadata.name: n for n in listed.items}
    return nodes, {p.spec.node_name for p in pods.items if p.status.phase == "Running"}


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


async def roll_the_workers(api: client.ApiClient, workload_api: client.ApiClient, namespace: str, deployment: str,
                           change: Callable[[], Awaitable[None]], memory_mib: int, host: LibvirtHost,
                           base_volume: str, clock: Clock) -> str:
    """`change` made (a ClusterClass variable), the MachineDeployment `deployment` rolls: a new
    Machine joins, of `memory_mib`, and its Node is Ready while the old Machine is not yet being deleted, then the old
    Machine, its Node and its VM go, leaving nothing on the host. Returns the phases."""
    def of_deployment(found: list[dict]) -> list[dict]:
        return [m for m in found if (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == deployment]

    [before] = of_deployment(await machines(api, namespace))
    old_infra = before["spec"]["infrastructureRef"]["name"]  # the LibvirtMachine, whose name its VM and files carry
    await change()
    rolled = Clock()
    rolled_out = _replacement(api, workload_api, namespace, of_deployment, before, rolled, "worker")
    replaced = await wait_until("the workers rolled", rolled_out, ROLLOUT_DEADLINE_S, interval=1.0)
    infra = {m["metadata"]["name"]: m for m in await libvirt_machines(api, namespace)}
    assert infra[replaced["spec"]["infrastructureRef"]["name"]]["spec"]["memoryMiB"] == memory_mib
    await _wait_vm_gone(host, base_volume, old_infra, "the old worker's VM gone from the host")
    rolled.mark("the old worker's VM, disk and ISO gone from the host")
    clock.mark("the workers rolled")
    return rolled.report()


def _replacement(api: client.ApiClient, workload_api: client.ApiClient, namespace: str,
                 select: Callable[[list[dict]], list[dict]], before: dict, rolled: Clock,
                 role: str) -> Callable[[], Awaitable[dict | Pending]]:
    """The poll of a rollout of one `role` machine (worker, control-plane) among those `select` picks: the new Machine
    once it serves (Running, its Node Ready; a control-plane one also running etcd, the only etcd left) and the old
    Machine and Node are gone. Asserts that the old one was not being deleted before the new one served; marks the
    phases on `rolled`."""
    old_uid, old_node = before["metadata"]["uid"], _node_of(before)

    async def poll() -> dict | Pending:
        found = select(await machines(api, namespace))
        snapshot = await workload_snapshot(workload_api)
        if isinstance(snapshot, Pending):
            return snapshot
        nodes, etcd_nodes = snapshot
        new = [m for m in found if m["metadata"]["uid"] != old_uid]
        joined = [m for m in new if (m.get("status") or {}).get("phase") == "Running" and _node_of(m) in nodes]
        # A worker serves once its Node is Ready; a control-plane machine once its etcd member runs (what KCP checks
        # before it removes the old one; its Node's readiness also waits for the pod network on it).
        serving = [m for m in joined if (_node_of(m) in etcd_nodes if role == "control-plane"
                                         else is_ready(nodes[_node_of(m)]))]
        ready = [m for m in serving if is_ready(nodes[_node_of(m)])]
        if new:
            rolled.mark(f"a new {role} Machine")
        if serving:
            rolled.mark("its Node Ready (joined through the endpoint)" if role != "control-plane" else
                        "its etcd member running (joined through the endpoint)")
        if ready and role == "control-plane":
            rolled.mark("its Node Ready")
        old_left = [m for m in found if m["metadata"]["uid"] == old_uid]
        if not old_left or old_left[0]["metadata"].get("deletionTimestamp"):
            assert serving, f"the old {role} machine was being deleted before the new one served"
            rolled.mark("the old Machine being deleted")
        pending = Pending(machines=machine_states(found, nodes), etcd_on=sorted(etcd_nodes))
        if old_left or old_node in nodes or len(ready) != 1:
            return pending
        if role == "control-plane":
            if etcd_nodes != {_node_of(ready[0])}:
                return pending
            rolled.mark("the old Machine and Node gone, etcd on the new machine only")
        else:
            rolled.mark("the old Machine and Node gone")
        return ready[0]

    return poll


class EndpointProbe:
    """Asks the workload API server through the endpoint while it runs (`async with`), a second after each answer:
    how many asks, which failed, when (seconds from the start) and how long the failed asks took in all (an ask that
    gets no answer waits up to endpoint_answers' 5 s)."""

    def __init__(self, kubeconfig: pathlib.Path) -> None:
        self.kubeconfig = kubeconfig
        self.asked = 0
        self.failed: list[float] = []
        self.failing_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            at = loop.time()
            try:
                answered = await asyncio.to_thread(endpoint_answers, self.kubeconfig)
            except Exception:  # noqa: BLE001 - any broken answer (a reset mid-response) is a failed ask
                answered = False
            self.asked += 1
            if not answered:
                self.failed.append(round(at - started, 1))
                self.failing_s += loop.time() - at
            await asyncio.sleep(max(0.0, 1.0 - (loop.time() - at)))

    async def __aenter__(self) -> EndpointProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def report(self) -> str:
        return (f"  the endpoint asked {self.asked} times (/readyz, 5 s timeout, 1 s after each answer): "
                f"{len(self.failed)} failed, {self.failing_s:.0f} s of failed asks in all"
                + (f", at {self.failed} s" if self.failed else ""))


async def roll_the_control_plane(api: client.ApiClient, workload_api: client.ApiClient, namespace: str,
                                 kubeconfig: pathlib.Path, host: LibvirtHost, base_volume: str, clock: Clock) -> str:
    """The KubeadmControlPlane's `spec.rollout.after` set to now: KCP makes a new control-plane Machine, whose VM
    joins through the endpoint (`kubeadm join --control-plane`: its etcd member, its static pods), then removes the
    old one's etcd member and deletes it; the endpoint moves to the new VM. Asserted: the new Machine serves (Running,
    Node Ready, etcd running) before the old one is deleted, then etcd runs on the new one only and the old VM leaves
    nothing on the host; the endpoint answers at the end. The endpoint is asked every second throughout, and the
    failed answers are reported with the phases."""
    objects = client.CustomObjectsApi(api)

    def of_control_plane(found: list[dict]) -> list[dict]:
        return [m for m in found if CONTROL_PLANE_LABEL in (m["metadata"].get("labels") or {})]

    [before] = of_control_plane(await machines(api, namespace))
    old_infra = before["spec"]["infrastructureRef"]["name"]
    [kcp] = (await objects.list_namespaced_custom_object(templates.CONTROLPLANE_GROUP, meta.CAPI_VERSION, namespace,
                                                         "kubeadmcontrolplanes"))["items"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rolled = Clock()
    async with EndpointProbe(kubeconfig) as probe:
        await objects.patch_namespaced_custom_object(
            templates.CONTROLPLANE_GROUP, meta.CAPI_VERSION, namespace, "kubeadmcontrolplanes",
            kcp["metadata"]["name"], {"spec": {"rollout": {"after": now}}},
            _content_type="application/merge-patch+json")
        rolled_out = _replacement(api, workload_api, namespace, of_control_plane, before, rolled, "control-plane")
        await wait_until("the control plane rolled", rolled_out, ROLLOUT_DEADLINE_S, interval=1.0)
        await _wait_vm_gone(host, base_volume, old_infra, "the old control-plane VM gone from the host")
        rolled.mark("the old control-plane VM, disk and ISO gone from the host")
        await wait_until("the endpoint answering after the rollout",
                         lambda: asyncio.to_thread(endpoint_answers, kubeconfig), ROLLOUT_DEADLINE_S, interval=2.0)
        rolled.mark("the endpoint answers (held by the new control-plane VM)")
    clock.mark("the control plane rolled")
    return f"{rolled.report()}\n{probe.report()}"


async def _wait_vm_gone(host: LibvirtHost, base_volume: str, infra_name: str, what: str) -> None:
    async def gone():
        return all(infra_name not in name for name in provider_objects(host, base_volume))

    await wait_until(what, gone, DELETE_DEADLINE_S, interval=2.0)
