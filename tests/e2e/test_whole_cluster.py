"""Whole clusters on libvirt, from the shipped flavors as `clusterctl generate cluster` writes them from the
provider's repository, one after the other on one libvirt host:

- the default flavor: the real kubeadm control-plane provider (KCP) makes the control-plane machine, whose VM runs
  `kubeadm init` from the node image (every image preloaded, nothing pulled); the control-plane endpoint is a
  virtual IP on the machines' network, held on the control-plane machine; Cluster API writes `<cluster>-kubeconfig`
  for it and reaches the workload API server through it from the management side; the worker joins through it;
  every Node is Ready with its LibvirtMachine's providerID. The pod network is the flavor's own: flannel, applied by
  the flavor's ClusterResourceSet through the real core manager, proven by pods on the two Nodes calling each other
  and a Service through kube-proxy and CoreDNS (tests/pod_network_checks.py). What a joined node proves
  (tests/node_proofs.py): both NoCloud ISOs gone once the nodeRefs are set; both boots read with `capi-libvirt
  console-log` (kubeadm init, kubeadm join); the worker's kubelet CSR, posted with its own bootstrap token, approved
  and signed; the worker rebooted without its seed Ready again, cloud-init off. Beside that reboot, a join broken on
  purpose (a wrong token secret) shows kubeadm's refusal on its console and never makes a Node; `clusterctl describe
  cluster` is printed, and the Cluster is deleted with that machine still in flight. (cluster-autoscaler is proven
  once, in tests/e2e/test_autoscaler.py, in the layout config/autoscaler gives a workload cluster of its own: every
  minute of a whole cluster keeps its control-plane VM busy on both cores.)
- the clusterclass flavor: clusterctl adds the ClusterClass from its own file in the repository; Cluster API's
  topology controller makes the control plane, the MachineDeployment and their templates; the same proofs of a
  running cluster but the pod network's pods (proven once, above: the same flannel from the same kind of
  ClusterResourceSet; both Nodes Ready need its CNI configuration); then day 2 (tests/day2_rollouts.py): changing the
  Cluster's `workerMemoryMiB` variable makes the topology controller write a new LibvirtMachineTemplate and point
  the MachineDeployment at it, and the workers roll to it, the new worker serving before the old one goes. This is
  the MachineDeployment rollout's one proof: a rollout to a template a user wrote runs the same Cluster API code
  from the MachineDeployment on.

The host is reached as the README's quick start declares one (tests/declared_host.py): a LibvirtHost over qemu+ssh
(the default flavor's cluster) or qemu+tls (the clusterclass flavor's) with its credentials Secret, access rules that
let the test's namespace use the node image and the network and send from the endpoint (`allowedAddresses`), and
nothing else; the operator, as its least-privilege user, knows no host but that object, and `capi-libvirt
console-log` reads the boots over the same transport with the same Secret. Deleting each Cluster leaves nothing on
the host; a test that fails clears its cluster off the host before the next one starts
(whole_cluster_bed.cleared_on_failure). Reads of the workload API server retry while it does not answer (its API
server restarts when the machine is starved under TCG), each failure kept as the wait's last-seen state.

Real parts: the management API server; Cluster API's core (topology on), kubeadm bootstrap and kubeadm control-plane
managers (webhooks on); the operator; libvirtd; in the guests kubeadm, kubelet, containerd, etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS, flannel and agnhost, all built here from source. What
is changed from the generated objects for this machine, and why: tests/whole_cluster_bed.py. Stand-ins: the machines'
network is a libvirt NAT network in the host's namespace on 198.19.10.0/24 (not a private range), and the management
side reaches the endpoint through devenv.api_gateway.EndpointRelay (the address on `lo`, relayed into the host's
namespace); flannel's CNI plugin is the same plugin's older build (containernetworking/plugins v0.9.1:
flannel-io/cni-plugin is not served here).
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta, templates
from clusterctl_cli import clusterctl
from day2_rollouts import (
    CONTROL_PLANE_LABEL,
    DEPLOYMENT_LABEL,
    roll_the_workers,
    workload_read,
)
from declared_host import operator_on_a_declared_host
from devenv.api_gateway import EndpointRelay
from kubeadm_workers import assert_joined_by_kubelet, libvirt_machines, list_objects, machines
from node_proofs import (
    a_reboot_keeps_the_node,
    boots_on_the_console,
    broken_join_is_visible_on_the_console,
    seeds_gone,
)
from pod_network_checks import prove_the_pod_network
from whole_cluster_bed import (
    API_SERVER_LIVENESS_FAILURES,
    PORT,
    READINESS_PERIOD_S,
    ROLLED_WORKER_MEMORY_MIB,
    WORKER_MEMORY_MIB,
    WORKERS_DEADLINE_S,
    apply,
    assert_nodes_are_the_machines,
    cleared_on_failure,
    cluster_available,
    control_plane_up,
    delete_the_cluster,
    generated_objects,
    nodes_ready,
)

from waiting import Clock, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]

CLUSTER = "whole"
CLASS_CLUSTER = "classy"
DEFAULT_KINDS = ["Cluster", "LibvirtCluster", "KubeadmControlPlane", "LibvirtMachineTemplate", "LibvirtMachineTemplate",
                 "MachineDeployment", "KubeadmConfigTemplate", "RoleBinding", "ConfigMap", "ClusterResourceSet"]
CLUSTERCLASS_KINDS = ["ClusterClass", "LibvirtClusterTemplate", "KubeadmControlPlaneTemplate", "LibvirtMachineTemplate",
                      "LibvirtMachineTemplate", "KubeadmConfigTemplate", "Cluster", "RoleBinding", "ConfigMap",
                      "ClusterResourceSet"]


async def _running_cluster(api_client, namespace: str, cluster: str, kubeconfig_path, clock: Clock, *,
                           pod_network: bool) -> None:
    """The control plane up behind the endpoint, both Nodes Ready as their Machines, the control plane's static pods,
    the ClusterResourceSet applied, the pod network proven if `pod_network` (once is enough: both flavors apply the
    same flannel through the same ClusterResourceSet, and a Node is Ready only once its CNI configuration is there),
    the Cluster Available."""
    await control_plane_up(api_client, namespace, cluster, kubeconfig_path, clock)
    workload = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig_path), client_configuration=workload)
    async with client.ApiClient(workload) as workload_api:
        found, nodes = await nodes_ready(api_client, workload_api, namespace, 2, clock)
        assert_nodes_are_the_machines(found, nodes, await libvirt_machines(api_client, namespace))
        control_plane_nodes = [n.metadata.name for n in nodes
                               if "node-role.kubernetes.io/control-plane" in (n.metadata.labels or {})]
        assert len(control_plane_nodes) == 1, [n.metadata.labels for n in nodes]
        pods = await wait_until("kube-system's Pods listed", lambda: workload_read(
            client.CoreV1Api(workload_api).list_namespaced_pod("kube-system", _request_timeout=10)),
            WORKERS_DEADLINE_S, interval=3.0)
        static = sorted(p.metadata.labels["component"] for p in pods.items
                        if (p.metadata.labels or {}).get("tier") == "control-plane")
        assert static == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"], static
        [api_server] = [p for p in pods.items if p.metadata.labels.get("component") == "kube-apiserver"]
        probe = api_server.spec.containers[0].liveness_probe
        assert probe.failure_threshold == API_SERVER_LIVENESS_FAILURES, probe  # the bed's kubeadm patches applied
        [scheduler] = [p for p in pods.items if p.metadata.labels.get("component") == "kube-scheduler"]
        for pod in (api_server, scheduler):
            readiness = pod.spec.containers[0].readiness_probe
            assert readiness.period_seconds == READINESS_PERIOD_S, readiness
        [resource_set] = await list_objects(api_client, namespace, templates.ADDONS_GROUP, meta.CAPI_VERSION,
                                            "clusterresourcesets")
        applied = [c for c in resource_set["status"]["conditions"] if c["type"] == "ResourcesApplied"]
        assert [c["status"] for c in applied] == ["True"], resource_set["status"]
        if pod_network:
            [worker_node] = [n.metadata.name for n in nodes if n.metadata.name not in control_plane_nodes]
            answers = await prove_the_pod_network(workload_api, control_plane_nodes[0], worker_node, clock)
            print(f"\n[numbers] {cluster}: the pod network (flannel from the flavor's ClusterResourceSet):\n" +
                  "\n".join(f"  {what}: answered by {who}" for what, who in answers.items()))
    await cluster_available(api_client, namespace, clock)


async def _seeds_and_boots(api_client, workload_api, kubeconfig, namespace: str, workers: str, host,
                           clock: Clock) -> dict:
    """The Nodes joined: both NoCloud ISOs gone, both boots read on the console (kubeadm init, kubeadm join), the
    worker's Node registered by its kubelet with its own bootstrap token (tests/node_proofs.py). Returns the worker's
    Machine."""
    infra = await seeds_gone(api_client, namespace, host, 2)
    clock.mark("both NoCloud ISOs ejected and deleted (after the nodeRefs)")
    found = await machines(api_client, namespace)
    [control_plane_machine] = [m["spec"]["infrastructureRef"]["name"] for m in found
                               if CONTROL_PLANE_LABEL in (m["metadata"].get("labels") or {})]
    boots = await asyncio.to_thread(boots_on_the_console, kubeconfig, namespace, infra, control_plane_machine)
    print(f"\n[numbers] the boots, as `capi-libvirt console-log` shows them:\n{boots}")
    [worker] = [m for m in found if (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == workers]
    [worker_infra] = [m for m in infra if m["metadata"]["name"] == worker["spec"]["infrastructureRef"]["name"]]

    def joined():  # the workload API server stalled: ask again
        return workload_read(assert_joined_by_kubelet(api_client, namespace, worker, worker_infra, workload_api))

    await wait_until("the worker's Node and kubelet CSR read", joined, WORKERS_DEADLINE_S, interval=3.0)
    clock.mark("the worker's kubelet CSR (its own bootstrap token) approved and signed")
    return worker


async def _report_and_delete(tmp_path, repository, control_plane, api_client, namespace: str, cluster: str,
                             flavor: str, clock: Clock, relay: EndpointRelay, host, base_volume: str) -> None:
    """The phases and `clusterctl describe cluster` printed; the management side's use of the endpoint asserted; the
    Cluster deleted, until nothing of it is left."""
    described = (await asyncio.to_thread(
        clusterctl, tmp_path, repository, "describe", "cluster", cluster, "-n", namespace,
        "--kubeconfig", str(control_plane.kubeconfig_path), "--grouping=false")).stdout
    print(f"\n[numbers] a whole cluster from the {flavor} flavor, phase by phase:\n{clock.report()}\n"
          f"  endpoint relay connections: {relay.connections}\n"
          f"clusterctl describe cluster:\n{described}")
    assert relay.connections > 0, "the management side reached the workload API server through the endpoint"
    await delete_the_cluster(api_client, namespace, cluster, host, base_volume)


async def test_default_flavor_makes_a_whole_cluster_and_deleting_it_leaves_nothing(
        control_plane, capi_controller, kubeadm_bootstrap_controller, kubeadm_control_plane_controller, api_client,
        namespace, cluster_access, cluster_host, cluster_base_volume, repository, tmp_path):
    endpoint = str(cluster_host.reserved_addresses[0])
    documents = generated_objects(tmp_path, repository, "", CLUSTER, namespace, cluster_host, cluster_base_volume,
                                  endpoint)
    assert sorted(d["kind"] for d in documents) == sorted(DEFAULT_KINDS)
    kubeconfig_path = tmp_path / "workload.kubeconfig"
    with EndpointRelay(cluster_host, endpoint, PORT) as relay:
        async with (operator_on_a_declared_host(control_plane, api_client, cluster_access, "ssh", namespace,
                                                cluster_base_volume, endpoint),
                    cleared_on_failure(api_client, namespace, CLUSTER, cluster_host, cluster_base_volume)):
            clock = Clock()
            await apply(api_client, control_plane, documents)
            await _running_cluster(api_client, namespace, CLUSTER, kubeconfig_path, clock, pod_network=True)
            workload = client.Configuration()
            await config.load_kube_config(config_file=str(kubeconfig_path), client_configuration=workload)
            async with client.ApiClient(workload) as workload_api:
                worker = await _seeds_and_boots(api_client, workload_api, control_plane.kubeconfig_path, namespace,
                                                f"{CLUSTER}-md-0", cluster_host, clock)

                async def reboot() -> str:
                    rebooted = await a_reboot_keeps_the_node(api_client, workload_api, control_plane.kubeconfig_path,
                                                             namespace, cluster_host, worker)
                    clock.mark("the worker rebooted without its seed, its Node Ready again")
                    return rebooted

                async def broken_join() -> str:
                    refusal = await broken_join_is_visible_on_the_console(
                        api_client, workload_api, control_plane.kubeconfig_path, namespace, CLUSTER, documents,
                        cluster_host)
                    clock.mark("a broken join's refusal read on its console")
                    return refusal

                # The broken join boots beside the worker's reboot, not after it: every minute of a whole cluster
                # keeps its control-plane VM busy on the 2 cores. Three TCG guests at once, as in the clusterclass
                # flavor's rollout; not four (a fourth beside the control plane and two running workers starved its
                # API server).
                async with asyncio.TaskGroup() as day2:
                    rebooting = day2.create_task(reboot())
                    broken = day2.create_task(broken_join())
                print(f"\n[numbers] a reboot without the NoCloud ISO:\n{rebooting.result()}")
                print(f"\n[console-log] the broken join, as `capi-libvirt console-log` shows it:\n{broken.result()}")
            await _report_and_delete(tmp_path, repository, control_plane, api_client, namespace, CLUSTER, "default",
                                     clock, relay, cluster_host, cluster_base_volume)


async def test_clusterclass_flavor_makes_a_whole_cluster_whose_worker_variable_rolls_its_workers(
        control_plane, capi_controller, kubeadm_bootstrap_controller, kubeadm_control_plane_controller, api_client,
        namespace, cluster_access, cluster_host, cluster_base_volume, repository, tmp_path):
    endpoint = str(cluster_host.reserved_addresses[0])
    documents = generated_objects(tmp_path, repository, "clusterclass", CLASS_CLUSTER, namespace, cluster_host,
                                  cluster_base_volume, endpoint)
    assert sorted(d["kind"] for d in documents) == sorted(CLUSTERCLASS_KINDS)  # the class came from the repository
    kubeconfig_path = tmp_path / "workload.kubeconfig"
    objects = client.CustomObjectsApi(api_client)
    with EndpointRelay(cluster_host, endpoint, PORT) as relay:
        async with (operator_on_a_declared_host(control_plane, api_client, cluster_access, "tls", namespace,
                                                cluster_base_volume, endpoint),
                    cleared_on_failure(api_client, namespace, CLASS_CLUSTER, cluster_host, cluster_base_volume)):
            clock = Clock()
            await apply(api_client, control_plane, documents)
            await _running_cluster(api_client, namespace, CLASS_CLUSTER, kubeconfig_path, clock, pod_network=False)
            [deployment] = await list_objects(api_client, namespace, meta.CAPI_GROUP, meta.CAPI_VERSION,
                                              "machinedeployments")
            assert deployment["metadata"]["labels"]["topology.cluster.x-k8s.io/deployment-name"] == "md-0"

            async def change_the_variable() -> None:
                [cluster] = await list_objects(api_client, namespace, meta.CAPI_GROUP, meta.CAPI_VERSION, "clusters")
                variables = [{**v, "value": ROLLED_WORKER_MEMORY_MIB} if v["name"] == templates.WORKER_MEMORY_VARIABLE
                             else v for v in cluster["spec"]["topology"]["variables"]]
                await objects.patch_namespaced_custom_object(
                    meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "clusters", CLASS_CLUSTER,
                    {"spec": {"topology": {"variables": variables}}}, _content_type="application/merge-patch+json")

            workload = client.Configuration()
            await config.load_kube_config(config_file=str(kubeconfig_path), client_configuration=workload)
            async with client.ApiClient(workload) as workload_api:
                workers_rolled = await roll_the_workers(
                    api_client, workload_api, namespace, deployment["metadata"]["name"], change_the_variable,
                    ROLLED_WORKER_MEMORY_MIB, cluster_host, cluster_base_volume, clock)
                print(f"\n[numbers] {templates.WORKER_MEMORY_VARIABLE} {WORKER_MEMORY_MIB} -> "
                      f"{ROLLED_WORKER_MEMORY_MIB} on the Cluster's topology:\n{workers_rolled}")
            await _report_and_delete(tmp_path, repository, control_plane, api_client, namespace, CLASS_CLUSTER,
                                     "clusterclass", clock, relay, cluster_host, cluster_base_volume)
