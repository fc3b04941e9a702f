"""A whole cluster on libvirt, from the default flavor as `clusterctl generate cluster` writes it: the real kubeadm
control-plane provider (KCP) makes the control-plane machine, whose VM runs `kubeadm init` from the node image (every
control-plane image preloaded, nothing pulled); the control-plane endpoint is a virtual IP on the machines' network,
held on the control-plane machine; Cluster API writes `<cluster>-kubeconfig` for it and reaches the workload API
server through it from the management side; the worker joins through it; every Node is Ready with its
LibvirtMachine's providerID. Day 2 on it (tests/day2_rollouts.py): the MachineDeployment rolls to a new
LibvirtMachineTemplate; `clusterctl describe cluster` shows it all Ready. The pod network is the flavor's own:
flannel, applied by the flavor's ClusterResourceSet through the real core manager, proven by pods on the two Nodes
calling each other and a Service through kube-proxy and CoreDNS (tests/pod_network_checks.py). Deleting the Cluster
leaves nothing on the host. Reads of the workload API server retry while it does not answer (its API server restarts when the machine is
starved under TCG), each failure kept as the wait's last-seen state.

Real parts: the management API server; Cluster API's core, kubeadm bootstrap and kubeadm control-plane managers
(webhooks on); the operator; libvirtd; in the guests kubeadm, kubelet, containerd, etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS, flannel and agnhost, all built here from source. Changed from the generated
objects, for this machine only: `domainType: qemu` (no KVM here) and machine type `pc`, the machines' sizes (2 vCPUs
and 2 GiB for the control plane, kubeadm's minimum; 1 vCPU and 1 GiB for the worker), kubeadm's waits
(KUBEADM_TIMEOUTS: the API server is slow under TCG), and the endpoint's holder:
keepalived (Debian's, in the node image) in place of the flavor's kube-vip static pod, whose image cannot be pulled
or built here (devenv/keepalived_holder.py). Stand-ins: the machines' network is a libvirt NAT network in the
host's namespace on 198.19.10.0/24 (not a private range), and the management side reaches the endpoint through
devenv.api_gateway.EndpointRelay (the address on `lo`, relayed into the host's namespace); flannel's CNI plugin is
the same plugin's older build (containernetworking/plugins v0.9.1: flannel-io/cni-plugin is not served here).
"""

from __future__ import annotations

import asyncio
import base64
import os
import pathlib

import pytest
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta, templates
from clusterctl_cli import clusterctl, generate_cluster
from day2_rollouts import (
    endpoint_answers,
    machine_states,
    roll_the_workers,
    workload_read,
    workload_snapshot,
)
from devenv import base_image, keepalived_holder, paths
from devenv.api_gateway import EndpointRelay
from devenv.libvirt_host import LibvirtHost
from guests import provider_objects
from kubeadm_workers import is_ready, libvirt_machines, list_objects, machines
from pod_network_checks import prove_the_pod_network

from fixtures_control_plane import operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from waiting import Clock, Pending, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]

CLUSTER = "whole"
SUBNET = "198.19.10.0/24"  # the benchmarking range, not a private one: the management side may send to it
RESERVED = 4  # the subnet's last addresses, out of DHCP; the endpoint is the first of them
PORT = 6443
CONTROL_PLANE_CPUS, CONTROL_PLANE_MEMORY_MIB = 2, 2048  # kubeadm init's preflight minimums
WORKER_CPUS, WORKER_MEMORY_MIB = 1, 1024
ROLLED_WORKER_MEMORY_MIB = 1280  # the day-2 template's
DISK_GIB = 6
KUBEADM_WAIT_S = 1200
# kubeadm's waits, from 1-5 minutes to 20 (API calls and etcd calls: 10): under TCG on 2 cores the control-plane VM's
# API server stops answering for minutes at a time (CI at 8fb79cc: `kubeadm init` failed in its bootstrap-token phase
# after a minute of 10-second request timeouts, and the worker's discovery gave up after its 5 minutes).
KUBEADM_TIMEOUTS = {"controlPlaneComponentHealthCheckSeconds": KUBEADM_WAIT_S, "kubeletHealthCheckSeconds": KUBEADM_WAIT_S,
                    "discoverySeconds": KUBEADM_WAIT_S, "tlsBootstrapSeconds": KUBEADM_WAIT_S,
                    "kubernetesAPICallSeconds": 600, "etcdAPICallSeconds": 600}
CONTROL_PLANE_DEADLINE_S = 1500.0  # boot, kubeadm init with etcd and the API server under TCG on a busy machine
WORKERS_DEADLINE_S = 1200.0
DELETE_DEADLINE_S = 600.0
CLUSTER_KINDS = [(meta.CAPI_GROUP, meta.CAPI_VERSION, plural)
                 for plural in ("clusters", "machinedeployments", "machinesets", "machines")] + [
                (templates.CONTROLPLANE_GROUP, meta.CAPI_VERSION, "kubeadmcontrolplanes"),
                (meta.GROUP, meta.VERSION, "libvirtmachines"), (meta.GROUP, meta.VERSION, "libvirtclusters")]


@pytest.fixture(scope="module")
def cluster_host(tmp_path_factory: pytest.TempPathFactory):
    """A libvirt host of its own whose NAT network keeps its last addresses out of DHCP (the endpoint's)."""
    require_libvirt_host_prerequisites()
    name = f"pytest-cluster-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    with LibvirtHost(name, SUBNET, dhcp_reserved=RESERVED,
                     log_dir=tmp_path_factory.mktemp("cluster-host-logs")) as host:
        yield host


def cluster_objects(tmp: pathlib.Path, repository: pathlib.Path, namespace: str, host: LibvirtHost, base_volume: str,
                    endpoint: str) -> list[dict]:
    """The default flavor as `clusterctl generate cluster` writes it for this host, with this machine's changes."""
    variables = {
        "KUBERNETES_VERSION": paths.KUBERNETES_VERSION,
        "CONTROL_PLANE_MACHINE_COUNT": "1",
        "WORKER_MACHINE_COUNT": "1",
        "CONTROL_PLANE_ENDPOINT_HOST": endpoint,
        "LIBVIRT_BASE_IMAGE": base_volume,
        "LIBVIRT_STORAGE_POOL": host.pool_name,
        "LIBVIRT_NETWORK": host.network_name,
        "LIBVIRT_CONTROL_PLANE_CPUS": str(CONTROL_PLANE_CPUS),
        "LIBVIRT_CONTROL_PLANE_MEMORY_MIB": str(CONTROL_PLANE_MEMORY_MIB),
        "LIBVIRT_WORKER_CPUS": str(WORKER_CPUS),
        "LIBVIRT_WORKER_MEMORY_MIB": str(WORKER_MEMORY_MIB),
        "LIBVIRT_DISK_GIB": str(DISK_GIB),
    }
    documents = generate_cluster(tmp, repository, "", CLUSTER, namespace, variables)
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == sorted(["Cluster", "LibvirtCluster", "KubeadmControlPlane", "LibvirtMachineTemplate",
                            "LibvirtMachineTemplate", "MachineDeployment", "KubeadmConfigTemplate", "RoleBinding",
                            "ConfigMap", "ClusterResourceSet"]), kinds
    for document in documents:
        if document["kind"] == "LibvirtMachineTemplate":
            document["spec"]["template"]["spec"].update(domainType="qemu", machineType="pc")
        if document["kind"] == "KubeadmControlPlane":
            spec = document["spec"]["kubeadmConfigSpec"]
            keepalived_holder.replace_kube_vip(spec, endpoint, PORT)
            for configuration in ("initConfiguration", "joinConfiguration"):
                spec[configuration]["timeouts"] = KUBEADM_TIMEOUTS
        if document["kind"] == "KubeadmConfigTemplate":
            spec = document["spec"]["template"]["spec"]
            spec["joinConfiguration"]["timeouts"] = KUBEADM_TIMEOUTS
    return documents


async def apply(api: client.ApiClient, plane, documents: list[dict]) -> None:
    objects = client.CustomObjectsApi(api)
    for document in documents:
        if document["apiVersion"] in ("v1", "rbac.authorization.k8s.io/v1"):  # the ConfigMap, the RoleBinding
            plane.apply_objects([document])
            continue
        group, version = document["apiVersion"].split("/")
        await objects.create_namespaced_custom_object(group, version, document["metadata"]["namespace"],
                                                      document["kind"].lower() + "s", document)


async def workload_kubeconfig(api: client.ApiClient, namespace: str, path: pathlib.Path) -> pathlib.Path | None:
    """The `<cluster>-kubeconfig` Cluster API wrote, saved to `path` (None while it does not exist)."""
    try:
        secret = await client.CoreV1Api(api).read_namespaced_secret(f"{CLUSTER}-kubeconfig", namespace)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    await asyncio.to_thread(path.write_bytes, base64.b64decode(secret.data["value"]))
    return path


async def test_default_flavor_makes_a_whole_cluster_and_deleting_it_leaves_nothing(
        control_plane, capi_controller, kubeadm_bootstrap_controller, kubeadm_control_plane_controller, api_client,
        namespace, cluster_host, node_image, repository, tmp_path):
    with cluster_host.connect() as conn:
        base_volume = base_image.upload_base_image(conn, cluster_host.pool_name, node_image)
    endpoint = str(cluster_host.reserved_addresses[0])
    documents = cluster_objects(tmp_path, repository, namespace, cluster_host, base_volume, endpoint)
    kubeconfig_path = tmp_path / "workload.kubeconfig"
    with EndpointRelay(cluster_host, endpoint, PORT) as relay:
        async with operator_running(control_plane, {cluster_host.name: cluster_host.uri}):
            clock = Clock()
            await apply(api_client, control_plane, documents)

            async def control_plane_up():
                infra = await libvirt_machines(api_client, namespace)
                if any(m.get("spec", {}).get("providerID") for m in infra):
                    clock.mark("control-plane VM running (providerID set)")
                if any((m.get("status") or {}).get("initialization", {}).get("provisioned") for m in infra):
                    clock.mark("control-plane VM provisioned (booted, address)")
                [kcp] = await list_objects(api_client, namespace, templates.CONTROLPLANE_GROUP, meta.CAPI_VERSION,
                                           "kubeadmcontrolplanes")
                if not (kcp.get("status") or {}).get("initialization", {}).get("controlPlaneInitialized"):
                    return None
                clock.mark("kubeadm init done (KubeadmControlPlane initialized)")
                path = await workload_kubeconfig(api_client, namespace, kubeconfig_path)
                if path is None or not await asyncio.to_thread(endpoint_answers, path):
                    return None
                clock.mark("the endpoint answers (workload API server through the VIP)")
                return path

            await wait_until("kubeadm init on the control-plane VM and the endpoint answering", control_plane_up,
                             CONTROL_PLANE_DEADLINE_S, interval=3.0)
            workload = client.Configuration()
            await config.load_kube_config(config_file=str(kubeconfig_path), client_configuration=workload)
            async with client.ApiClient(workload) as workload_api:
                async def all_ready():
                    found = await machines(api_client, namespace)
                    snapshot = await workload_snapshot(workload_api)
                    if isinstance(snapshot, Pending):
                        return snapshot
                    nodes, _ = snapshot
                    ready = {name for name, node in nodes.items() if is_ready(node)}
                    if len(ready) >= 1:
                        clock.mark("the control-plane Node Ready")
                    running = [m for m in found if (m.get("status") or {}).get("phase") == "Running"
                               and (m["status"].get("nodeRef") or {}).get("name") in ready]
                    if len(found) == 2 and len(running) == 2 and len(ready) == 2:
                        return found, list(nodes.values())
                    return Pending(machines=machine_states(found, nodes))

                found, nodes = await wait_until("both Machines Running with Ready Nodes", all_ready,
                                                WORKERS_DEADLINE_S, interval=3.0)
                clock.mark("the worker joined through the endpoint: 2 Nodes Ready, 2 Machines Running")
                infra = {m["metadata"]["name"]: m for m in await libvirt_machines(api_client, namespace)}
                by_name = {n.metadata.name: n for n in nodes}
                for machine in found:
                    node = by_name[machine["status"]["nodeRef"]["name"]]
                    provider_id = infra[machine["spec"]["infrastructureRef"]["name"]]["spec"]["providerID"]
                    assert node.spec.provider_id == provider_id == machine["spec"]["providerID"]
                    assert node.status.node_info.kubelet_version == paths.KUBERNETES_VERSION
                control_plane_nodes = [n for n in nodes if "node-role.kubernetes.io/control-plane" in
                                       (n.metadata.labels or {})]
                assert len(control_plane_nodes) == 1, [n.metadata.labels for n in nodes]
                pods = await wait_until("kube-system's Pods listed", lambda: workload_read(
                    client.CoreV1Api(workload_api).list_namespaced_pod("kube-system", _request_timeout=10)),
                    WORKERS_DEADLINE_S, interval=3.0)
                static = sorted(p.metadata.labels["component"] for p in pods.items
                                if (p.metadata.labels or {}).get("tier") == "control-plane")
                assert static == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"], static
                [resource_set] = await list_objects(api_client, namespace, templates.ADDONS_GROUP, meta.CAPI_VERSION,
                                                    "clusterresourcesets")
                applied = [c for c in resource_set["status"]["conditions"] if c["type"] == "ResourcesApplied"]
                assert [c["status"] for c in applied] == ["True"], resource_set["status"]
                [control_plane_node] = [n.metadata.name for n in control_plane_nodes]
                [worker_node] = [n.metadata.name for n in nodes if n.metadata.name != control_plane_node]
                answers = await prove_the_pod_network(workload_api, control_plane_node, worker_node, clock)
                print("\n[numbers] the pod network (flannel from the flavor's ClusterResourceSet):\n" +
                      "\n".join(f"  {what}: answered by {who}" for what, who in answers.items()))

            async def cluster_ready():
                [cluster] = await list_objects(api_client, namespace, meta.CAPI_GROUP, meta.CAPI_VERSION, "clusters")
                conditions = (cluster.get("status") or {}).get("conditions", [])
                if any(c["type"] == "Available" and c["status"] == "True" for c in conditions):
                    return cluster
                return Pending(conditions=[(c["type"], c["status"], c.get("reason"), c.get("message"))
                                           for c in conditions if c["status"] != "True"])

            await wait_until("the Cluster Available", cluster_ready, WORKERS_DEADLINE_S, interval=3.0)
            clock.mark("the Cluster Available")
            async with client.ApiClient(workload) as workload_api:
                workers_rolled = await roll_the_workers(api_client, workload_api, namespace, CLUSTER,
                                                        ROLLED_WORKER_MEMORY_MIB, cluster_host, base_volume, clock)
                print(f"\n[numbers] MachineDeployment rollout to a new LibvirtMachineTemplate ({WORKER_MEMORY_MIB} -> "
                      f"{ROLLED_WORKER_MEMORY_MIB} MiB):\n{workers_rolled}")
            described = (await asyncio.to_thread(
                clusterctl, tmp_path, repository, "describe", "cluster", CLUSTER, "-n", namespace,
                "--kubeconfig", str(control_plane.kubeconfig_path), "--grouping=false")).stdout
            print(f"\n[numbers] a whole cluster from the default flavor, phase by phase:\n{clock.report()}\n"
                  f"  endpoint relay connections: {relay.connections}\n"
                  f"clusterctl describe cluster:\n{described}")
            assert relay.connections > 0, "the management side reached the workload API server through the endpoint"

            await client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
                meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "clusters", CLUSTER)

            async def cluster_gone():
                left = [item for group, version, plural in CLUSTER_KINDS
                        for item in await list_objects(api_client, namespace, group, version, plural)]
                return not left and provider_objects(cluster_host, base_volume) == []

            await wait_until("the Cluster and everything of it gone, host clean", cluster_gone, DELETE_DEADLINE_S,
                             interval=2.0)
