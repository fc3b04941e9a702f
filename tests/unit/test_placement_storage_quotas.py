"""Storage counted like memory, and quotas per namespace: a machine's disks at full size against its pool's capacity x
the pool's overcommit, what the machines placed there claim and what else the pool holds; a namespace over its quota
on a host is refused there (QuotaExceeded, naming the quota and the usage) and placed elsewhere when it can be."""

from __future__ import annotations

import dataclasses

import pytest

from capi_libvirt.api import reasons, v1alpha1, v1alpha1_host
from capi_libvirt.core import placement, tenancy
from capi_libvirt.core.placement import GIB, HostLoad, NoHost, Placed, PoolRoom, Request, choose_host
from capi_libvirt.reconcile import inventory

pytestmark = pytest.mark.unit


def host(name: str, **fields) -> HostLoad:
    return HostLoad(**{"name": name, "healthy": True, "cpus": 8, "memory_mib": 16384, **fields})


def request(disk_gib: int, **fields) -> Request:
    return Request(**{"cpus": 1, "memory_mib": 512, "pool": "default", "disk_bytes": disk_gib * GIB, **fields})


def test_a_64_tib_disk_does_not_fit_a_251_gib_pool():
    small = host("a", pools={"default": PoolRoom(251 * GIB, other_bytes=20 * GIB)})
    result = choose_host(request(65536), [small])
    assert isinstance(result, NoHost) and result.reason == reasons.INSUFFICIENT_CAPACITY
    assert "65536.0 GiB of disk in pool default" in result.message
    assert "pool default: 231.0 GiB left of 251.0 GiB x 1" in result.message, result.message


def test_claimed_disks_count_at_full_size_and_other_volumes_count_as_they_are():
    pool = PoolRoom(100 * GIB, claimed_bytes=60 * GIB, other_bytes=30 * GIB)
    assert choose_host(request(10), [host("a", pools={"default": pool})]) == Placed("a", None)
    assert isinstance(choose_host(request(11), [host("a", pools={"default": pool})]), NoHost)


def test_the_pools_overcommit_lets_thin_disks_promise_more():
    pool = PoolRoom(100 * GIB, claimed_bytes=150 * GIB, overcommit=2.0)
    assert choose_host(request(50), [host("a", pools={"default": pool})]) == Placed("a", None)
    assert isinstance(choose_host(request(51), [host("a", pools={"default": pool})]), NoHost)


def test_a_host_without_the_pool_active_is_no_candidate():
    hosts = [host("a", pools={"other": PoolRoom(1000 * GIB)}), host("b", pools={"default": PoolRoom(100 * GIB)})]
    assert choose_host(request(10), hosts) == Placed("b", None)
    assert choose_host(request(10), hosts[:1]) == NoHost(reasons.POOL_NOT_FOUND,
                                                         "no host has an active storage pool default: a")
    pinned = choose_host(request(10, pinned_host="a"), hosts)
    assert pinned == NoHost(reasons.POOL_NOT_FOUND, "pinned host a has no active storage pool default")
    small = [host("a", pools={"other": PoolRoom(1000 * GIB)}), host("b", pools={"default": PoolRoom(1 * GIB)})]
    result = choose_host(request(10), small)  # one host has the pool, without room: capacity, naming both
    assert isinstance(result, NoHost) and result.reason == reasons.INSUFFICIENT_CAPACITY
    assert "a: " in result.message and "it has no active storage pool default" in result.message


def test_storage_steers_a_pinned_machine_to_a_clear_refusal():
    result = choose_host(request(10, pinned_host="a"), [host("a", pools={"default": PoolRoom(5 * GIB)})])
    assert isinstance(result, NoHost) and result.reason == reasons.INSUFFICIENT_CAPACITY
    assert "pool default: 5.0 GiB left" in result.message


def test_claims_tally_root_and_data_disks_per_pool_and_namespace():
    claims = placement.claims_by_host([
        ("a", "team-1", {"cpus": 2, "memoryMiB": 1024, "diskGiB": 20, "storagePool": "default",
                         "dataDisks": [{"sizeGiB": 64}, {"sizeGiB": 16}]}),
        ("a", "team-2", {"cpus": 1, "memoryMiB": 512, "diskGiB": 10, "storagePool": "fast"}),
        ("a", "team-1", {"cpus": 1, "memoryMiB": 512, "diskGiB": 10, "storagePool": "default"}),
        ("b", "team-1", {"cpus": 4, "memoryMiB": 4096, "diskGiB": 30, "storagePool": "default"}),
    ])
    a = claims["a"]
    assert (a.cpus, a.memory_mib, a.pool_bytes) == (4, 2048, {"default": 110 * GIB, "fast": 10 * GIB})
    assert a.by_namespace == {"team-1": tenancy.Holding(2, 3, 1536, 110), "team-2": tenancy.Holding(1, 1, 512, 10)}
    assert claims["b"].by_namespace == {"team-1": tenancy.Holding(1, 4, 4096, 30)}


def access(*quotas: dict) -> v1alpha1_host.HostAccess:
    return v1alpha1_host.HostAccess.model_validate({"quotas": list(quotas)})


@pytest.mark.parametrize(("quota", "held", "field", "named"), [
    ({"machines": 2}, tenancy.Holding(2, 2, 1024, 40), "machines", "2 machines"),
    ({"cpus": 4}, tenancy.Holding(1, 3, 512, 20), "cpus", "4 vCPUs"),
    ({"memoryMiB": 2048}, tenancy.Holding(1, 1, 2000, 20), "memoryMiB", "2048 MiB of memory"),
    ({"diskGiB": 50}, tenancy.Holding(1, 1, 512, 40), "diskGiB", "50 GiB of disk"),
])
def test_each_quota_names_the_limit_and_the_usage(quota, held, field, named):
    rules = access({"namespaces": ["team-*"], **quota})
    wanted = tenancy.Holding(1, 2, 512, 20)
    message = tenancy.quota_excess("h1", rules, "team-1", held, wanted)
    assert message is not None and f"may hold {named} on host h1" in message, message
    assert f"spec.access.quotas[0].{field}" in message and "it holds" in message
    assert tenancy.quota_excess("h1", rules, "other", held, wanted) is None  # not listed: no quota


def test_the_first_quota_listing_a_namespace_applies_to_each_namespace_on_its_own():
    rules = access({"namespaces": ["vip"], "machines": 10}, {"namespaces": ["*"], "machines": 1})
    one = tenancy.Holding(1, 1, 512, 10)
    assert tenancy.quota_excess("h", rules, "vip", tenancy.Holding(5, 5, 2560, 50), one) is None
    assert tenancy.quota_excess("h", rules, "team-1", tenancy.Holding(), one) is None
    assert tenancy.quota_excess("h", rules, "team-1", one, one) is not None


def test_a_host_over_quota_is_skipped_and_quota_exceeded_when_none_is_left():
    over = "namespace t may hold 1 machines on host a"
    hosts = [host("a", over_quota=over), host("b", memory_mib=4096)]
    assert choose_host(request(1, pool=None), hosts) == Placed("b", None)
    result = choose_host(request(1, pool=None), hosts[:1])
    assert result == NoHost(reasons.QUOTA_EXCEEDED, over)
    pinned = choose_host(dataclasses.replace(request(1, pool=None), pinned_host="a"), hosts)
    assert pinned == NoHost(reasons.QUOTA_EXCEEDED, over)


def test_a_machine_holding_counts_its_data_disks():
    spec = v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}, "cpus": 3, "memoryMiB": 1024,
                                                       "diskGiB": 20, "dataDisks": [{"sizeGiB": 5}]})
    assert inventory.machine_holding(spec) == tenancy.Holding(1, 3, 1024, 25)


def test_a_pool_usage_counts_what_is_not_the_machines_as_other():
    usage = placement.PoolUsage("default", capacity_bytes=100, allocation_bytes=70, available_bytes=30,
                                machine_disks_bytes=200, machine_allocation_bytes=50)
    assert usage.other_bytes == 20


def test_blocks_a_file_system_reserves_are_no_room():
    """A folder pool on ext4 with blocks reserved for root: capacity 252 GiB, 31 GiB used, 61 GiB free for others."""
    usage = placement.PoolUsage("default", capacity_bytes=252 * GIB, allocation_bytes=31 * GIB,
                                available_bytes=61 * GIB)
    assert usage.usable_bytes == 92 * GIB and usage.other_bytes == 31 * GIB


def test_the_inventory_hands_placement_each_pools_room_and_the_namespaces_quota():
    """Inventory.loads: the probe's pools with the claims from the API and the host's ratio; the quota of the
    machine's namespace with what it holds there. The host status shows the same pools."""
    from test_placement_rules_foreign_vms import SPEC, probe

    class Registry:
        def names(self):
            return []
    pools = (placement.PoolUsage("default", 100 * GIB, 30 * GIB, 70 * GIB, machine_disks_bytes=40 * GIB,
                                 machine_allocation_bytes=10 * GIB),)
    access = v1alpha1_host.HostAccess.model_validate({"namespaces": ["*"], "storagePools": ["*"], "images": ["*"],
                                                 "quotas": [{"namespaces": ["t-*"], "machines": 1}]})
    spec = SPEC.model_copy(update={"access": access,
                                   "overcommit": v1alpha1_host.Overcommit.model_validate({"storagePools": {"default": 2}})})
    stock = inventory.Inventory(Registry())  # type: ignore[arg-type]
    stock.hosts["a"] = inventory.InventoryHost("a", spec, probe(pools=pools), reachable=True)
    claims = placement.claims_by_host([("a", "t-1", {"cpus": 1, "memoryMiB": 512, "diskGiB": 50,
                                                    "storagePool": "default"})])
    machine = v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}})
    [load] = stock.loads(claims, "t-1", machine)
    assert load.pools == {"default": PoolRoom(100 * GIB, 50 * GIB, 20 * GIB, 2.0)}
    assert load.pools["default"].room_bytes == 130 * GIB
    assert load.over_quota is not None and "namespace t-1 may hold 1 machines on host a" in load.over_quota
    [other] = stock.loads(claims, "t-2", machine)
    assert other.over_quota is None  # each namespace on its own
    assert stock.pool_room("a", "default", claims["a"]) == 130 * GIB and stock.pool_room("a", "x", None) is None
    [shown] = inventory.host_status(stock.hosts["a"], "2026-12-01T00:00:00Z")["pools"]
    assert shown["roomBytes"] == (200 - 40 - 20) * GIB and shown["otherBytes"] == 20 * GIB, shown
    v1alpha1_host.PoolUsage.model_validate(shown)


def test_a_networks_own_addresses_are_read_from_its_xml():
    from capi_libvirt.hypervisor import networks
    xml = ("<network><name>n</name><ip address='192.168.122.1' netmask='255.255.255.0'/>"
           "<ip family='ipv6' address='fd00::1' prefix='64'/></network>")
    assert networks.network_addresses(xml) == ("192.168.122.1/24", "fd00::1/64")
    assert networks.network_addresses("<network><name>isolated</name></network>") == ()
