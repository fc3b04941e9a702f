"""A rollout of a whole cluster's control-plane machine: the default flavor as `clusterctl generate cluster` writes
it from the provider's repository (1 control-plane machine; its MachineDeployment at 0, so that the two control-plane
VMs of the rollout have the host's 2 cores to themselves), the control plane up behind its endpoint with its Node
Ready, then the KubeadmControlPlane's `spec.rollout.after` set to now (tests/day2_rollouts.py): KCP makes a new
control-plane Machine, whose VM runs `kubeadm join --control-plane` through the endpoint (its etcd member, its static
pods); once its etcd member runs, KCP removes the old member and deletes the old machine; the endpoint moves to the
new VM. The endpoint is asked every second throughout and its failed answers are printed, with the phases and how
many times the test bed's kubeadm wrapper ran kubeadm's etcd-join phase again. Deleting the Cluster leaves nothing on
the host.

Not in `make test`: `make test-control-plane-rollout` runs it, alone. On this machine (2 cores, TCG) two control-plane
VMs at once starve each other (docs/book/src/topics/whole-cluster.md); what is changed for it, and why:
whole_cluster_bed.for_a_control_plane_rollout.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from kubernetes_asyncio import client, config

from day2_rollouts import roll_the_control_plane
from declared_host import operator_on_a_declared_host
from devenv.api_gateway import EndpointRelay
from kubeadm_workers import libvirt_machines
from node_proofs import console_log
from whole_cluster_bed import (
    ETCD_JOIN_RETRY_MARK,
    PORT,
    apply,
    control_plane_up,
    delete_the_cluster,
    for_a_control_plane_rollout,
    generated_objects,
    nodes_ready,
)

from waiting import Clock

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

CLUSTER = "rolled"


async def test_the_control_plane_machine_rolls_behind_its_endpoint_and_leaves_nothing(
        control_plane, capi_controller, kubeadm_bootstrap_controller, kubeadm_control_plane_controller, api_client,
        namespace, cluster_access, cluster_host, cluster_base_volume, repository, tmp_path):
    endpoint = str(cluster_host.reserved_addresses[0])
    documents = generated_objects(tmp_path, repository, "", CLUSTER, namespace, cluster_host, cluster_base_volume,
                                  endpoint)
    for_a_control_plane_rollout(documents)
    kubeconfig_path = tmp_path / "workload.kubeconfig"
    with EndpointRelay(cluster_host, endpoint, PORT):
        async with operator_on_a_declared_host(control_plane, api_client, cluster_access, "ssh", namespace,
                                               cluster_base_volume, endpoint):
            clock = Clock()
            await apply(api_client, control_plane, documents)
            await control_plane_up(api_client, namespace, CLUSTER, kubeconfig_path, clock)
            workload = client.Configuration()
            await config.load_kube_config(config_file=str(kubeconfig_path), client_configuration=workload)
            async with client.ApiClient(workload) as workload_api:
                await nodes_ready(api_client, workload_api, namespace, 1, clock)
                rolled = await roll_the_control_plane(api_client, workload_api, namespace, kubeconfig_path,
                                                      cluster_host, cluster_base_volume, clock)
            [new_control_plane] = await libvirt_machines(api_client, namespace)
            console = await asyncio.to_thread(console_log, control_plane.kubeconfig_path, namespace,
                                              new_control_plane["metadata"]["name"])
            retries = len(set(re.findall(re.escape(ETCD_JOIN_RETRY_MARK) + r" \(attempt (\d+)\)", console)))
            print(f"\n[numbers] the control-plane machine rolled (KubeadmControlPlane spec.rollout.after):\n{rolled}\n"
                  f"  kubeadm's etcd-join phase run again on the new machine: {retries} time(s)\n"
                  f"[numbers] the whole test, phase by phase:\n{clock.report()}")
            await delete_the_cluster(api_client, namespace, CLUSTER, cluster_host, cluster_base_volume)
