"""Workers join for real: Cluster API's kubeadm bootstrap provider writes the cloud-init, the provider puts it on the
NoCloud ISO, the VM boots the node image from its own disk, cloud-init runs `kubeadm join`, and the kubelet registers
the Node with the provider's providerID; the Node becomes Ready, the Machine Running. Once Cluster API set the
Machines' nodeRefs, every NoCloud ISO (the bootstrap data) is ejected and deleted, and one guest rebooted without its
seed comes back (Node Ready with a new boot ID, same address, same network config, cloud-init off). Then Cluster API
scales the
MachineDeployment back to 0, deletes the Nodes, and nothing of the VMs is left on the host. A join broken on purpose
(a bootstrap token whose secret is wrong) shows why it failed in `capi-libvirt console-log`, read over libvirt; then
deleting the Cluster, with that machine still in flight, removes every object and VM.

Real parts: the test API server (prepared by `kubeadm init phase ...`, devenv/kubeadm_phases.py), reached by guests
through the API gateway with TLS verified; kube-controller-manager's CSR approver and signer, bootstrap signer and
token cleaner; the Cluster API core and kubeadm bootstrap managers (webhooks on); the operator (as the user bound only
to config/rbac); libvirtd; kubeadm, kubelet and containerd in the guests. The MachineDeployment, its
KubeadmConfigTemplate and LibvirtMachineTemplate are the default flavor's, from `clusterctl generate cluster`.
Stand-in: the control plane is the test API server itself, marked initialized through a HostedControlPlane object
(devenv/workload_cluster.py), as no KubeadmControlPlane can boot control-plane VMs in this machine's time budget.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import re
import subprocess
import sys

import libvirt
import pytest
from kubernetes_asyncio import client

import guest_agent
import timing_report
from capi_libvirt.api import meta
from capi_libvirt.core import domain_xml
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv import node_joins, workload_cluster
from guests import provider_objects, refreshed_pool
from kubeadm_workers import (
    assert_joined_by_kubelet,
    by_kind,
    create,
    is_ready,
    join_token_id,
    kubelet_csr,
    libvirt_machines,
    list_objects,
    machines,
    worker_objects,
)

from fixtures_control_plane import operator_running
from waiting import Clock, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2700)]

CLUSTER = "join"
N = 2
JOIN_DEADLINE_S = 1200.0  # two TCG guests boot, run cloud-init, containerd and the kubelet on a busy 2-core machine
SCALE_DOWN_DEADLINE_S = 300.0
BROKEN_DEADLINE_S = 900.0
ISO_DEADLINE_S = 120.0  # the Machine's nodeRef wakes the machine at once; its next pass removes the ISO
REBOOT_DEADLINE_S = 600.0  # a TCG guest's reboot to a Ready kubelet on a busy 2-core machine
UP_SECONDS = re.compile(r"Cloud-init v\. \S+ running 'modules:final' at .*?Up ([0-9.]+) seconds")
FINISHED_SECONDS = re.compile(r"Cloud-init v\. \S+ finished at .*?Up ([0-9.]+) seconds")
JOIN_REFUSED = "failed to verify JWS signature of received cluster info object"
CLUSTER_KINDS = [(meta.CAPI_GROUP, meta.CAPI_VERSION, plural)
                 for plural in ("clusters", "machinedeployments", "machinesets", "machines")] + [
                (meta.GROUP, meta.VERSION, plural) for plural in ("libvirtmachines", "libvirtclusters")]


def console_log(plane, host, namespace: str, name: str) -> str:
    """`capi-libvirt console-log` as a user runs it, with a kubeconfig (the operator's hosts are given with --host
    here, as the tests run the operator with them)."""
    result = subprocess.run(
        [sys.executable, "-m", "capi_libvirt", "console-log", f"{namespace}/{name}", "--host",
         f"{host.name}={host.uri}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "KUBECONFIG": str(plane.kubeconfig_path)})
    assert result.returncode == 0, f"console-log failed: {result.stderr}"
    return result.stdout


async def test_workers_join_through_kubeadm_and_leave_nothing(
        control_plane, capi_controller, kubeadm_bootstrap_controller, api_client, namespace, libvirt_host,
        node_base_volume, repository, tmp_path):
    core = client.CoreV1Api(api_client)
    assert provider_objects(libvirt_host, node_base_volume) == [], "the host is clean before the run"
    workload_cluster.install(control_plane)

    with node_joins.accepting_joins(control_plane, libvirt_host) as gateway:
        endpoint = (str(gateway.address), gateway.port)
        cluster = await workload_cluster.create_worker_cluster(api_client, control_plane, namespace, CLUSTER,
                                                               endpoint=endpoint)
        workers = worker_objects(tmp_path, repository, "", cluster.name, namespace, endpoint, libvirt_host,
                                 node_base_volume)
        deployment = by_kind(workers)["MachineDeployment"]["metadata"]["name"]
        async with operator_running(control_plane, {libvirt_host.name: libvirt_host.uri}):
            await create(api_client, workers)
            clock = Clock()
            await workload_cluster.scale(api_client, cluster, deployment, N)
            running = await join(api_client, namespace, clock)
            infra = {m["metadata"]["name"]: m for m in await libvirt_machines(api_client, namespace)}
            nodes = [await assert_joined_by_kubelet(api_client, namespace, m, infra[m["spec"]["infrastructureRef"]["name"]])
                     for m in running]
            boots = [boot_seconds(console_log(control_plane, libvirt_host, namespace,
                                              m["spec"]["infrastructureRef"]["name"])) for m in running]
            assert gateway.connections >= 2 * N, "discovery and the kubelets came through the gateway"
            print(f"\n[numbers] kubeadm join, MachineDeployment 0 -> {N}, phase by phase (all machines):\n"
                  f"{clock.report()}\n  guest clock (kernel start -> cloud-init final starts / finishes): "
                  + ", ".join(f"{up:.0f}s / {done:.0f}s" for up, done in boots))

            await iso_gone_then_a_reboot_keeps_the_node(api_client, control_plane, namespace, libvirt_host, running)

            await workload_cluster.scale(api_client, cluster, deployment, 0)
            down = Clock()
            await scale_down(api_client, namespace, libvirt_host, node_base_volume, down)
            remaining = {n.metadata.name for n in (await core.list_node()).items} & {n.metadata.name for n in nodes}
            assert remaining == set(), "Cluster API deleted the Nodes"
            print(f"[numbers] {N} -> 0:\n{down.report()}")

            await broken_join_is_visible_on_the_console(api_client, control_plane, namespace, cluster, workers,
                                                        libvirt_host)

            # Deleting the Cluster takes everything with it, the broken machine (still in flight) included; while
            # the operator runs (the LibvirtCluster's finalizer is its).
            await client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
                meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "clusters", cluster.name)

            async def cluster_gone():
                left = [item for group, version, plural in CLUSTER_KINDS
                        for item in await list_objects(api_client, namespace, group, version, plural)]
                return not left and provider_objects(libvirt_host, node_base_volume) == []

            await wait_until("the Cluster and everything of it gone, host clean", cluster_gone, SCALE_DOWN_DEADLINE_S,
                             interval=1.0)


async def join(api, namespace: str, clock: Clock) -> list[dict]:
    """Wait for N Machines Running whose Nodes are Ready, marking each phase when the last machine reaches it."""
    core = client.CoreV1Api(api)

    async def progress():
        found = await machines(api, namespace)
        infra = await libvirt_machines(api, namespace)
        if len(found) == N:
            clock.mark(f"{N} Machines created")
        if len([m for m in infra if m.get("spec", {}).get("providerID")]) == N:
            clock.mark(f"{N} domains running (providerID set)")
        if len([m for m in infra if m.get("status", {}).get("initialization", {}).get("provisioned")]) == N:
            clock.mark(f"{N} VMs provisioned (booted, address known)")
        tokens = [await join_token_id(api, namespace, m) for m in found
                  if m["spec"]["bootstrap"].get("dataSecretName")]
        if len(tokens) == N and all([await kubelet_csr(api, t) for t in tokens]):
            clock.mark(f"{N} kubelet CSRs posted (kubeadm join's TLS bootstrap)")
        nodes = (await core.list_node()).items
        if len(nodes) == N:
            clock.mark(f"{N} Nodes registered by their kubelets")
        if len([n for n in nodes if is_ready(n)]) == N:
            clock.mark(f"{N} Nodes Ready")
        running = [m for m in found if m.get("status", {}).get("phase") == "Running"
                   and m["status"].get("nodeRef", {}).get("name")]
        if len(found) == N and len(running) == N:
            clock.mark(f"{N} Machines Running (nodeRef)")
        ready = {n.metadata.name for n in nodes if is_ready(n)}
        return running if len(running) == N and {m["status"]["nodeRef"]["name"] for m in running} <= ready else None

    return await wait_until(f"{N} Machines Running with Ready Nodes joined by kubeadm", progress, JOIN_DEADLINE_S,
                            interval=2.0)


async def iso_gone_then_a_reboot_keeps_the_node(api, plane, namespace: str, host, running: list[dict]) -> None:
    """The Nodes joined (Machine.status.nodeRef set by Cluster API): every machine's NoCloud ISO, the bootstrap data,
    is ejected from its domain (running and persistent definition) and deleted from the pool, leaving the host without
    ISOs. Then one guest reboots for real (the guest agent runs the guest's own reboot): with no NoCloud seed, the
    Node comes back Ready with a new boot ID, the machine keeps its address, and what cloud-init did on that boot is
    read inside the guest (through the guest agent) and from its console."""
    core = client.CoreV1Api(api)
    clock = Clock()

    async def all_removed():
        infra = await libvirt_machines(api, namespace)
        done = [m for m in infra if (m.get("status") or {}).get("noCloudISORemoved") is True]
        return infra if len(infra) == N and len(done) == N else None
    infra = await wait_until("every machine's NoCloud ISO removed", all_removed, ISO_DEADLINE_S, interval=1.0)
    clock.mark(f"{N} NoCloud ISOs ejected and deleted (after the nodeRefs)")
    with host.connect() as conn:
        for machine in infra:
            domain = conn.lookupByUUIDString(machine["status"]["domainUUID"])
            for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):
                sources = domain_xml.cdrom_sources(domain.XMLDesc(flags))
                assert sources == [], f"{machine['metadata']['name']}: the CD-ROM still holds {sources} ({flags=})"
        pool = refreshed_pool(conn, host.pool_name)
        isos = [v for v in pool.listVolumes() if v.endswith("-cidata.iso")]
        assert isos == [], f"a host without ISOs after provisioning: {isos}"
    for machine in infra:
        events = (await core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={machine['metadata']['name']}")).items
        assert [e.type for e in events if e.reason == machine_reconcile.NOCLOUD_ISO_REMOVED] == ["Normal"]

    machine = next(m for m in running if m["spec"]["infrastructureRef"]["name"] == infra[0]["metadata"]["name"])
    node_name, uuid_ = machine["status"]["nodeRef"]["name"], infra[0]["status"]["domainUUID"]
    node = await core.read_node(node_name)
    old_boot = node.status.node_info.boot_id
    address = internal_ips(infra[0])
    await wait_until("the guest agent answering", lambda: _answers(host, uuid_), REBOOT_DEADLINE_S, interval=2.0)
    before = guest_agent.guest_shell(host, uuid_, GUEST_FACTS)
    timing_report.record_boot_profile("node", await asyncio.to_thread(guest_agent.boot_profile, host, uuid_))
    with host.connect() as conn:
        conn.lookupByUUIDString(uuid_).reboot(libvirt.VIR_DOMAIN_REBOOT_GUEST_AGENT)  # the guest's own reboot
    clock.mark("reboot requested (through the guest agent)")

    async def back():
        current = await core.read_node(node_name)
        return current if current.status.node_info.boot_id != old_boot and is_ready(current) else None
    node = await wait_until("the rebooted Node Ready with a new boot ID", back, REBOOT_DEADLINE_S, interval=2.0)
    clock.mark("the Node Ready again, with a new boot ID")
    await wait_until("the guest agent back", lambda: _answers(host, uuid_), REBOOT_DEADLINE_S, interval=1.0)
    after = guest_agent.guest_shell(host, uuid_, GUEST_FACTS)
    [now] = [m for m in await libvirt_machines(api, namespace) if m["metadata"]["uid"] == infra[0]["metadata"]["uid"]]
    node_ips = sorted(a.address for a in node.status.addresses if a.type == "InternalIP")
    assert internal_ips(now) == address and node_ips == address, (address, internal_ips(now), node_ips)
    assert facts(after)["boot-id"] == node.status.node_info.boot_id != facts(before)["boot-id"]
    assert network_facts(after) == network_facts(before), f"the network config changed:\n{before}\n---\n{after}"
    # cloud-init ran at the first boot (result.json is its finished run, ds-identify took the seed) and its
    # vendor-data script wrote /etc/cloud/cloud-init.disabled; at the second boot its generator left it off: /run (a
    # fresh tmpfs) has the "disabled" marker and nothing of a run (no ds-identify log, status or result).
    first, second = facts(before), facts(after)
    assert first["result"] and "NoCloud" in first["ds-identify"], before
    assert first["disabled-file"] == second["disabled-file"] == "/etc/cloud/cloud-init.disabled", (before, after)
    markers = second["run-markers"].split()
    assert "disabled" in markers and "enabled" not in markers and not second["result"], after
    assert not {"status.json", "result.json", "ds-identify.log"} & set(markers) and not second["ds-identify"], after
    assert second["instance-id"] == first["instance-id"] == uuid_, (before, after)
    second_boot = console_log(plane, host, namespace, infra[0]["metadata"]["name"]).split(KERNEL_BANNER)[-1]
    cloud_init = [line for line in second_boot.splitlines() if "cloud-init" in line.lower()]
    print(f"\n[numbers] NoCloud ISO removal and a reboot without it:\n{clock.report()}\n"
          f"  in the guest before the reboot:\n{_indent(before)}\n  after:\n{_indent(after)}\n"
          f"  cloud-init on the console of the second boot ({len(cloud_init)} lines):\n"
          + _indent("\n".join(cloud_init[-25:])))


GUEST_FACTS = (
    "echo boot-id=$(cat /proc/sys/kernel/random/boot_id); "
    "echo instance-id=$(cat /var/lib/cloud/data/instance-id 2>/dev/null); "
    "echo previous-instance-id=$(cat /var/lib/cloud/data/previous-instance-id 2>/dev/null); "
    "echo instances=$(ls /var/lib/cloud/instances 2>/dev/null | tr '\\n' ' '); "
    "echo run-markers=$(ls /run/cloud-init 2>/dev/null | tr '\\n' ' '); "
    "echo disabled-file=$(ls /etc/cloud/cloud-init.disabled 2>/dev/null); "
    "echo result=$(cat /run/cloud-init/result.json 2>/dev/null | tr -d '\\n '); "
    "echo ds-identify=$(grep -E 'single entry|RESULT|returning|found' /run/cloud-init/ds-identify.log 2>/dev/null "
    "| tr '\\n' '|'); "
    "for f in /etc/systemd/network/* /etc/network/interfaces.d/* /etc/netplan/*; do [ -f \"$f\" ] && "
    "echo \"network-file $f $(sha256sum < \"$f\" | cut -c1-16)\"; done; "
    "ip -4 -o addr show scope global | awk '{print \"network-address \" $2 \" \" $4}'; true")
KERNEL_BANNER = "Linux version "


def facts(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("network-"))


def network_facts(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("network-"))


def internal_ips(libvirt_machine: dict) -> list[str]:
    return sorted(a["address"] for a in (libvirt_machine.get("status") or {}).get("addresses") or []
                  if a["type"] == "InternalIP")


async def _answers(host, uuid_: str) -> bool:
    return guest_agent.agent_answers(host, uuid_)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


def boot_seconds(console: str) -> tuple[float, float]:
    """From the guest's own console: seconds since its kernel started when cloud-init's final stage (runcmd:
    `kubeadm join`) began, and when cloud-init finished."""
    started, finished = UP_SECONDS.search(console), FINISHED_SECONDS.search(console)
    assert started and finished, f"cloud-init's final stage is not on the console:\n{console[-3000:]}"
    assert "This node has joined the cluster" in console, console[-3000:]
    return float(started.group(1)), float(finished.group(1))


async def scale_down(api, namespace: str, host, base_volume: str, clock: Clock) -> None:
    core = client.CoreV1Api(api)

    async def progress():
        found, infra = await machines(api, namespace), await libvirt_machines(api, namespace)
        if not found and not infra:
            clock.mark("Machines and LibvirtMachines gone")
        nodes = (await core.list_node()).items
        if not nodes:
            clock.mark("Nodes deleted by Cluster API")
        clean = provider_objects(host, base_volume) == []
        if clean:
            clock.mark("host clean (domains, overlays, ISOs, serial logs)")
        return clean and not found and not infra and not nodes

    await wait_until("every Machine, Node, domain and volume gone", progress, SCALE_DOWN_DEADLINE_S, interval=1.0)


async def broken_join_is_visible_on_the_console(api, plane, namespace: str, cluster, workers: list[dict],
                                                host) -> None:
    """A MachineDeployment of 1 whose join configuration names an existing bootstrap token's ID with a wrong secret:
    kubeadm refuses cluster-info (its signature does not match), the Machine never gets a Node, and
    `capi-libvirt console-log` shows kubeadm's reason."""
    core = client.CoreV1Api(api)
    tokens = (await core.list_namespaced_secret("kube-system", field_selector="type=bootstrap.kubernetes.io/token")).items
    assert tokens, "kubeadm's bootstrap-token phase made a token"
    token_id = base64.b64decode(tokens[0].data["token-id"]).decode()
    real_secret = base64.b64decode(tokens[0].data["token-secret"]).decode()
    wrong_secret = "0" * 16 if real_secret != "0" * 16 else "1" * 16

    broken = copy.deepcopy([d for d in workers if d["kind"] in ("KubeadmConfigTemplate", "MachineDeployment")])
    for document in broken:
        document["metadata"] = {"name": f"{cluster.name}-broken", "namespace": namespace}
    template, deployment = by_kind(broken)["KubeadmConfigTemplate"], by_kind(broken)["MachineDeployment"]
    template["spec"]["template"]["spec"]["joinConfiguration"]["discovery"] = {
        "bootstrapToken": {"token": f"{token_id}.{wrong_secret}"}}
    deployment["spec"]["replicas"] = 1
    deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"] = template["metadata"]["name"]
    await create(api, broken)

    async def refusal_on_console():
        infra = await libvirt_machines(api, namespace)
        if not infra or not infra[0].get("status", {}).get("host"):
            return None
        console = console_log(plane, host, namespace, infra[0]["metadata"]["name"])
        return console if JOIN_REFUSED in console else None

    console = await wait_until("kubeadm's refusal on the broken machine's console", refusal_on_console,
                               BROKEN_DEADLINE_S, interval=10.0)
    print("\n[console-log] the broken join, as `capi-libvirt console-log` shows it:\n"
          + "\n".join(line for line in console.splitlines() if "kubeadm" in line.lower() or JOIN_REFUSED in line)[-1500:])
    [machine] = await machines(api, namespace)
    assert not machine.get("status", {}).get("nodeRef"), "a machine whose join failed has no Node"
    assert not (await core.list_node()).items
