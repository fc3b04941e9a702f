"""The machine reconcile's phases, pass after pass, against the in-memory host (devenv.memory_host) and an in-memory
API (tests/memory_api.py): a machine placed, its volumes, seed and domain made, started, its lease found and its NIC
pinned, its providerID and addresses published; deleted, leaving the host as it was. Then the faults: the host
unreachable mid-provisioning, its pool full, its domain lost behind the provider's back, a define refused.

The fast tier's view of the whole machine reconcile (milliseconds a pass); the integration and e2e tiers run the same
reconcile against a real libvirtd and real guests."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from capi_libvirt.api import meta, reasons, v1alpha1_host
from capi_libvirt.core import conditions, naming, provider_id
from capi_libvirt.hypervisor import errors
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.reconcile import hosts
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv.memory_host import MemoryHost, MemoryHosts
from devenv.memory_state import GIB
from memory_api import CLUSTERS, LIBVIRT_HOSTS, LIBVIRT_MACHINES, MACHINES, SECRETS, MemoryAPI

pytestmark = pytest.mark.unit

NS, NAME, CLUSTER, HOST = "tenant-a", "worker-0", "c1", "kvm1"
BASE = "base.qcow2"
SPEC = {"image": {"volume": BASE}, "domainType": "qemu", "machineType": "pc", "cpus": 1, "memoryMiB": 512,
        "diskGiB": 4, "interfaces": [{"network": "default"}]}


@dataclasses.dataclass
class Bed:
    host: MemoryHost
    kube: MemoryAPI
    deps: machine_reconcile.Dependencies
    events: list[tuple[str, str, str]]

    @property
    def body(self) -> dict[str, Any] | None:
        return self.kube.get(LIBVIRT_MACHINES, NS, NAME)

    def condition(self, kind: str = conditions.PROVISIONED) -> dict[str, Any]:
        assert self.body is not None
        return conditions.get_condition((self.body.get("status") or {}).get("conditions"), kind) or {}

    async def passes(self, until, most: int = 12) -> int:
        """Reconcile passes (as the operator's worker runs them, without the waits between) until `until(bed)`;
        how many it took."""
        for count in range(1, most + 1):
            await machine_reconcile.reconcile(self.deps, NS, NAME)
            if until(self):
                return count
        raise AssertionError(f"not after {most} passes: Provisioned {self.condition()}, events {self.events}")

    def uid(self) -> str:
        assert self.body is not None
        return self.body["metadata"]["uid"]


async def bed(spec: dict[str, Any] | None = None) -> Bed:
    """kvm1 in memory with its base image, probed; a Cluster whose infrastructure is provisioned, a Machine with its
    bootstrap Secret, and its LibvirtMachine, as Cluster API makes them."""
    host = MemoryHost(HOST)
    host.add_volume("default", BASE, b"QFI\xfb", capacity=2 * GIB, fmt="qcow2")
    registry = host_api.HostRegistry({HOST: "memory:///system"}, factory=MemoryHosts(host))
    inventory = inventory_.Inventory(registry, management_cluster="mc-1")
    await inventory.probe(HOST)
    kube = MemoryAPI()
    labels = {meta.CLUSTER_NAME_LABEL: CLUSTER}
    kube.add(CLUSTERS, {"metadata": {"namespace": NS, "name": CLUSTER},
                        "status": {"initialization": {"infrastructureProvisioned": True}}})
    kube.add(SECRETS, {"metadata": {"namespace": NS, "name": f"{NAME}-bootstrap"},
                       "data": {"value": b"#cloud-config\nhostname: worker-0\n", "format": b"cloud-config"}})
    machine = kube.add(MACHINES, {"metadata": {"namespace": NS, "name": NAME, "labels": labels},
                                  "spec": {"clusterName": CLUSTER, "bootstrap": {"dataSecretName": f"{NAME}-bootstrap"}}})
    kube.add(LIBVIRT_MACHINES, {"metadata": {"namespace": NS, "name": NAME, "labels": labels, "ownerReferences": [
        {"apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine", "name": NAME,
         "uid": machine["metadata"]["uid"], "controller": True}]}, "spec": spec or SPEC})
    events: list[tuple[str, str, str]] = []
    deps = machine_reconcile.Dependencies(
        kube=kube, inventory=inventory, management_cluster="mc-1", now=lambda: "2026-12-05T00:00:00Z",
        post_event=lambda body, kind, reason, message: events.append((kind, reason, message)))
    return Bed(host, kube, deps, events)


def provisioned(b: Bed) -> bool:
    return bool(b.body and (b.body.get("status") or {}).get("initialization", {}).get("provisioned"))


def machine_volumes(b: Bed) -> list[str]:
    return [name for name in b.host.volume_names("default") if name != BASE]


async def test_a_machine_is_provisioned_on_the_host_and_its_deletion_leaves_the_host_as_it_was() -> None:
    b = await bed()
    await b.passes(provisioned)
    body = b.body
    assert body is not None
    uuid = naming.domain_uuid(body["metadata"]["uid"])
    assert body["spec"]["providerID"] == provider_id.format_provider_id(HOST, uuid)
    assert machine_reconcile.FINALIZER in body["metadata"]["finalizers"]
    status = body["status"]
    assert status["host"] == HOST and status["domainUUID"] == uuid and status["state"] == "running"
    leased = b.host.leased(uuid)
    assert [a["address"] for a in status["addresses"] if a["type"] == "InternalIP"] == list(leased.values())
    assert b.condition()["status"] == "True" and b.condition(conditions.READY)["status"] == "True"
    # What the host holds: the running domain, named after the machine, owned by it; overlay, seed and serial log.
    domain = b.host.domains[uuid]
    assert domain.state == "running" and domain.name == naming.domain_name(NS, NAME, body["metadata"]["uid"])
    volumes = machine_reconcile.machine_volumes(NS, NAME, body["metadata"]["uid"], "default")
    assert sorted(machine_volumes(b)) == sorted([volumes.overlay, volumes.nocloud, volumes.serial_log])
    overlay = b.host.pools["default"].volumes[volumes.overlay]
    assert overlay.backing == f"/var/lib/libvirt/default/{BASE}" and overlay.capacity == 4 * GIB
    assert b"hostname: worker-0" in b.host.pools["default"].volumes[volumes.nocloud].data  # the seed, as uploaded
    # The NIC started able to ask only for its lease; once leased, its filter is pinned to that address.
    (mac, address), = leased.items()
    assert f"value='{address}'" in domain.xml or f'value="{address}"' in domain.xml
    assert ("Normal", reasons.TRAFFIC_FILTER_PINNED) in [(kind, reason) for kind, reason, _ in b.events]
    # Placement, the domain and its start each asked the host once.
    assert b.host.operations["define_domain"] == 1 and b.host.operations["start_domain"] == 1
    assert b.host.operations["ensure_overlay"] == 1

    b.kube.delete(LIBVIRT_MACHINES, NS, NAME)
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    assert b.body is None, "the finalizer released once the host was clean"
    assert b.host.domains == {} and machine_volumes(b) == []


async def test_an_unreachable_host_mid_provisioning_says_so_and_the_machine_goes_on_when_it_is_back() -> None:
    b = await bed()
    b.host.fail("define_domain", errors.HostUnreachable("define domain: Cannot recv data: Connection reset by peer",
                                                        HOST))
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    condition = b.condition()
    assert condition["status"] == "False" and condition["reason"] == reasons.HOST_UNREACHABLE
    assert "Connection reset by peer" in condition["message"]
    assert b.host.domains == {}
    await b.passes(provisioned)
    assert len(b.host.domains) == 1 and b.host.operations["define_domain"] == 2


async def test_a_host_unreachable_from_the_start_holds_the_machine_without_touching_anything() -> None:
    b = await bed()
    b.host.unreachable = "Cannot recv data: Connection refused"
    await b.deps.inventory.probe(HOST)
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    condition = b.condition()
    assert (condition["status"], condition["reason"]) == ("False", reasons.HOST_UNREACHABLE), condition
    assert condition["message"] == "no healthy host in the inventory"
    assert [name for name, _ in b.host.asked] == ["probe", "probe"], "only the prober asked it anything"
    assert b.host.domains == {} and machine_volumes(b) == []
    b.host.unreachable = None
    await b.deps.inventory.probe(HOST)
    await b.passes(provisioned)


async def test_a_full_pool_is_refused_at_placement_and_nothing_is_made() -> None:
    b = await bed()
    b.host.fill_pool("default", leave_bytes=1 * GIB)  # less than the machine's 4 GiB disk
    await b.deps.inventory.probe(HOST)
    await machine_reconcile.reconcile(b.deps, NS, NAME)
    condition = b.condition()
    assert condition["status"] == "False" and condition["reason"] == reasons.INSUFFICIENT_CAPACITY, condition
    assert "4.0 GiB of disk in pool default" in condition["message"] and "1.0 GiB left" in condition["message"]
    assert b.host.domains == {} and machine_volumes(b) == []
    assert (b.body or {}).get("spec", {}).get("providerID") is None, "not placed"


async def test_a_pool_that_fills_after_placement_fails_the_upload_and_leaves_no_half_made_seed() -> None:
    b = await bed()
    upload = b.host.hold("replace_nocloud")
    running = asyncio.ensure_future(machine_reconcile.reconcile(b.deps, NS, NAME))
    await asyncio.wait_for(upload.reached.wait(), 5)
    b.host.fill_pool("default")  # something else took the rest meanwhile
    upload.release()
    await running
    condition = b.condition()
    assert condition["status"] == "False" and condition["reason"] == reasons.HYPERVISOR_ERROR, condition
    assert "Not enough space" in condition["message"]
    volumes = machine_reconcile.machine_volumes(NS, NAME, b.uid(), "default")
    assert volumes.nocloud not in b.host.volume_names("default") and b.host.domains == {}
    b.host.pools["default"].used_elsewhere = 0  # the admin made room
    await b.passes(provisioned)


async def test_a_domain_lost_behind_the_providers_back_is_made_again() -> None:
    b = await bed()
    await b.passes(provisioned)
    uuid = naming.domain_uuid(b.uid())
    b.host.lose_domain(uuid)
    await b.passes(lambda b: uuid in b.host.domains and b.host.domains[uuid].state == "running" and provisioned(b))
    assert b.host.operations["define_domain"] == 2


async def test_a_define_the_host_refuses_is_a_failure_with_its_message_and_backs_off() -> None:
    b = await bed()
    b.host.fail("define_domain", errors.HypervisorError("define domain: unsupported configuration: bad", HOST), times=2)
    first = await machine_reconcile.reconcile(b.deps, NS, NAME)
    second = await machine_reconcile.reconcile(b.deps, NS, NAME)
    condition = b.condition()
    assert condition["reason"] == reasons.HYPERVISOR_ERROR and "unsupported configuration" in condition["message"]
    assert first is not None and second is not None and second > first, "backoff grows"
    await b.passes(provisioned)


async def test_a_provisioned_machine_has_no_timer_and_its_hosts_probe_wakes_it_when_its_domain_changes() -> None:
    b = await bed()
    await b.passes(provisioned)
    assert await machine_reconcile.reconcile(b.deps, NS, NAME) is None  # provisioned: looked at again only if woken
    woken: list[set[tuple[str, str]]] = []
    b.deps = dataclasses.replace(b.deps, wake_machines=lambda keys: woken.append(set(keys)))
    await hosts.probe_and_publish(b.deps, HOST)
    assert woken == [], "its domain is new since the last probe: its machine made it, nothing to wake"
    await hosts.probe_and_publish(b.deps, HOST)
    assert woken == [], "nothing changed since the last probe"
    uuid = naming.domain_uuid(b.uid())
    b.host.domains[uuid].state = "shutoff"  # the guest powered itself off
    await hosts.probe_and_publish(b.deps, HOST)
    assert woken == [{(NS, NAME)}]
    await b.passes(lambda b: b.host.domains[uuid].state == "running")  # the woken pass starts it again
    await hosts.probe_and_publish(b.deps, HOST)
    b.host.lose_domain(uuid)
    await hosts.probe_and_publish(b.deps, HOST)
    assert woken[1:] == [{(NS, NAME)}, {(NS, NAME)}], "running again, then gone: each woke it"


async def test_a_seed_not_removed_yet_brings_the_provisioned_machine_back_until_it_is() -> None:
    b = await bed()
    await b.passes(provisioned)
    b.kube.objects[(MACHINES, NS, NAME)]["status"] = {"nodeRef": {"name": NAME}}  # the node joined
    b.host.fail("eject_nocloud", errors.HypervisorError("eject: device busy", HOST), times=1)
    assert await machine_reconcile.reconcile(b.deps, NS, NAME) == machine_reconcile.RECHECK_SEED_REMOVAL
    assert (b.body or {})["status"].get("noCloudISORemoved") is None
    assert await machine_reconcile.reconcile(b.deps, NS, NAME) is None  # removed: no timer any more
    assert (b.body or {})["status"]["noCloudISORemoved"] is True
    assert [reason for _kind, reason, _message in b.events][-2:] == [reasons.NOCLOUD_ISO_NOT_REMOVED,
                                                                   reasons.NOCLOUD_ISO_REMOVED]


async def test_a_hosts_status_is_written_when_it_changed_and_otherwise_only_as_a_heartbeat() -> None:
    host = MemoryHost("kvm2")
    now = [1000.0]
    inventory = inventory_.Inventory(host_api.HostRegistry({}, factory=MemoryHosts(host)), clock=lambda: now[0],
                                     management_cluster="mc-1")
    kube = MemoryAPI()
    kube.add(LIBVIRT_HOSTS, {"metadata": {"name": "kvm2"}, "spec": {"uri": "qemu+tls://kvm2/system"}})
    deps = machine_reconcile.Dependencies(kube=kube, inventory=inventory, post_event=lambda *args: None)
    inventory.upsert("kvm2", v1alpha1_host.LibvirtHostSpec(uri="qemu+tls://kvm2/system"), None)

    def writes() -> int:
        return sum(1 for verb, name, _ in kube.writes if verb == f"PATCH {LIBVIRT_HOSTS}" and name == "kvm2")

    await hosts.probe_and_publish(deps, "kvm2")
    assert writes() == 1  # the first probe is written
    now[0] += hosts.STATUS_HEARTBEAT_S - 1
    await hosts.probe_and_publish(deps, "kvm2")
    assert writes() == 1, "nothing changed, and written less than a heartbeat ago"
    host.add_volume("default", "made-by-someone.qcow2", b"x", capacity=GIB)  # the pool's numbers change
    await hosts.probe_and_publish(deps, "kvm2")
    assert writes() == 2
    now[0] += hosts.STATUS_HEARTBEAT_S
    await hosts.probe_and_publish(deps, "kvm2")
    assert writes() == 3, "a heartbeat: its lastProbeTime moves on"
