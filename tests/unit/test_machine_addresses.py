"""A machine's addresses: the merge of addresses known up front with what discovery finds (core.machine_addresses), which
source domain_addresses takes its answer from, and observe_addresses publishing them in a pass."""

from __future__ import annotations

import types

import libvirt
import pytest

from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core import conditions, machine_addresses
from capi_libvirt.hypervisor import machines
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv.memory_host import MemoryHost
from devenv.memory_state import Domain

pytestmark = pytest.mark.unit


def static(*cidrs: str) -> v1alpha1.StaticAddressing:
    return v1alpha1.StaticAddressing(addresses=list(cidrs))


# -- the merge ----------------------------------------------------------------------------------------------------

def test_known_addresses_are_the_interfaces_addresses_in_interface_order_without_prefix() -> None:
    addressing = {2: static("198.51.100.7/24"), 0: static("192.0.2.10/24", "2001:DB8::10/64", "192.0.2.10/25")}
    assert machine_addresses.known_addresses(addressing) == ["192.0.2.10", "2001:db8::10", "198.51.100.7"]
    assert machine_addresses.known_addresses({}) == []


@pytest.mark.parametrize("known, discovered, previous, expected, kept", [
    # Known up front, nothing discovered yet (the guest is still booting): published at once.
    (["192.0.2.10"], [], [], ["192.0.2.10"], []),
    # Discovery finds the same address: listed once.
    (["192.0.2.10"], ["192.0.2.10"], ["192.0.2.10"], ["192.0.2.10"], []),
    # Discovery finds more (a second interface on DHCP): the known first, then the discovered ones.
    (["192.0.2.10"], ["198.51.100.20", "192.0.2.10"], ["192.0.2.10"], ["192.0.2.10", "198.51.100.20"], []),
    # Discovery flaps: the last discovered address is kept beside the known one.
    (["192.0.2.10"], [], ["192.0.2.10", "198.51.100.20"], ["192.0.2.10", "198.51.100.20"], ["198.51.100.20"]),
    # Nothing known up front (DHCP): what discovery finds, else the last found, else nothing.
    ([], ["198.51.100.20"], [], ["198.51.100.20"], []),
    ([], [], ["198.51.100.20"], ["198.51.100.20"], ["198.51.100.20"]),
    ([], [], [], [], []),
    # Discovery answers again with a new lease: the new address replaces the kept one.
    ([], ["198.51.100.30"], ["198.51.100.20"], ["198.51.100.30"], []),
])
def test_internal_addresses_merge_known_discovered_and_last_known(known, discovered, previous, expected,
                                                                   kept) -> None:
    assert machine_addresses.internal_addresses(known, discovered, previous) == expected
    assert machine_addresses.kept_addresses(known, discovered, previous) == kept


def test_the_condition_names_the_source_or_what_was_asked_and_what_is_published_instead() -> None:
    assert machine_addresses.discovery_condition(["lease", "agent"], "lease", ["192.0.2.5"], [], []) == (
        "True", "DHCPLease", "192.0.2.5 from libvirt's DHCP leases")
    assert machine_addresses.discovery_condition(["agent", "arp"], "arp", ["192.0.2.5"], [], [])[:2] == ("True", "ARPTable")
    status, reason, message = machine_addresses.discovery_condition(["agent", "arp"], None, [], ["192.0.2.10"],
                                                            ["198.51.100.20"])
    assert (status, reason) == ("False", reasons.NOTHING_DISCOVERED)
    assert message == ("nothing from the guest agent or the host's ARP table; keeping the last discovered "
                       "198.51.100.20; publishing the addresses known up front: 192.0.2.10")
    assert machine_addresses.discovery_condition([], None, [], [], [])[2].startswith("no source can answer")


# -- which source answers -----------------------------------------------------------------------------------------

BRIDGED_WITH_AGENT = ("<domain><devices><interface type='bridge'><source bridge='br0'/></interface>"
                      "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0' state='connected'/>"
                      "</channel></devices></domain>")


class FakeDomain:
    """A domain whose sources answer as given: a list of addresses, or an exception."""

    def __init__(self, answers: dict[int, object]) -> None:
        self.answers, self.asked = answers, []

    def XMLDesc(self, flags: int) -> str:  # noqa: N802  libvirt's name
        return BRIDGED_WITH_AGENT

    def interfaceAddresses(self, source: int, flags: int):  # noqa: N802
        self.asked.append(source)
        answer = self.answers.get(source, [])
        if isinstance(answer, Exception):
            raise answer
        return {"lo": {"addrs": [{"addr": "127.0.0.1"}]},
                "ens3": {"hwaddr": "52:54:00:00:00:01", "addrs": [{"addr": a} for a in answer]}}


def discover(answers: dict[int, object]) -> tuple[machines.Discovery, list[int]]:
    domain = FakeDomain(answers)
    conn = types.SimpleNamespace(lookupByUUIDString=lambda uuid: domain)
    return machines.domain_addresses(conn, "u"), domain.asked


AGENT, ARP = libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP


def test_the_first_source_with_an_address_answers_and_later_ones_are_not_asked() -> None:
    found, asked = discover({AGENT: ["192.0.2.5", "fe80::1", "2001:db8::5"], ARP: ["192.0.2.99"]})
    assert found == machines.Discovery(["192.0.2.5", "2001:db8::5"], "agent", ["agent"])
    assert asked == [AGENT]


def test_an_agent_that_fails_or_has_nothing_leaves_the_answer_to_arp() -> None:
    not_responding = libvirt.libvirtError("Guest agent is not responding")
    assert discover({AGENT: not_responding, ARP: ["192.0.2.99"]})[0] == \
        machines.Discovery(["192.0.2.99"], "arp", ["agent", "arp"])
    assert discover({AGENT: [], ARP: []})[0] == machines.Discovery([], None, ["agent", "arp"])


# -- publishing, in a pass ----------------------------------------------------------------------------------------

def machine_pass(status: dict, addressing: dict[int, v1alpha1.StaticAddressing]) -> machine_reconcile.MachinePass:
    spec = v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base"}, "interfaces": [{"bridge": "br0"}]})
    body = {"metadata": {"namespace": "ns", "name": "m0", "uid": "u", "generation": 1}, "spec": {}, "status": status}
    return machine_reconcile.MachinePass(body=body, spec=spec, status=dict(status), host="kvm1", addressing=addressing)


def host_answering(p: machine_reconcile.MachinePass, *, agent: list[str] | None, arp: tuple[str, ...] = ()) -> MemoryHost:
    """kvm1 in memory with the machine's running domain on a bridge: its guest agent connected and answering `agent`
    (None: not connected), the host's ARP table holding `arp`."""
    host = MemoryHost("kvm1")
    channel = ("<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0' state='connected'/></channel>"
               if agent is not None else "")
    xml = (f"<domain><name>d</name><uuid>{p.domain_uuid}</uuid><devices><interface type='bridge'>"
           f"<mac address='52:54:00:00:00:01'/><source bridge='br0'/></interface>{channel}</devices></domain>")
    host.domains[p.domain_uuid] = Domain(p.domain_uuid, "d", xml, "running")
    host.agent_addresses[p.domain_uuid] = list(agent or [])
    host.arp_addresses[p.domain_uuid] = list(arp)
    return host


async def observe(p: machine_reconcile.MachinePass, host: MemoryHost) -> None:
    deps = types.SimpleNamespace(hosts=types.SimpleNamespace(get=lambda name: host),
                                 now=lambda: "2026-12-01T00:00:00Z")
    await machine_reconcile.observe_addresses(deps, p)


def internal(status: dict) -> list[str]:
    return [a["address"] for a in status["addresses"] if a["type"] == "InternalIP"]


async def test_a_static_address_is_published_and_the_machine_provisioned_before_discovery_finds_anything() -> None:
    p = machine_pass({}, {0: static("192.0.2.10/24")})
    await observe(p, host_answering(p, agent=None))  # asks the ARP table only: nothing
    assert p.status["addresses"][0] == {"type": "Hostname", "address": "m0"}
    assert internal(p.status) == ["192.0.2.10"]
    assert p.status["initialization"] == {"provisioned": True} and p.status["ready"] is True
    condition = conditions.get_condition(p.status["conditions"], conditions.ADDRESSES_DISCOVERED)
    assert condition["status"] == "False" and "known up front: 192.0.2.10" in condition["message"]


async def test_without_known_addresses_a_machine_waits_for_discovery_then_keeps_the_last_found() -> None:
    p = machine_pass({}, {})
    with pytest.raises(machine_reconcile.Wait) as waiting:
        await observe(p, host_answering(p, agent=[]))  # the agent, then the ARP table: nothing
    assert waiting.value.reason == reasons.WAITING_FOR_ADDRESS
    p = machine_pass(p.status, {})
    await observe(p, host_answering(p, agent=["192.0.2.50"]))
    assert internal(p.status) == ["192.0.2.50"]
    assert conditions.get_condition(p.status["conditions"], conditions.ADDRESSES_DISCOVERED)["reason"] == "GuestAgent"
    p = machine_pass(p.status, {})  # the agent stopped, the ARP entry is gone
    await observe(p, host_answering(p, agent=None))
    assert internal(p.status) == ["192.0.2.50"]
    assert p.status["initialization"] == {"provisioned": True}
    condition = conditions.get_condition(p.status["conditions"], conditions.ADDRESSES_DISCOVERED)
    assert condition["reason"] == reasons.NOTHING_DISCOVERED and "keeping the last discovered 192.0.2.50" in \
        condition["message"]


def test_ready_ignores_address_discovery() -> None:
    flapping = conditions.set_condition(None, conditions.ADDRESSES_DISCOVERED, "False", "NothingDiscovered",
                                        now="t", observed_generation=1)
    flapping = conditions.set_condition(flapping, conditions.PROVISIONED, "True", "Provisioned", now="t",
                                        observed_generation=1)
    ready = conditions.summarize_ready(flapping, "t", 1, order=(conditions.PROVISIONED,),
                                       ignore=machine_reconcile.READY_IGNORES)
    assert conditions.is_true(ready, conditions.READY)
