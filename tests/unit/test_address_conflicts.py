"""Addresses and MACs that belong to someone else (core.address_conflicts): the network's own address, one outside
its subnet, the subnet's network and broadcast addresses, a lease of another MAC, another machine's published or
earlier-asked address, another VM's or an earlier machine's MAC; what may pass and what never can."""

from __future__ import annotations

import pytest

from capi_libvirt.core.address_conflicts import Holder, Nic, SegmentFacts, first_conflict, holder

pytestmark = pytest.mark.unit

NET = ("network", "default")
BR = ("bridge", "br0")
FACTS = {NET: SegmentFacts(own=("192.168.122.1/24",), macs=frozenset({"52:54:00:00:00:99"}),
                           leases={"192.168.122.50": "52:54:00:00:00:50"}),
         BR: SegmentFacts()}


def nic(*addresses: str, segment=NET, mac="52:54:00:00:00:01") -> Nic:
    return Nic(0, segment, mac, addresses)


@pytest.mark.parametrize(("address", "words", "may_pass"), [
    ("192.168.122.1/24", "is the network's own (its gateway, DHCP and DNS server)", False),
    ("10.0.0.5/24", "is outside the network's subnet (192.168.122.0/24)", False),
    ("192.168.122.0/24", "the subnet's network or broadcast address", False),
    ("192.168.122.255/24", "the subnet's network or broadcast address", False),
    ("192.168.122.50/24", "leased by the network's DHCP server to another MAC", True),
])
def test_the_networks_own_addresses_and_leases_are_refused(address, words, may_pass):
    conflict = first_conflict([nic(address)], FACTS, [])
    assert conflict is not None and words in conflict.message and conflict.may_pass is may_pass, conflict
    assert "interfaces[0] (network default)" in conflict.message


def test_an_address_of_the_subnet_that_nobody_holds_passes_and_a_lease_of_its_own_mac_too():
    assert first_conflict([nic("192.168.122.10/24")], FACTS, []) is None
    assert first_conflict([nic("192.168.122.50/24", mac="52:54:00:00:00:50")], FACTS, []) is None


def test_on_a_bridge_the_host_knows_no_subnet():
    assert first_conflict([nic("10.0.0.5/24", segment=BR)], FACTS, []) is None


def test_another_vms_mac_on_the_network_is_refused():
    conflict = first_conflict([nic(mac="52:54:00:00:00:99")], FACTS, [])
    assert conflict is not None and "MAC 52:54:00:00:00:99 is already used there by another VM" in conflict.message


def test_another_machines_address_is_refused_when_published_or_asked_first():
    other_spec = {"interfaces": [{"network": "default", "static": {"addresses": ["192.168.122.20/24"]},
                                  "macAddress": "52:54:00:AA:00:01"}]}
    published = holder({"interfaces": [{"network": "default"}]},
                       {"addresses": [{"type": "InternalIP", "address": "192.168.122.30"},
                                      {"type": "Hostname", "address": "192.168.122.31"}]}, earlier=False)
    asked_first, asked_later = holder(other_spec, {}, earlier=True), holder(other_spec, {}, earlier=False)
    assert "already another machine's" in first_conflict([nic("192.168.122.30/24")], FACTS, [published]).message
    assert first_conflict([nic("192.168.122.31/24")], FACTS, [published]) is None  # a hostname is no address
    assert "already another machine's" in first_conflict([nic("192.168.122.20/24")], FACTS, [asked_first]).message
    assert first_conflict([nic("192.168.122.20/24")], FACTS, [asked_later]) is None  # the later one yields
    taken = first_conflict([nic(mac="52:54:00:aa:00:01")], FACTS, [asked_first])
    assert taken is not None and taken.may_pass and "MAC 52:54:00:aa:00:01 is already another machine's" in \
        taken.message


def test_a_holder_on_another_segment_holds_nothing_here():
    elsewhere = Holder(earlier=True, segments=frozenset({BR}), asked=frozenset({(BR, "192.168.122.20")}),
                       published=frozenset({"192.168.122.20"}))
    assert first_conflict([nic("192.168.122.20/24")], FACTS, [elsewhere]) is None


def test_a_virtual_address_meets_the_networks_rules_and_is_never_another_machines_own():
    vip = Nic(0, NET, "52:54:00:00:00:01", allowed=("192.168.122.250",))
    assert first_conflict([vip], FACTS, []) is None
    outside = first_conflict([Nic(0, NET, "52:54:00:00:00:01", allowed=("10.0.0.250",))], FACTS, [])
    assert outside is not None and "allowedAddresses: address 10.0.0.250 is outside" in outside.message
    sibling = holder({"interfaces": [{"network": "default", "allowedAddresses": ["192.168.122.250"]}]}, {}, False)
    assert first_conflict([vip], FACTS, [sibling]) is None  # control-plane machines share their virtual IP
    taken = first_conflict([nic("192.168.122.250/24")], FACTS, [sibling])
    assert taken is not None and "a virtual address other machines may hold there" in taken.message


def test_a_virtual_address_may_not_be_another_machines_own_or_leased_to_another_mac():
    published = holder({"interfaces": [{"network": "default"}]},
                       {"addresses": [{"type": "InternalIP", "address": "192.168.122.30"}]}, earlier=False)
    taken = first_conflict([Nic(0, NET, "52:54:00:00:00:01", allowed=("192.168.122.30",))], FACTS, [published])
    assert taken is not None and "allowedAddresses: address 192.168.122.30 is already another machine's" in \
        taken.message
    leased = first_conflict([Nic(0, NET, "52:54:00:00:00:01", allowed=("192.168.122.50",))], FACTS, [])
    assert leased is not None and "leased by the network's DHCP server to another MAC" in leased.message
