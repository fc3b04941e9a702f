"""What a joined node proves on the whole cluster (tests/e2e/test_whole_cluster.py), beyond being Ready:

- its bootstrap data does not outlive the join: once Cluster API set the Machines' nodeRefs, every NoCloud ISO is
  ejected from its domain (running and persistent definitions) and deleted from the pool, with one event each;
- what the guest did at boot is read as users read it, with `capi-libvirt console-log` (over libvirt, the machine's
  serial log): seconds since its kernel started when cloud-init's final stage (`kubeadm init` or `join`) began and
  ended, and kubeadm's own last word;
- a guest rebooted without its seed (the guest's own reboot, through the guest agent) comes back: its Node Ready
  with a new boot ID, the same address and network configuration, cloud-init off (read in the guest and on the
  console of the second boot);
- a join broken on purpose (an existing bootstrap token's ID with a wrong secret) never makes a Node and shows why on
  `capi-libvirt console-log`.

The workload cluster's reads go through the endpoint and retry while its API server does not answer (day2_rollouts.
workload_read), as the control-plane VM's API server stalls under TCG.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import os
import pathlib
import re
import subprocess
import sys

import libvirt
from kubernetes_asyncio import client

import guest_agent
import timing_report
from capi_libvirt.api import reasons
from capi_libvirt.core import domain_xml_edits
from day2_rollouts import DEPLOYMENT_LABEL, workload_read
from guests import refreshed_pool
from kubeadm_workers import by_kind, create, is_ready, libvirt_machines, machines

from waiting import Clock, Pending, events_posted, wait_until

ISO_DEADLINE_S = 300.0  # the Machine's nodeRef wakes the machine at once; its next pass removes the ISO
REBOOT_DEADLINE_S = 900.0  # a TCG guest's reboot to a Ready kubelet, beside the control-plane VM
BROKEN_DEADLINE_S = 900.0
BROKEN_DISCOVERY_S = 300  # kubeadm's default: the refusal is immediate, any retry ends long before the deadline
UP_SECONDS = re.compile(r"Cloud-init v\. \S+ running 'modules:final' at .*?Up ([0-9.]+) seconds")
FINISHED_SECONDS = re.compile(r"Cloud-init v\. \S+ finished at .*?Up ([0-9.]+) seconds")
INITIALIZED = "Your Kubernetes control-plane has initialized successfully"
JOINED = "This node has joined the cluster"
JOIN_REFUSED = "failed to verify JWS signature of received cluster info object"
KERNEL_BANNER = "Linux version "
GUEST_FACTS = (
    "echo boot-id=$(cat /proc/sys/kernel/random/boot_id); "
    "echo instance-id=$(cat /var/lib/cloud/data/instance-id 2>/dev/null); "
    "echo run-markers=$(ls /run/cloud-init 2>/dev/null | tr '\\n' ' '); "
    "echo disabled-file=$(ls /etc/cloud/cloud-init.disabled 2>/dev/null); "
    "echo result=$(cat /run/cloud-init/result.json 2>/dev/null | tr -d '\\n '); "
    "echo ds-identify=$(grep -E 'single entry|RESULT|returning|found' /run/cloud-init/ds-identify.log 2>/dev/null "
    "| tr '\\n' '|'); "
    "for f in /etc/systemd/network/* /etc/network/interfaces.d/* /etc/netplan/*; do [ -f \"$f\" ] && "
    "echo \"network-file $f $(sha256sum < \"$f\" | cut -c1-16)\"; done; "
    "ip -4 -o addr show scope global | awk '$2 !~ /^(flannel|cni|veth)/ {print \"network-address \" $2 \" \" $4}'; "
    "true")
# The machine's own network (its NIC's files and addresses), not the pod network's interfaces (flannel.1, cni0, the
# pods' veths), which flannel makes again some time after the kubelet is back and so differ right after a reboot.


def console_log(kubeconfig: pathlib.Path, namespace: str, name: str) -> str:
    """`capi-libvirt console-log` as a user runs it, with the management cluster's kubeconfig: it reaches the
    machine's host through its LibvirtHost object and credentials Secret (tests/declared_host.py)."""
    result = subprocess.run(
        [sys.executable, "-m", "capi_libvirt", "console-log", f"{namespace}/{name}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert result.returncode == 0, f"console-log failed: {result.stderr}"
    return result.stdout


def boot_seconds(console: str, kubeadm_said: str) -> tuple[float, float]:
    """From the guest's own console: seconds since its kernel started when cloud-init's final stage (runcmd: kubeadm)
    began and when cloud-init finished; kubeadm's success line `kubeadm_said` must be there."""
    started, finished = UP_SECONDS.search(console), FINISHED_SECONDS.search(console)
    assert started and finished, f"cloud-init's final stage is not on the console:\n{console[-3000:]}"
    assert kubeadm_said in console, console[-3000:]
    return float(started.group(1)), float(finished.group(1))


def internal_ips(libvirt_machine: dict) -> list[str]:
    return sorted(a["address"] for a in (libvirt_machine.get("status") or {}).get("addresses") or []
                  if a["type"] == "InternalIP")


async def seeds_gone(api: client.ApiClient, namespace: str, host, count: int) -> list[dict]:
    """Every one of the `count` machines' NoCloud ISOs ejected (running and persistent definitions) and deleted, no
    ISO left in the pool, one NoCloudISODetached event each; the LibvirtMachines."""
    async def all_removed():
        infra = await libvirt_machines(api, namespace)
        done = [m for m in infra if (m.get("status") or {}).get("noCloudISORemoved") is True]
        return infra if len(infra) == len(done) == count else Pending(
            removed={m["metadata"]["name"]: (m.get("status") or {}).get("noCloudISORemoved") for m in infra})

    infra = await wait_until("every machine's NoCloud ISO removed", all_removed, ISO_DEADLINE_S, interval=1.0)
    with host.connect() as conn:
        for machine in infra:
            domain = conn.lookupByUUIDString(machine["status"]["domainUUID"])
            for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):
                sources = domain_xml_edits.cdrom_sources(domain.XMLDesc(flags))
                assert sources == [], f"{machine['metadata']['name']}: the CD-ROM still holds {sources} ({flags=})"
        isos = [v for v in refreshed_pool(conn, host.pool_name).listVolumes() if v.endswith("-cidata.iso")]
        assert isos == [], f"a host without ISOs after provisioning: {isos}"
    core = client.CoreV1Api(api)
    for machine in infra:
        events = await events_posted(core, namespace, reasons.NOCLOUD_ISO_REMOVED,
                                     f"involvedObject.name={machine['metadata']['name']}")
        assert [e.type for e in events] == ["Normal"]
    return infra


def boots_on_the_console(kubeconfig: pathlib.Path, namespace: str, infra: list[dict],
                         control_plane_machine: str) -> str:
    """Each machine's boot as `capi-libvirt console-log` shows it: kubeadm init on the control-plane machine, kubeadm
    join on the others; the guest-clock seconds, one line per machine."""
    lines = []
    for machine in infra:
        name = machine["metadata"]["name"]
        said = INITIALIZED if name == control_plane_machine else JOINED
        up, done = boot_seconds(console_log(kubeconfig, namespace, name), said)
        lines.append(f"  {name}: cloud-init's final stage (kubeadm) from {up:.0f}s to {done:.0f}s after its kernel "
                     f"started; the console says {said!r}")
    return "\n".join(lines)


def _facts(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("network-"))


def _network_facts(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("network-"))


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


async def _agent_answers(host, uuid: str) -> bool:
    return await asyncio.to_thread(guest_agent.agent_answers, host, uuid)


async def a_reboot_keeps_the_node(api: client.ApiClient, workload_api: client.ApiClient, kubeconfig: pathlib.Path,
                                  namespace: str, host, machine: dict) -> str:
    """The guest of the (Running) Machine `machine`, its seed gone, reboots for real: its Node comes back Ready with a
    new boot ID and the same address, its network configuration unchanged, and cloud-init stays off (read in the
    guest, before and after, and on the console of the second boot). Returns the phases and what was read."""
    core = client.CoreV1Api(workload_api)
    clock = Clock()
    [infra] = [m for m in await libvirt_machines(api, namespace)
               if m["metadata"]["name"] == machine["spec"]["infrastructureRef"]["name"]]
    node_name, uuid = machine["status"]["nodeRef"]["name"], infra["status"]["domainUUID"]

    async def read_node():
        return await workload_read(core.read_node(node_name, _request_timeout=10))

    node = await wait_until("the Node read", read_node, REBOOT_DEADLINE_S, interval=2.0)
    old_boot, address = node.status.node_info.boot_id, internal_ips(infra)
    await wait_until("the guest agent answering", lambda: _agent_answers(host, uuid), REBOOT_DEADLINE_S, interval=2.0)
    before = await asyncio.to_thread(guest_agent.guest_shell, host, uuid, GUEST_FACTS)
    timing_report.record_boot_profile("node", await asyncio.to_thread(guest_agent.boot_profile, host, uuid))
    with host.connect() as conn:
        conn.lookupByUUIDString(uuid).reboot(libvirt.VIR_DOMAIN_REBOOT_GUEST_AGENT)  # the guest's own reboot
    clock.mark("reboot requested (through the guest agent)")

    async def back():
        current = await read_node()
        if isinstance(current, Pending):
            return current
        if current.status.node_info.boot_id != old_boot and is_ready(current):
            return current
        return Pending(boot_id=current.status.node_info.boot_id, ready=is_ready(current))

    node = await wait_until("the rebooted Node Ready with a new boot ID", back, REBOOT_DEADLINE_S, interval=2.0)
    clock.mark("the Node Ready again, with a new boot ID")
    await wait_until("the guest agent back", lambda: _agent_answers(host, uuid), REBOOT_DEADLINE_S, interval=1.0)
    after = await asyncio.to_thread(guest_agent.guest_shell, host, uuid, GUEST_FACTS)
    [now] = [m for m in await libvirt_machines(api, namespace) if m["metadata"]["uid"] == infra["metadata"]["uid"]]
    node_ips = sorted(a.address for a in node.status.addresses if a.type == "InternalIP")
    assert internal_ips(now) == address and node_ips == address, (address, internal_ips(now), node_ips)
    first, second = _facts(before), _facts(after)
    assert second["boot-id"] == node.status.node_info.boot_id != first["boot-id"]
    assert _network_facts(after) == _network_facts(before), f"the network config changed:\n{before}\n---\n{after}"
    # cloud-init ran at the first boot (result.json is its finished run, ds-identify took the seed) and its
    # vendor-data script wrote /etc/cloud/cloud-init.disabled; at the second boot its generator left it off: /run (a
    # fresh tmpfs) has the "disabled" marker and nothing of a run (no ds-identify log, status or result).
    assert first["result"] and "NoCloud" in first["ds-identify"], before
    assert first["disabled-file"] == second["disabled-file"] == "/etc/cloud/cloud-init.disabled", (before, after)
    markers = second["run-markers"].split()
    assert "disabled" in markers and "enabled" not in markers and not second["result"], after
    assert not {"status.json", "result.json", "ds-identify.log"} & set(markers) and not second["ds-identify"], after
    assert second["instance-id"] == first["instance-id"] == uuid, (before, after)
    console = await asyncio.to_thread(console_log, kubeconfig, namespace, infra["metadata"]["name"])
    cloud_init = [line for line in console.split(KERNEL_BANNER)[-1].splitlines() if "cloud-init" in line.lower()]
    return (f"{clock.report()}\n  in the guest before the reboot:\n{_indent(before)}\n  after:\n{_indent(after)}\n"
            f"  cloud-init on the console of the second boot ({len(cloud_init)} lines):\n"
            + _indent("\n".join(cloud_init[-25:])))


async def broken_join_is_visible_on_the_console(api: client.ApiClient, workload_api: client.ApiClient,
                                                kubeconfig: pathlib.Path, namespace: str, cluster: str,
                                                documents: list[dict], host) -> str:
    """A MachineDeployment of 1 beside the cluster's workers whose join configuration names an existing bootstrap
    token's ID with a wrong secret: kubeadm refuses cluster-info (its signature does not match), the Machine never
    gets a Node, and `capi-libvirt console-log` shows kubeadm's reason. Returns those console lines. The machine is
    left in flight, for the Cluster's deletion to take."""
    core = client.CoreV1Api(workload_api)

    async def tokens():
        listed = await workload_read(core.list_namespaced_secret(
            "kube-system", field_selector="type=bootstrap.kubernetes.io/token", _request_timeout=10))
        return listed if isinstance(listed, Pending) or listed.items else Pending(tokens="none")

    listed = await wait_until("a bootstrap token in the workload cluster", tokens, BROKEN_DEADLINE_S, 3.0)
    # The one that lives longest (kubeadm init's, 24 hours): a joined worker's token is no longer refreshed by the
    # bootstrap provider and may expire before the broken machine asks, which kubeadm would retry, not refuse.
    token = max(listed.items, key=lambda t: base64.b64decode((t.data or {}).get("expiration", "")).decode())
    token_id = base64.b64decode(token.data["token-id"]).decode()
    real_secret = base64.b64decode(token.data["token-secret"]).decode()
    wrong_secret = "0" * 16 if real_secret != "0" * 16 else "1" * 16

    broken = copy.deepcopy([d for d in documents if d["kind"] in ("KubeadmConfigTemplate", "MachineDeployment")
                            and d["metadata"]["name"] == f"{cluster}-md-0"])
    for document in broken:
        document["metadata"] = {"name": f"{cluster}-broken", "namespace": namespace}
    template, deployment = by_kind(broken)["KubeadmConfigTemplate"], by_kind(broken)["MachineDeployment"]
    join = template["spec"]["template"]["spec"]["joinConfiguration"]
    join["discovery"] = {"bootstrapToken": {"token": f"{token_id}.{wrong_secret}"}}
    join.setdefault("timeouts", {})["discoverySeconds"] = BROKEN_DISCOVERY_S
    deployment["spec"]["replicas"] = 1
    deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"]["name"] = template["metadata"]["name"]
    await create(api, broken)

    def of_broken(found: list[dict]) -> list[dict]:
        return [m for m in found if (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == f"{cluster}-broken"]

    async def refusal_on_console():
        names = {m["spec"]["infrastructureRef"]["name"] for m in of_broken(await machines(api, namespace))}
        infra = [m for m in await libvirt_machines(api, namespace) if m["metadata"]["name"] in names]
        if not infra or not infra[0].get("status", {}).get("host"):
            return Pending(machines=sorted(names))
        console = await asyncio.to_thread(console_log, kubeconfig, namespace, infra[0]["metadata"]["name"])
        return console if JOIN_REFUSED in console else Pending(console_tail=console[-300:])

    console = await wait_until("kubeadm's refusal on the broken machine's console", refusal_on_console,
                               BROKEN_DEADLINE_S, interval=10.0)
    [machine] = of_broken(await machines(api, namespace))
    assert not (machine.get("status") or {}).get("nodeRef"), "a machine whose join failed has no Node"
    [infra] = [m for m in await libvirt_machines(api, namespace)
               if m["metadata"]["name"] == machine["spec"]["infrastructureRef"]["name"]]
    nodes = await wait_until("the workload cluster's Nodes listed", lambda: workload_read(core.list_node(
        _request_timeout=10)), BROKEN_DEADLINE_S, interval=3.0)
    provider_id = (infra.get("spec") or {}).get("providerID")
    assert provider_id and provider_id not in {n.spec.provider_id for n in nodes.items}, "no Node of the broken join"
    return "\n".join(line for line in console.splitlines()
                     if "kubeadm" in line.lower() or JOIN_REFUSED in line)[-1500:]
