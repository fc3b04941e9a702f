"""cluster-autoscaler scales a libvirt MachineDeployment 0 -> N -> 0, on real parts, with nothing left behind.

The test API server (management and workload cluster at once, prepared for `kubeadm join` by kubeadm's own phases),
kube-scheduler, kube-controller-manager (node lifecycle, CSR approval and signing, bootstrap signer), the real Cluster
API core and kubeadm bootstrap controllers (webhooks and conversion on), the real cluster-autoscaler with its
clusterapi provider (as a user bound only to config/autoscaler's ClusterRole and Role), the operator (as the user bound
only to config/rbac), and libvirtd booting the node image, whose cloud-init (written by the kubeadm bootstrap provider)
runs `kubeadm join`: real kubelets register the Nodes and run the Pods (the image's own pause image, nothing pulled).

cluster-autoscaler runs in config/autoscaler's layout for a workload cluster of its own: `--kubeconfig` is the
`<cluster>-kubeconfig` Secret Cluster API reads, the management side is reached as a user bound only to
config/autoscaler's ClusterRole and Role, and its status ConfigMap and leader Lease live in the workload cluster's
`cluster-autoscaler` namespace (both sides are the test API server here).

The workers are the autoscaler flavor's, from `clusterctl generate cluster`: a MachineDeployment with min 0 / max N
and no replicas and no capacity annotations, so cluster-autoscaler sizes it from
LibvirtMachineTemplate.status.capacity. Pending Pods that each need most of a machine's CPU make it scale up to N;
once they run and are deleted, the Nodes are unneeded and it scales down to 0. Each phase's time is printed.

This is the autoscaler's one proof. The whole cluster (tests/e2e/test_whole_cluster.py) ran it too, 0 -> 1 -> 0, until
the CI-budget issue: every minute there keeps its control-plane VM busy on both cores, while this module runs in the
first pytest run, whose cores are a third idle; N = 2 here also proves the sizing (one Pod per 1-CPU machine) that
one machine could not, and joins through an endpoint are proven by the whole cluster's own workers.
"""

from __future__ import annotations

import base64

import pytest
import yaml
from kubernetes_asyncio import client

from capi_libvirt.api import meta, templates
from devenv import autoscaling, node_joins, workload_cluster
from guests import provider_objects
from kubeadm_workers import WORKER_MEMORY_MIB, assert_joined_by_kubelet, by_kind, create, is_ready, worker_objects

from fixtures_control_plane import AUTOSCALER_USER, REPO, operator_running
from waiting import Clock, Pending, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

N = 2
CLUSTER = "autoscaled"
SCALE_UP_DEADLINE_S = 1200.0  # cluster-autoscaler's scan, then N TCG boots side by side on a busy 2-core machine
SCALE_DOWN_DEADLINE_S = 600.0  # unneeded time, scale-down delays, drain, deletion
AUTOSCALER_NAMESPACE = "cluster-autoscaler"  # config/autoscaler's, in the workload cluster
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"  # built into the node image, never pulled
POD_CPU = "600m"  # more than half a 1-CPU machine: one Pod per machine
POD_MEMORY = "32Mi"


def bind_autoscaler_roles(plane, namespace: str) -> None:
    """The ClusterRole and the Role users apply with config/autoscaler (the Role in `namespace`), bound to the test's
    autoscaler user and nothing more."""
    documents = list(yaml.safe_load_all((REPO / "config" / "autoscaler" / "cluster-autoscaler.yaml").read_text()))
    [cluster_role] = [d for d in documents if d["kind"] == "ClusterRole"]
    [role] = [d for d in documents if d["kind"] == "Role"]
    role["metadata"]["namespace"] = namespace
    plane.grant(cluster_role, AUTOSCALER_USER)
    plane.grant(role, AUTOSCALER_USER)


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


async def test_cluster_autoscaler_scales_a_machine_deployment_from_zero_to_n_and_back(
        control_plane, capi_controller, kubeadm_bootstrap_controller, api_client, namespace, libvirt_host,
        node_base_volume, repository, tmp_path):
    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    assert provider_objects(libvirt_host, node_base_volume) == [], "the host is clean before the run"
    assert not (await core.list_node()).items, "no Node is left from an earlier run"
    workload_cluster.install(control_plane)
    bind_autoscaler_roles(control_plane, namespace)

    with node_joins.accepting_joins(control_plane, libvirt_host) as gateway, autoscaling.KubeScheduler(control_plane):
        endpoint = (str(gateway.address), gateway.port)
        cluster = await workload_cluster.create_worker_cluster(api_client, control_plane, namespace, CLUSTER,
                                                               endpoint=endpoint)
        workers = worker_objects(tmp_path, repository, "autoscaler", cluster.name, namespace, endpoint,
                                 libvirt_host, node_base_volume)
        deployment_name = by_kind(workers)["MachineDeployment"]["metadata"]["name"]
        assert by_kind(workers)["MachineDeployment"]["metadata"]["annotations"] == {
            templates.AUTOSCALER_MIN: "0", templates.AUTOSCALER_MAX: "5"}
        by_kind(workers)["MachineDeployment"]["metadata"]["annotations"][templates.AUTOSCALER_MAX] = str(N)

        async with operator_running(control_plane, {libvirt_host.name: libvirt_host.uri}) as memo:
            await create(api_client, workers)

            async def deployment() -> dict:
                return await objects.get_namespaced_custom_object(
                    meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "machinedeployments", deployment_name)

            async def template_capacity():
                body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                  "libvirtmachinetemplates", deployment_name)
                return body.get("status", {}).get("capacity")

            # Cluster API starts an autoscaled MachineDeployment at its minimum; the provider publishes capacity.
            assert (await wait_until("Cluster API's defaulting of replicas", deployment, 30))["spec"]["replicas"] == 0
            capacity = await wait_until("the template's capacity", template_capacity, 60)
            assert (capacity["cpu"], capacity["memory"]) == ("1", f"{WORKER_MEMORY_MIB}Mi")
            assert not (await deployment())["metadata"].get("annotations", {}).keys() & {
                "capacity.cluster-autoscaler.kubernetes.io/cpu", "capacity.cluster-autoscaler.kubernetes.io/memory"}

            # config/autoscaler's layout for a workload cluster of its own: `--kubeconfig` is the `<cluster>-kubeconfig`
            # Cluster API reads, `--cloud-config` the management side as a user bound only to config/autoscaler's
            # roles; its status ConfigMap and leader Lease live in the workload cluster's `cluster-autoscaler`
            # namespace (here both sides are the test API server).
            secret = await core.read_namespaced_secret(f"{cluster.name}-kubeconfig", namespace)
            workload_kubeconfig = tmp_path / "workload.kubeconfig"
            workload_kubeconfig.write_bytes(base64.b64decode(secret.data["value"]))
            if not [n for n in (await core.list_namespace()).items if n.metadata.name == AUTOSCALER_NAMESPACE]:
                await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=AUTOSCALER_NAMESPACE)))
            autoscaler = autoscaling.ClusterAutoscaler(
                control_plane, workload_kubeconfig, [namespace], AUTOSCALER_NAMESPACE,
                management_kubeconfig=control_plane.kubeconfig_for(AUTOSCALER_USER))
            with autoscaler:
                clock = Clock()
                for i in range(N):
                    await core.create_namespaced_pod(namespace, pod(f"work-{i}"))
                clock.mark("pods pending")
                await run_scale_up(api_client, namespace, deployment, clock, autoscaler)
                await check_nodes_and_pods(api_client, namespace, libvirt_host)
                await run_scale_down(api_client, namespace, deployment, clock, autoscaler, libvirt_host,
                                     node_base_volume)
                print(f"\n[numbers] cluster-autoscaler 0 -> {N} -> 0, phase by phase:\n{clock.report()}")
                assert autoscaler.refusals() == [], "cluster-autoscaler was refused something: RBAC is missing a rule"
                # It led (its Lease) and reported (its status ConfigMap) in the workload cluster's namespace of its own.
                await core.read_namespaced_config_map("cluster-autoscaler-status", AUTOSCALER_NAMESPACE)
                await client.CoordinationV1Api(api_client).read_namespaced_lease("cluster-autoscaler",
                                                                                 AUTOSCALER_NAMESPACE)

            # The provider's inventory agrees: a fresh probe of the host counts none of its machines.
            probe = await memo.runtime.deps.inventory.probe(libvirt_host.name)
            assert (probe.probe.machines, probe.probe.allocated_cpus) == (0, 0)
            assert not [key for key in memo.runtime.deps.observe.machines if key[0] == namespace]

            # While the operator still runs (the LibvirtCluster's finalizer is its).
            await objects.delete_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "clusters",
                                                          cluster.name)

            async def cluster_gone():
                listing = await objects.list_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                                      "clusters")
                return not listing["items"]

            await wait_until("the Cluster gone", cluster_gone, 120)


async def run_scale_up(api, namespace, deployment, clock: Clock, autoscaler) -> None:
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    async def progress() -> bool | Pending:
        autoscaler.check_alive()
        replicas = (await deployment())["spec"].get("replicas")
        if replicas == N:
            clock.mark(f"replicas {N} (cluster-autoscaler scaled up)")
        machines = (await objects.list_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                                "machines"))["items"]
        if len(machines) == N:
            clock.mark(f"{N} Machines created")
        infra = (await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                             "libvirtmachines"))["items"]
        if len([m for m in infra if m.get("status", {}).get("initialization", {}).get("provisioned")]) == N:
            clock.mark(f"{N} VMs provisioned")
        all_nodes = (await core.list_node()).items
        if len([n for n in all_nodes if is_ready(n)]) == N:
            clock.mark(f"{N} Nodes Ready")
        pods = (await core.list_namespaced_pod(namespace)).items
        if len([p for p in pods if p.spec.node_name]) == N:
            clock.mark(f"{N} Pods scheduled")
        if len([p for p in pods if p.status.phase == "Running"]) == N:
            return True
        # A timeout's "last seen": how far each part got, so a stall names its stage.
        return Pending(
            phases=list(clock.marks), replicas=replicas,
            machines=[(m["metadata"]["name"], m.get("status", {}).get("phase")) for m in machines],
            libvirt_machines=[(m["metadata"]["name"], [(c["type"], c["status"], c.get("reason"))
                                                       for c in m.get("status", {}).get("conditions", [])])
                              for m in infra],
            nodes=[(n.metadata.name, is_ready(n), [t.key for t in n.spec.taints or []]) for n in all_nodes],
            pods=[(p.metadata.name, p.status.phase, p.spec.node_name, unmet_conditions(p)) for p in pods])

    await wait_until(f"{N} Pods running on {N} new machines", progress, SCALE_UP_DEADLINE_S, interval=1.0)
    clock.mark(f"{N} Pods running")


async def check_nodes_and_pods(api, namespace, libvirt_host) -> None:
    """Each Pod runs on a Node of its own, joined by a real kubelet with its Machine's providerID."""
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    machines = (await objects.list_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                            "machines"))["items"]
    infra = {m["metadata"]["name"]: m for m in (await objects.list_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtmachines"))["items"]}
    by_node = {}
    for machine in machines:
        machine = await wait_until("the Machine's nodeRef", lambda m=machine: machine_with_node(api, namespace, m), 120)
        node = await assert_joined_by_kubelet(api, namespace, machine,
                                              infra[machine["spec"]["infrastructureRef"]["name"]])
        by_node[node.metadata.name] = node
    pods = (await core.list_namespaced_pod(namespace)).items
    assert len({p.spec.node_name for p in pods}) == N
    for p in pods:
        assert p.spec.node_name in by_node, p.spec.node_name
        assert by_node[p.spec.node_name].spec.provider_id.startswith(f"libvirt://{libvirt_host.name}/")
        assert all(c.ready for c in p.status.container_statuses), "the kubelet runs the Pod's container"


async def machine_with_node(api, namespace: str, machine: dict) -> dict | None:
    current = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "machines", machine["metadata"]["name"])
    return current if current.get("status", {}).get("nodeRef") else None


async def run_scale_down(api, namespace, deployment, clock: Clock, autoscaler, libvirt_host, base_volume) -> None:
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    for p in (await core.list_namespaced_pod(namespace)).items:
        await core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)
    clock.mark("pods deleted (scale-down requested)")

    async def progress():
        autoscaler.check_alive()
        if not (await core.list_namespaced_pod(namespace)).items:
            clock.mark("pods gone")
        if (await deployment())["spec"].get("replicas") == 0:
            clock.mark("replicas 0 (cluster-autoscaler scaled down)")
        machines = (await objects.list_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                                "machines"))["items"]
        infra = (await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                             "libvirtmachines"))["items"]
        if not machines and not infra:
            clock.mark("Machines and LibvirtMachines gone")
        clean = provider_objects(libvirt_host, base_volume) == []
        if clean:
            clock.mark("host clean (domains, overlays, ISOs, logs)")
        nodes = (await core.list_node()).items
        return clean and not machines and not infra and not nodes

    await wait_until("scale down to 0 with the host clean and the Nodes gone", progress, SCALE_DOWN_DEADLINE_S,
                     interval=1.0)
    clock.mark("Nodes gone")
