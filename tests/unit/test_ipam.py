"""Cluster API IPAM, the pure part (core.ipam): claim names and bodies, waiting messages, IPAddress -> addressing; the
API field's validation; the stand-in's reading of a pool's addresses; the RBAC the claims need."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

from capi_libvirt.api import crd, kinds, meta, v1alpha1
from capi_libvirt.core import capi_objects, ipam
from devenv import ipam_stand_in

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
POOL = {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "pool-a"}
V6_POOL = {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "pool-b"}
SUBDOMAIN = re.compile(meta.DNS_SUBDOMAIN)


def nic(**fields) -> v1alpha1.NetworkInterface:
    return v1alpha1.NetworkInterface.model_validate({"network": "default", **fields})


def test_claims_are_named_from_the_machine_interface_and_pool_in_order():
    interfaces = [nic(), nic(addressesFromPools=[POOL, V6_POOL]), nic(addressesFromPools=[POOL])]
    refs = list(ipam.claims("worker-1", interfaces))
    assert [(r.interface, r.pool, r.name, r.pool_ref.name) for r in refs] == [
        (1, 0, "worker-1-nic1-pool0", "pool-a"), (1, 1, "worker-1-nic1-pool1", "pool-b"),
        (2, 0, "worker-1-nic2-pool0", "pool-a")]


def test_a_long_machine_name_gives_a_bounded_distinct_dns_subdomain():
    first, second = "a" * 250 + "x", "a" * 250 + "y"
    names = {ipam.claim_name(first, 0, 0), ipam.claim_name(second, 0, 0)}
    assert len(names) == 2
    for name in names:
        assert len(name) <= 253 and SUBDOMAIN.match(name) and name.endswith("-nic0-pool0")
    dotted = "w." * 125 + "z"  # cut at a dot: never ends in one before the hash
    assert SUBDOMAIN.match(ipam.claim_name(dotted, 7, 1))


def test_claim_body_is_owned_by_the_machine_labelled_and_asks_the_pool():
    machine = {"metadata": {"name": "worker-1", "namespace": "team-a", "uid": "uid-1"}}
    [ref] = ipam.claims("worker-1", [nic(addressesFromPools=[POOL])])
    body = ipam.claim_body(machine, ref, "demo")
    assert body["apiVersion"] == "ipam.cluster.x-k8s.io/v1beta2" and body["kind"] == "IPAddressClaim"
    assert body["metadata"]["namespace"] == "team-a" and body["metadata"]["name"] == "worker-1-nic0-pool0"
    assert body["metadata"]["labels"] == {"cluster.x-k8s.io/cluster-name": "demo"}
    assert body["metadata"]["ownerReferences"] == [{
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtMachine", "name": "worker-1",
        "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    assert body["spec"] == {"clusterName": "demo", "poolRef": POOL}


def test_waiting_message_names_claim_and_pool_and_carries_a_not_ready_reason():
    [ref] = ipam.claims("w", [nic(addressesFromPools=[POOL])])
    assert ipam.waiting_message(ref, None) == \
        "waiting for IPAddressClaim w-nic0-pool0 (interface 0) to get an address from InClusterIPPool pool-a"
    exhausted = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "PoolExhausted",
                                            "message": "pool-a has no free address"}]}}
    assert ipam.waiting_message(ref, exhausted).endswith("pool-a: PoolExhausted: pool-a has no free address")
    assert ipam.address_name(exhausted) is None
    assert ipam.address_name({"status": {"addressRef": {"name": "w-nic0-pool0"}}}) == "w-nic0-pool0"


def test_ip_addresses_become_cidrs_and_the_first_gateway():
    v4 = {"spec": {"address": "192.168.181.10", "prefix": 24, "gateway": "192.168.181.1"}}
    v6 = {"spec": {"address": "2001:db8::a", "prefix": 64, "gateway": "2001:db8::1"}}
    addressing = ipam.addressing([v4, v6])
    assert addressing.addresses == ["192.168.181.10/24", "2001:db8::a/64"]
    assert addressing.gateway == "192.168.181.1"
    assert ipam.addressing([{"spec": {"address": "10.0.0.5", "prefix": 8}}]).gateway is None


@pytest.mark.parametrize("spec", [{"address": "10.0.0.5"}, {"address": "10.0.0.5", "prefix": 33},
                                  {"address": "not-an-ip", "prefix": 24},
                                  {"address": "10.0.0.5", "prefix": 24, "gateway": "nope"}])
def test_a_malformed_ip_address_is_a_value_error(spec):
    with pytest.raises(ValueError):
        ipam.addressing([{"spec": spec}])


def test_static_and_pools_are_exclusive_in_the_model_and_the_schema():
    with pytest.raises(ValueError, match="at most one of static or addressesFromPools"):
        nic(static={"addresses": ["10.0.0.5/24"]}, addressesFromPools=[POOL])
    with pytest.raises(ValueError):
        nic(addressesFromPools=[POOL, V6_POOL, POOL])  # at most two
    with pytest.raises(ValueError):
        nic(addressesFromPools=[{"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "Bad_Name"}])
    with pytest.raises(ValueError):
        nic(addressesFromPools=[{"kind": "InClusterIPPool", "name": "pool-a"}])  # apiGroup required
    spec = crd.custom_resource_definition(kinds.LIBVIRT_MACHINE)["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]["properties"]["spec"]
    item = spec["properties"]["interfaces"]["items"]
    assert {"rule": "!has(self.static) || !has(self.addressesFromPools)",
            "message": "set at most one of static or addressesFromPools"} in item["x-kubernetes-validations"]
    pools = item["properties"]["addressesFromPools"]
    assert pools["maxItems"] == 2 and pools["items"]["required"] == ["apiGroup", "kind", "name"]


def test_the_role_allows_claims_and_addresses_and_nothing_more_of_ipam():
    role = yaml.safe_load((REPO / "config" / "rbac" / "role.yaml").read_text())
    rules = [r for r in role["rules"] if "ipam.cluster.x-k8s.io" in r["apiGroups"]]
    assert rules == [
        {"apiGroups": ["ipam.cluster.x-k8s.io"], "resources": ["ipaddressclaims"],
         "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": ["ipam.cluster.x-k8s.io"], "resources": ["ipaddresses"], "verbs": ["get"]}]


def test_the_stand_in_reads_single_ips_ranges_and_cidrs_without_the_gateway():
    spec = {"addresses": ["10.0.0.1", "10.0.0.5-10.0.0.7", "10.0.1.0/30"], "prefix": 16, "gateway": "10.0.0.6"}
    assert [str(a) for a in ipam_stand_in.pool_addresses(spec)] == \
        ["10.0.0.1", "10.0.0.5", "10.0.0.7", "10.0.1.1", "10.0.1.2"]


# -- the resolve_addressing phase, the API faked -------------------------------------------------------------------

class FakeIPAM:
    """The four IPAM calls of kube.api over two dicts; `answer` plays the IPAM provider."""

    def __init__(self) -> None:
        self.claims: dict[str, dict] = {}
        self.addresses: dict[str, dict] = {}
        self.deleted: list[str] = []

    async def get_ip_address_claim(self, namespace, name):
        return self.claims.get(name)

    async def create_ip_address_claim(self, body):
        self.claims[body["metadata"]["name"]] = body
        return body

    async def get_ip_address(self, namespace, name):
        return self.addresses.get(name)

    async def delete_ip_address_claim(self, namespace, name):
        self.deleted.append(name)
        return self.claims.pop(name, None) is not None

    def answer(self, claim: str, address: str, prefix: int, gateway: str | None = None) -> None:
        spec = {"address": address, "prefix": prefix, "claimRef": {"name": claim}}
        if gateway:
            spec["gateway"] = gateway
        self.addresses[claim] = {"spec": spec}
        self.claims[claim]["status"] = {"addressRef": {"name": claim}}


def ipam_pass(interfaces):
    from capi_libvirt.reconcile import machine as machine_reconcile
    body = {"metadata": {"name": "w", "namespace": "ns", "uid": "uid-1", "labels": {meta.CLUSTER_NAME_LABEL: "c1"}},
            "spec": {"image": {"volume": "base.qcow2"}, "interfaces": interfaces}}
    events: list[str] = []
    kube = FakeIPAM()
    deps = machine_reconcile.Dependencies(kube=kube, inventory=None, post_event=lambda b, t, r, m: events.append(r))
    p = machine_reconcile.MachinePass(body=body, spec=v1alpha1.LibvirtMachineSpec.model_validate(body["spec"]),
                                      status={}, cluster=capi_objects.ClusterView(name="c1"))
    return machine_reconcile, deps, p, kube, events


async def test_resolve_addressing_claims_waits_then_fills_the_interfaces_addressing():
    machine_reconcile, deps, p, kube, events = ipam_pass([
        {"network": "a", "static": {"addresses": ["10.0.0.5/24"]}},
        {"network": "b", "addressesFromPools": [POOL, V6_POOL]}])
    with pytest.raises(machine_reconcile.Wait) as waited:
        await machine_reconcile.resolve_addressing(deps, p)
    assert waited.value.reason == "WaitingForIPAddress" and "w-nic1-pool0" in waited.value.message
    assert sorted(kube.claims) == ["w-nic1-pool0", "w-nic1-pool1"]  # both made in one pass
    assert events == ["IPAddressClaimCreated"] * 2
    kube.answer("w-nic1-pool0", "192.168.181.7", 24, "192.168.181.1")
    with pytest.raises(machine_reconcile.Wait) as waited:  # the second pool has not answered yet
        await machine_reconcile.resolve_addressing(deps, p)
    assert "w-nic1-pool1" in waited.value.message and "pool-b" in waited.value.message
    kube.answer("w-nic1-pool1", "2001:db8::7", 64)
    await machine_reconcile.resolve_addressing(deps, p)
    assert p.addressing[0].addresses == ["10.0.0.5/24"]
    assert p.addressing[1].addresses == ["192.168.181.7/24", "2001:db8::7/64"]
    assert p.addressing[1].gateway == "192.168.181.1"
    assert events == ["IPAddressClaimCreated"] * 2  # nothing made again


async def test_a_claim_another_object_owns_is_never_taken_and_a_foreign_address_is_refused():
    machine_reconcile, deps, p, kube, events = ipam_pass([{"network": "b", "addressesFromPools": [POOL]}])
    kube.claims["w-nic0-pool0"] = {"metadata": {"name": "w-nic0-pool0", "ownerReferences": [{"uid": "old"}]},
                                   "status": {"addressRef": {"name": "w-nic0-pool0"}}}
    kube.addresses["w-nic0-pool0"] = {"spec": {"address": "10.0.0.9", "prefix": 24, "claimRef": {"name": "x"}}}
    with pytest.raises(machine_reconcile.Wait) as waited:
        await machine_reconcile.resolve_addressing(deps, p)
    assert waited.value.reason == "WaitingForIPAddress" and "not this machine's" in waited.value.message
    kube.claims["w-nic0-pool0"]["metadata"]["ownerReferences"] = [{"uid": "uid-1"}]
    with pytest.raises(machine_reconcile.Wait) as waited:
        await machine_reconcile.resolve_addressing(deps, p)
    assert waited.value.reason == "InvalidIPAddress" and waited.value.failure


async def test_releasing_deletes_every_claim_and_never_waits_for_them():
    machine_reconcile, deps, p, kube, events = ipam_pass([{"network": "b", "addressesFromPools": [POOL, V6_POOL]}])
    with pytest.raises(machine_reconcile.Wait):
        await machine_reconcile.resolve_addressing(deps, p)
    await machine_reconcile._release_ip_address_claims(deps, p.body)
    assert kube.deleted == ["w-nic0-pool0", "w-nic0-pool1"] and kube.claims == {}
    await machine_reconcile._release_ip_address_claims(deps, p.body)  # gone already: nothing to do, no error
    assert events.count("IPAddressReleased") == 2
