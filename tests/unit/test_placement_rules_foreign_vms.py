"""Placement by what a host really has: foreign VMs (not this provider's) taken off the host's capacity, the free-memory
floor, the refusal naming per host why, which domains count as foreign, and the LibvirtHost status that reports it."""

from __future__ import annotations

import dataclasses

import pytest

from capi_libvirt.api import reasons, v1alpha1_host
from capi_libvirt.core import placement, tenancy
from capi_libvirt.core.domain_owner import Owner
from capi_libvirt.core.placement import DomainUsage, HostLoad, NoHost, Placed, Request, choose_host
from capi_libvirt.hypervisor import probe as host_probe
from capi_libvirt.reconcile import hosts as hosts_reconcile
from capi_libvirt.reconcile import inventory

pytestmark = pytest.mark.unit

MINE = "11111111-1111-1111-1111-111111111111"  # this management cluster's identity
OTHER = "22222222-2222-2222-2222-222222222222"


def host(name: str, **fields) -> HostLoad:
    return HostLoad(**{"name": name, "healthy": True, "cpus": 8, "memory_mib": 16384, **fields})


def owner(management_cluster: str | None) -> Owner:
    return Owner(namespace="ns", name="m", uid="u-1", cluster="c", management_cluster=management_cluster)


def test_foreign_vms_take_their_share_off_the_overcommitted_capacity():
    a = host("a", foreign_vms=3, foreign_cpus=6, foreign_memory_mib=14336, memory_overcommit=1.0)
    assert a.memory_room_mib == 16384 - 14336 and a.cpu_room == 8 * 4 - 6
    b = host("b", foreign_memory_mib=14336, memory_overcommit=2.0, allocated_memory_mib=1024)
    assert b.memory_room_mib == 16384 * 2 - 14336 - 1024  # subtracted after overcommit, beside the own machines


def test_a_machine_goes_to_the_host_without_foreign_load():
    hosts = [host("a", foreign_vms=1, foreign_cpus=1, foreign_memory_mib=15360), host("b", memory_mib=8192)]
    assert choose_host(Request(cpus=1, memory_mib=2048), hosts) == Placed("b", None)


def test_no_host_names_per_host_the_room_left_after_the_foreign_vms():
    hosts = [host("a", foreign_vms=3, foreign_cpus=3, foreign_memory_mib=14336),
             host("b", allocated_memory_mib=15360)]
    result = choose_host(Request(cpus=1, memory_mib=3072), hosts)
    assert isinstance(result, NoHost) and result.reason == reasons.INSUFFICIENT_CAPACITY
    assert "a: 29 vCPU and 2048 MiB free after 3 foreign VMs (14336 MiB, 3 vCPUs)" in result.message
    assert "b: 32 vCPU and 1024 MiB free (overcommit cpu 4, memory 1)" in result.message
    print(f"\n[placement] {result.message}")


def test_a_machine_larger_than_the_hosts_free_memory_is_never_placed_whatever_the_overcommit():
    roomy_but_busy = host("a", memory_overcommit=4.0, available_memory_mib=3000)
    assert roomy_but_busy.memory_room_mib == 65536
    assert choose_host(Request(cpus=1, memory_mib=2048), [roomy_but_busy]) == Placed("a", None)  # fits what is free
    result = choose_host(Request(cpus=1, memory_mib=4096), [roomy_but_busy])
    assert isinstance(result, NoHost) and result.reason == reasons.INSUFFICIENT_CAPACITY
    assert "a: 32 vCPU and 65536 MiB free" in result.message
    assert "but the host has only 3000 MiB of memory free" in result.message
    pinned = choose_host(Request(cpus=1, memory_mib=4096, pinned_host="a"), [roomy_but_busy])
    assert isinstance(pinned, NoHost) and "the host has only 3000 MiB of memory free" in pinned.message


def test_the_free_memory_floor_is_per_machine_not_a_sum_and_unknown_means_no_check():
    # Machines placed since the probe are the accounting's business (lazy allocation: free memory does not show them).
    a = host("a", available_memory_mib=4096, allocated_memory_mib=8192)
    assert placement.fits(a, Request(cpus=1, memory_mib=4096))
    assert placement.fits(host("b", available_memory_mib=None), Request(cpus=1, memory_mib=16384))


def test_between_hosts_that_fit_the_one_with_more_room_after_foreign_vms_wins():
    hosts = [host("a", foreign_vms=1, foreign_memory_mib=8192), host("b", foreign_vms=1, foreign_memory_mib=4096)]
    assert choose_host(Request(cpus=1, memory_mib=1024), hosts) == Placed("b", None)


@pytest.mark.parametrize(("domain_owner", "mine", "foreign"), [
    (None, MINE, True),  # no owner metadata of ours: someone else's VM
    (owner(OTHER), MINE, True),  # another management cluster's machine sharing the host
    (owner(MINE), MINE, False),
    (owner(None), MINE, False),  # an older release, or released by a move: a LibvirtMachine counts it already
    (owner(None), None, False),  # the operator could not read its identity: its own domains name none
    (owner(OTHER), None, True),
])
def test_which_domains_are_foreign(domain_owner, mine, foreign):
    assert placement.is_foreign(domain_owner, mine) is foreign


def test_host_usage_counts_running_foreign_vms_and_reports_shut_off_ones():
    usage = placement.host_usage([
        DomainUsage(owner(MINE), True, 512, 1),
        DomainUsage(owner(MINE), False, 1024, 2, running=False),  # this provider's count in every state, as before
        DomainUsage(None, True, 14336, 4),
        DomainUsage(owner(OTHER), True, 2048, 2),  # paused or suspended domains are active too
        DomainUsage(None, False, 65536, 16),  # defined, shut off: takes nothing now
    ], MINE)
    assert usage == placement.HostUsage(machines=2, allocated_cpus=3, allocated_memory_mib=1536, foreign_vms=2,
                                        foreign_cpus=6, foreign_memory_mib=16384, foreign_shut_off=1,
                                        machine_domains=frozenset({("ns", "m", "u-1", True), ("ns", "m", "u-1", False)}))


def probe(**changes) -> host_probe.HostProbe:
    fields = dict(libvirt_version="10.0.0", hypervisor_version="8.2.0", cpus=8, memory_mib=16384, free_memory_mib=900,
                  machines=1, allocated_cpus=1, allocated_memory_mib=512, pool_capacity_bytes=None,
                  pool_available_bytes=None, available_memory_mib=9000, foreign_vms=3, foreign_cpus=3,
                  foreign_memory_mib=14336, foreign_shut_off=1)
    return host_probe.HostProbe(**{**fields, **changes})


SPEC = v1alpha1_host.LibvirtHostSpec.model_construct(uri="qemu:///system", access=tenancy.UNRESTRICTED,
                                                storage_pool="default", overcommit=v1alpha1_host.Overcommit(),
                                                failure_domain=None, control_plane=True, unschedulable=False,
                                                decommissioned=False)


def test_the_host_status_reports_what_placement_used():
    known = inventory.InventoryHost("a", SPEC, probe(), reachable=True)
    status = inventory.host_status(known, "2026-12-01T00:00:00Z")
    assert {key: status[key] for key in ("freeMemoryMiB", "availableMemoryMiB", "foreignVMs", "foreignCPUs",
                                         "foreignMemoryMiB", "foreignVMsShutOff")} == \
        {"freeMemoryMiB": 900, "availableMemoryMiB": 9000, "foreignVMs": 3, "foreignCPUs": 3,
         "foreignMemoryMiB": 14336, "foreignVMsShutOff": 1}
    v1alpha1_host.LibvirtHostStatus.model_validate(status)  # every field is one the CRD knows
    gone = inventory.host_status(dataclasses.replace(known, reachable=False), "2026-12-01T00:00:00Z")
    assert gone["foreignVMs"] is None and gone["availableMemoryMiB"] is None  # cleared, not left stale


def test_the_inventory_hands_placement_the_foreign_load_and_free_memory():
    class Registry:
        def names(self):
            return []
    stock = inventory.Inventory(Registry())  # type: ignore[arg-type]
    stock.hosts["a"] = inventory.InventoryHost("a", SPEC, probe(), reachable=True)
    [load] = stock.loads({"a": placement.HostClaims(cpus=2, memory_mib=1024)})
    assert (load.foreign_vms, load.foreign_cpus, load.foreign_memory_mib, load.available_memory_mib,
            load.allocated_memory_mib) == (3, 3, 14336, 9000, 1024)


@pytest.mark.parametrize(("before", "after", "gained"), [
    ((4, 14336), (0, 0), True), ((4, 14336), (4, 10240), True), ((4, 14336), (3, 14336), True),
    ((4, 14336), (4, 14336), False), ((0, 0), (1, 1024), False),
])
def test_waiting_machines_are_woken_when_foreign_vms_take_less(before, after, gained):
    assert hosts_reconcile._gained_room(before, after) is gained


def test_wake_unplaced_queues_only_machines_without_a_host():
    import types

    from capi_libvirt.operator import handlers

    bodies = [{"metadata": {"name": "waiting", "namespace": "ns"}, "spec": {}},
              {"metadata": {"name": "placed", "namespace": "ns"}, "spec": {}, "status": {"host": "kvm1"}},
              {"metadata": {"name": "deleting", "namespace": "ns", "deletionTimestamp": "2026-12-01T00:00:00Z"},
               "spec": {}}]
    queued: list = []
    runtime = types.SimpleNamespace(
        deps=types.SimpleNamespace(kube=types.SimpleNamespace(cache=types.SimpleNamespace(items=lambda kind: bodies)),
                                   failures={("ns", "waiting"): 5}),
        machines=types.SimpleNamespace(add=queued.append))
    handlers.Runtime.wake_unplaced(runtime)  # type: ignore[arg-type]
    assert queued == [("ns", "waiting")] and runtime.deps.failures == {}


def test_the_probe_reads_a_domains_xml_once_while_it_stays_the_same(monkeypatch):
    parsed: list[str] = []
    real = host_probe.domain_owner.parse_owner
    monkeypatch.setattr(host_probe.domain_owner, "parse_owner", lambda text: parsed.append(text) or real(text))
    readings = host_probe.DomainXMLReadings()
    first, second = ("<domain><name>a</name></domain>", "<domain><name>b</name></domain>")
    assert readings.read(first) == (None, frozenset()) and readings.read(second) == (None, frozenset())
    readings.probe_done()
    readings.read(first)  # the next probe: the same definition
    readings.probe_done()
    assert parsed == [first, second], "read again only when new"
    readings.read(second)  # gone from the last probe, so forgotten: read again
    assert parsed == [first, second, second]
