"""cluster-autoscaler on the whole cluster (tests/e2e/test_whole_cluster.py), in the layout config/autoscaler
describes for a workload cluster of its own: `--kubeconfig` is the `<cluster>-kubeconfig` Cluster API wrote (through
the endpoint), the management side is reached as a user bound only to config/autoscaler's ClusterRole and Role (in
place of the in-cluster ServiceAccount), and its status ConfigMap and leader Lease live in the workload cluster's
`cluster-autoscaler` namespace.

A second MachineDeployment of the cluster, the autoscaler flavor's (`<cluster>-autoscaled`: min 0 / max 1, no
replicas, no capacity annotations), is sized at zero from LibvirtMachineTemplate.status.capacity. The cluster's own
MachineDeployment is scaled to 0 first (its worker drained and deleted), so a Pending Pod that needs most of a 1-CPU
machine can only run on a new one (the control plane is tainted): cluster-autoscaler scales 0 -> 1, the VM joins through the endpoint, the Pod runs there; once the Pod is deleted the Node is unneeded and
it scales back to 0, Cluster API drains and deletes the Node, and the VM leaves nothing on the host. One machine, not
two as on the test API server: a third and fourth TCG guest beside the control-plane VM on 2 cores starve its API
server.
"""

from __future__ import annotations

import asyncio
import copy
import pathlib

import yaml
from kubernetes_asyncio import client

from capi_libvirt.api import meta, templates
from day2_rollouts import DEPLOYMENT_LABEL, endpoint_answers, workload_read, workload_write
from devenv import autoscaling
from guests import provider_objects
from kubeadm_workers import by_kind, create, is_ready, libvirt_machines, machines

from fixtures_control_plane import AUTOSCALER_USER, REPO
from waiting import Clock, Pending, wait_until

N = 1
AUTOSCALER_NAMESPACE = "cluster-autoscaler"  # config/autoscaler's
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"  # built into the node image, never pulled
POD_CPU = "600m"  # more than half a 1-CPU machine: one Pod per machine
POD_MEMORY = "32Mi"
POD_NAMESPACE = "default"
# Leader election that outlasts the workload API server's stalls under TCG (a minute or more): with the defaults (15 s
# lease, 10 s renew deadline) cluster-autoscaler exits with "lost master" at the first one. If it exits anyway (it also
# exits when its first Node list fails), it is started again, as its Deployment's kubelet would, and counted.
LEADER_ELECTION = {"leader-elect-lease-duration": "5m", "leader-elect-renew-deadline": "4m",
                   "leader-elect-retry-period": "5s"}
SCALE_UP_DEADLINE_S = 1500.0  # cluster-autoscaler's scan, then a TCG boot and kubeadm join beside the control plane
SCALE_DOWN_DEADLINE_S = 900.0  # unneeded time, scale-down delays, drain, deletion


def bind_autoscaler_roles(plane, namespace: str) -> None:
    """The ClusterRole and the Role users apply with config/autoscaler (the Role in `namespace`), bound to the test's
    autoscaler user and nothing more."""
    documents = list(yaml.safe_load_all((REPO / "config" / "autoscaler" / "cluster-autoscaler.yaml").read_text()))
    [cluster_role] = [d for d in documents if d["kind"] == "ClusterRole"]
    [role] = [d for d in documents if d["kind"] == "Role"]
    role["metadata"]["namespace"] = namespace
    plane.grant(cluster_role, AUTOSCALER_USER)
    plane.grant(role, AUTOSCALER_USER)


def autoscaled_workers(flavor_documents: list[dict], cluster: str, namespace: str) -> list[dict]:
    """The autoscaler flavor's worker objects (`<cluster>-md-0`) as a second MachineDeployment of the cluster,
    `<cluster>-autoscaled`, its maximum N."""
    workers = copy.deepcopy([d for d in flavor_documents if d["metadata"]["name"] == f"{cluster}-md-0"])
    assert sorted(d["kind"] for d in workers) == ["KubeadmConfigTemplate", "LibvirtMachineTemplate",
                                                   "MachineDeployment"], workers
    name = f"{cluster}-autoscaled"
    for document in workers:
        document["metadata"]["name"] = name
    deployment = by_kind(workers)["MachineDeployment"]
    assert deployment["metadata"]["annotations"] == {templates.AUTOSCALER_MIN: "0", templates.AUTOSCALER_MAX: "5"}
    assert "replicas" not in deployment["spec"], deployment["spec"]
    deployment["metadata"]["annotations"][templates.AUTOSCALER_MAX] = str(N)
    spec = deployment["spec"]["template"]["spec"]
    spec["infrastructureRef"]["name"] = spec["bootstrap"]["configRef"]["name"] = name
    assert deployment["metadata"]["namespace"] == namespace
    return workers


def pod(name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "needs-a-machine"}),
        spec=client.V1PodSpec(containers=[client.V1Container(
            name="work", image=PAUSE_IMAGE, image_pull_policy="Never",
            resources=client.V1ResourceRequirements(requests={"cpu": POD_CPU, "memory": POD_MEMORY}))]))


def unmet_conditions(pod: client.V1Pod) -> list[tuple[str, str | None]]:
    """A Pod's conditions that are not True, with their messages (the scheduler's says which Nodes it could not use
    and why: a taint, too little CPU), for a timeout's "last seen"."""
    return [(c.type, (c.message or c.reason or "")[:300]) for c in pod.status.conditions or [] if c.status != "True"]


async def autoscale_from_zero_and_back(api: client.ApiClient, workload_api: client.ApiClient, plane,
                                       flavor_documents: list[dict], cluster: str, namespace: str,
                                       workload_kubeconfig: pathlib.Path, host, base_volume: str, memo,
                                       clock: Clock, scaled_to_zero: asyncio.Event | None = None) -> str:
    """The module docstring's run; returns its phases. `scaled_to_zero` is set once cluster-autoscaler has set the
    MachineDeployment's replicas to 0, for a caller that runs something else beside the drain and the deletion that
    follow (another machine of the cluster may then be made, not yet on the host)."""
    objects = client.CustomObjectsApi(api)
    core = client.CoreV1Api(workload_api)
    bind_autoscaler_roles(plane, namespace)
    workers = autoscaled_workers(flavor_documents, cluster, namespace)
    name = by_kind(workers)["MachineDeployment"]["metadata"]["name"]
    await create(api, workers)

    async def deployment() -> dict:
        return await objects.get_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                          "machinedeployments", name)

    async def template_capacity():
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                          "libvirtmachinetemplates", name)
        return (body.get("status") or {}).get("capacity")

    # Cluster API starts an autoscaled MachineDeployment at its minimum; the provider publishes capacity.
    assert (await wait_until("Cluster API's defaulting of replicas", deployment, 60))["spec"]["replicas"] == 0
    capacity = await wait_until("the template's capacity", template_capacity, 120)
    template = by_kind(workers)["LibvirtMachineTemplate"]["spec"]["template"]["spec"]
    assert (capacity["cpu"], capacity["memory"]) == (str(template["cpus"]), f"{template['memoryMiB']}Mi"), capacity

    await workload_write(f"the workload cluster's {AUTOSCALER_NAMESPACE} namespace", lambda: core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=AUTOSCALER_NAMESPACE)), _request_timeout=10),
        done_if=(409,))
    phases = Clock()
    # The cluster's own workers scaled to 0 first (drained, deleted, their VMs gone), so a Pending Pod can only run
    # on a new machine; and the idle worker's VM (0.6 of a host core under TCG on 2026-12-06, beside the control
    # plane's 1.1) no longer slows the new machine's boot and join.
    own = f"{cluster}-md-0"
    await objects.patch_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "machinedeployments",
                                                 own, {"spec": {"replicas": 0}},
                                                 _content_type="application/merge-patch+json")

    async def own_workers_gone():
        left = [m["metadata"]["name"] for m in await machines(api, namespace)
                if (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == own]
        return True if not left else Pending(machines=left)

    await wait_until(f"{own} scaled to 0, its Machines drained and gone", own_workers_gone, SCALE_DOWN_DEADLINE_S,
                     interval=2.0)
    phases.mark(f"{own} scaled to 0 (its worker drained, deleted, its VM gone)")
    autoscaler = autoscaling.ClusterAutoscaler(plane, workload_kubeconfig, [namespace], AUTOSCALER_NAMESPACE,
                                               timings={**autoscaling.AUTOSCALER_TIMINGS, **LEADER_ELECTION},
                                               management_kubeconfig=plane.kubeconfig_for(AUTOSCALER_USER))
    restarts = 0

    def keep_it_running() -> None:
        nonlocal restarts
        restarts += autoscaler.restarted_if_exited()

    await wait_until("the workload API server answering", lambda: asyncio.to_thread(
        endpoint_answers, workload_kubeconfig), 600.0, interval=2.0)
    with autoscaler:
        for i in range(N):
            await workload_write("a Pod created", lambda i=i: core.create_namespaced_pod(
                POD_NAMESPACE, pod(f"work-{i}"), _request_timeout=10), done_if=(409,))
        phases.mark("Pods pending")

        def of_autoscaled(found: list[dict]) -> list[dict]:
            return [m for m in found if (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == name]

        async def scaled_up():
            keep_it_running()
            if (await deployment())["spec"].get("replicas") == N:
                phases.mark(f"replicas {N} (cluster-autoscaler scaled up)")
            found = of_autoscaled(await machines(api, namespace))
            running = [m for m in found if (m.get("status") or {}).get("phase") == "Running"]
            if len(running) == N:
                phases.mark(f"{N} Machine(s) Running (joined through the endpoint)")
            pods = await workload_read(core.list_namespaced_pod(POD_NAMESPACE, label_selector="app=needs-a-machine",
                                                                _request_timeout=10))
            if isinstance(pods, Pending):
                return pods
            nodes = {(m.get("status") or {}).get("nodeRef", {}).get("name") for m in running}
            on_new = [p for p in pods.items if p.status.phase == "Running" and p.spec.node_name in nodes]
            if len(on_new) == N:
                return on_new
            return Pending(machines=[(m["metadata"]["name"], (m.get("status") or {}).get("phase")) for m in found],
                           pods=[(p.metadata.name, p.status.phase, p.spec.node_name, unmet_conditions(p))
                                 for p in pods.items])

        await wait_until(f"{N} Pod(s) running on {N} new machine(s)", scaled_up, SCALE_UP_DEADLINE_S, interval=2.0)
        phases.mark(f"{N} Pod(s) running on the new machine(s)")
        clock.mark(f"cluster-autoscaler scaled 0 -> {N}")
        [new] = of_autoscaled(await machines(api, namespace))
        node = await wait_until("the new Node read", lambda: workload_read(core.read_node(
            new["status"]["nodeRef"]["name"], _request_timeout=10)), 300.0, interval=3.0)
        infra = {m["metadata"]["name"]: m for m in await libvirt_machines(api, namespace)}
        assert node.spec.provider_id == infra[new["spec"]["infrastructureRef"]["name"]]["spec"]["providerID"]
        assert is_ready(node), node.status.conditions

        async def pods_deleted():
            return await workload_read(core.delete_collection_namespaced_pod(
                POD_NAMESPACE, label_selector="app=needs-a-machine", grace_period_seconds=0, _request_timeout=10))

        await wait_until("the Pods deleted", pods_deleted, 300.0, interval=3.0)
        phases.mark("Pods deleted (scale-down requested)")
        new_infra = new["spec"]["infrastructureRef"]["name"]

        async def scaled_down():
            keep_it_running()
            if (await deployment())["spec"].get("replicas") == 0:
                phases.mark("replicas 0 (cluster-autoscaler scaled down)")
                if scaled_to_zero is not None:
                    scaled_to_zero.set()
            left = of_autoscaled(await machines(api, namespace))
            if not left:
                phases.mark("the Machine gone")
            nodes = await workload_read(core.list_node(_request_timeout=10))
            if isinstance(nodes, Pending):
                return nodes
            node_left = [n.metadata.name for n in nodes.items if n.metadata.name == node.metadata.name]
            vm_left = [v for v in provider_objects(host, base_volume) if new_infra in v]
            if not left and not node_left and not vm_left:
                return True
            return Pending(machines=[m["metadata"]["name"] for m in left], node=node_left, on_host=vm_left)

        await wait_until("scale down to 0, the Node and the VM gone", scaled_down, SCALE_DOWN_DEADLINE_S,
                         interval=2.0)
        phases.mark("the Node and the VM gone (host clean of it)")
        clock.mark(f"cluster-autoscaler scaled {N} -> 0")
        assert autoscaler.refusals() == [], "cluster-autoscaler was refused something: RBAC is missing a rule"
        # It led (its Lease) and reported (its status ConfigMap) in the workload cluster's namespace of its own.
        for read in (lambda: core.read_namespaced_config_map("cluster-autoscaler-status", AUTOSCALER_NAMESPACE,
                                                             _request_timeout=10),
                     lambda: client.CoordinationV1Api(workload_api).read_namespaced_lease(
                         "cluster-autoscaler", AUTOSCALER_NAMESPACE, _request_timeout=10)):
            await wait_until("its status ConfigMap and Lease read", lambda read=read: workload_read(read()), 120.0,
                             interval=3.0)
    # The provider's inventory agrees: the machine is no longer counted on the host, and each domain it counts is a
    # LibvirtMachine's that exists (a machine made beside the scale-down may have no domain yet).
    probe = (await memo.runtime.deps.inventory.probe(host.name)).probe
    owners = {(owner_namespace, owner) for owner_namespace, owner, _, _ in probe.machine_domains}
    existing = {(namespace, m["metadata"]["name"]) for m in await libvirt_machines(api, namespace)}
    assert probe.machines == len(owners) and (namespace, new_infra) not in owners and owners <= existing, \
        (probe.machines, owners, existing)
    return f"{phases.report()}\n  cluster-autoscaler started again after exiting: {restarts} time(s)"
