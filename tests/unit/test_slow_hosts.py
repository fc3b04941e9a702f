"""A busy host is not a lost one (reconcile.inventory): a probe that outlasts its timeout while the host's connection
lives leaves the host reachable with its last figures, says so on the LibvirtHost and in a metric, and is awaited,
not sent again; a probe unanswered with no live connection, or for the give-up time, makes the host unreachable; a
dead connection's error does at once. Against the in-memory host, whose probe the test holds."""

from __future__ import annotations

import asyncio

import pytest

from capi_libvirt.api import reasons, v1alpha1_host
from capi_libvirt.core import conditions
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.reconcile import hosts
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv.memory_host import MemoryHost, MemoryHosts
from memory_api import LIBVIRT_HOSTS, MemoryAPI

pytestmark = pytest.mark.unit

HOST = "kvm1"
TIMEOUT_S = 0.05  # the probe's timeout in these tests (20 s in the operator)


class Bed:
    def __init__(self) -> None:
        self.host = MemoryHost(HOST)
        self.host.keep_asked = True
        self.now = 1000.0
        self.inventory = inventory_.Inventory(host_api.HostRegistry({}, factory=MemoryHosts(self.host)),
                                              clock=lambda: self.now, management_cluster="mc-1")
        self.inventory.probe_timeout_s = TIMEOUT_S
        self.kube = MemoryAPI()
        self.kube.add(LIBVIRT_HOSTS, {"metadata": {"name": HOST}, "spec": {"uri": f"qemu+tls://{HOST}/system"}})
        self.deps = machine_reconcile.Dependencies(kube=self.kube, inventory=self.inventory,
                                                   post_event=lambda *args: None)
        self.inventory.upsert(HOST, v1alpha1_host.LibvirtHostSpec(uri=f"qemu+tls://{HOST}/system"), None)

    @property
    def entry(self) -> inventory_.InventoryHost:
        return self.inventory.hosts[HOST]

    def probes_sent(self) -> int:
        return sum(1 for name, _args in self.host.asked if name == "probe")

    def ready(self) -> dict:
        body = self.kube.get(LIBVIRT_HOSTS, "", HOST) or {}
        return conditions.get_condition((body.get("status") or {}).get("conditions"), conditions.READY) or {}

    async def until(self, predicate) -> None:
        """Let the prober run until `predicate()` (a second at most)."""
        for _ in range(100):
            if predicate():
                return
            await asyncio.sleep(0.01)

    def healthy(self) -> bool:
        (load,) = self.inventory.loads({})
        return load.healthy


async def test_a_slow_probe_with_a_live_connection_keeps_the_host_reachable_and_placing() -> None:
    bed = Bed()
    await hosts.probe_and_publish(bed.deps, HOST)
    figures = bed.entry.probe
    assert bed.entry.reachable and figures is not None and bed.ready()["reason"] == reasons.REACHABLE

    held = bed.host.hold("probe", after=True)  # the host read its state; the answer is late
    bed.now += 30
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.entry.reachable and bed.entry.slow and bed.entry.unreachable_since is None
    assert bed.entry.probe is figures, "the last probe's figures are kept"
    assert bed.healthy(), "placement goes on"
    assert bed.ready()["status"] == "True" and bed.ready()["reason"] == reasons.PROBE_SLOW
    assert "connection is alive" in bed.ready()["message"]
    assert bed.inventory.state(HOST).unreachable_for is None, "no re-placement clock runs for a busy host"

    bed.now += 30
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.probes_sent() == 2, "the late probe is awaited, not sent again"
    assert bed.entry.slow and bed.entry.reachable

    held.release()
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.probes_sent() == 2, "its answer is taken"
    assert bed.entry.reachable and not bed.entry.slow and bed.entry.probe is not figures
    assert bed.ready()["reason"] == reasons.REACHABLE


async def test_a_new_host_whose_first_probe_is_slow_takes_nothing_until_it_answers() -> None:
    bed = Bed()
    held = bed.host.hold("probe", after=True)
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.entry.slow and not bed.entry.reachable and not bed.healthy(), "no figures to place with yet"
    assert bed.ready()["status"] == "False" and bed.ready()["reason"] == reasons.PROBE_SLOW
    assert "nothing is placed here until it answers" in bed.ready()["message"]
    held.release()
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.entry.reachable and bed.healthy() and bed.ready()["reason"] == reasons.REACHABLE


async def test_a_probe_unanswered_with_no_live_connection_makes_the_host_unreachable() -> None:
    bed = Bed()
    await bed.inventory.probe(HOST)
    held = bed.host.hold("probe")  # as a connection being opened that hangs
    bed.host.connected = False
    await hosts.probe_and_publish(bed.deps, HOST)
    assert not bed.entry.reachable and not bed.entry.slow and not bed.healthy()
    assert bed.ready()["reason"] == reasons.HOST_UNREACHABLE
    assert "no live connection" in bed.ready()["message"]
    bed.host.connected = True
    held.release()
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.entry.reachable and bed.ready()["reason"] == reasons.REACHABLE


async def test_a_probe_unanswered_for_the_give_up_time_makes_the_host_unreachable_until_it_answers() -> None:
    bed = Bed()
    await bed.inventory.probe(HOST)
    held = bed.host.hold("probe", after=True)
    await bed.inventory.probe(HOST)
    assert bed.entry.reachable and bed.entry.slow
    bed.now += inventory_.PROBE_GIVE_UP_S
    await hosts.probe_and_publish(bed.deps, HOST)
    assert not bed.entry.reachable and not bed.entry.slow
    assert bed.inventory.state(HOST).unreachable_for == 0.0, "the re-placement clock starts now"
    assert "has not answered in 120s" in bed.ready()["message"]
    held.release()
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.entry.reachable and bed.probes_sent() == 2


async def test_a_late_probe_whose_connection_dies_makes_the_host_unreachable_when_the_error_comes() -> None:
    bed = Bed()
    await bed.inventory.probe(HOST)
    held = bed.host.hold("probe")
    await bed.inventory.probe(HOST)
    assert bed.entry.slow
    bed.host.unreachable = "Cannot recv data: keepalive timeout"  # what the held call raises once it goes on
    held.release()
    await bed.inventory.probe(HOST)
    assert not bed.entry.reachable and not bed.entry.slow
    assert "keepalive timeout" in (bed.entry.problem or "")


async def test_the_prober_takes_a_late_answer_as_soon_as_it_comes_not_at_its_next_round() -> None:
    bed = Bed()
    bed.deps.probe_interval_s = 3600.0
    held = bed.host.hold("probe", after=True)
    prober = asyncio.ensure_future(hosts.probe_forever(bed.deps))
    try:
        await held.reached.wait()
        await bed.until(lambda: bed.entry.slow)
        assert bed.entry.slow
        held.release()
        await bed.until(lambda: bed.entry.probe is not None and not bed.entry.slow)
        assert bed.entry.probe is not None and bed.entry.reachable and not bed.entry.slow, (bed.entry, prober)
        assert bed.probes_sent() == 1
    finally:
        prober.cancel()


async def test_a_replaced_connection_drops_the_probe_in_flight_on_the_old_one() -> None:
    bed = Bed()
    bed.host.hold("probe")
    await bed.inventory.probe(HOST)
    assert bed.entry.probing is not None
    bed.inventory.upsert(HOST, v1alpha1_host.LibvirtHostSpec(uri=f"qemu+tls://{HOST}/system", unschedulable=True), None)
    assert bed.entry.probing is not None, "the same connection: its probe still counts"
    bed.inventory.upsert(HOST, v1alpha1_host.LibvirtHostSpec(uri=f"qemu+ssh://root@{HOST}/system"), None)
    assert bed.entry.probing is None and not bed.entry.slow, "a new connection is probed anew"


async def test_a_host_decommissioned_while_its_probe_is_late_is_not_probed_and_the_prober_rests(monkeypatch) -> None:
    bed = Bed()
    bed.deps.probe_interval_s = 3600.0
    held = bed.host.hold("probe", after=True)
    rounds = []
    probe_and_publish = hosts.probe_and_publish

    async def counted(deps, name):
        rounds.append(name)
        await probe_and_publish(deps, name)
    monkeypatch.setattr(hosts, "probe_and_publish", counted)
    prober = asyncio.ensure_future(hosts.probe_forever(bed.deps))
    try:
        await held.reached.wait()
        await bed.until(lambda: bed.entry.slow)
        bed.inventory.upsert(HOST, v1alpha1_host.LibvirtHostSpec(uri=f"qemu+tls://{HOST}/system",
                                                                 decommissioned=True), None)
        await hosts.probe_and_publish(bed.deps, HOST)
        assert bed.entry.probing is None and not bed.entry.slow and not bed.entry.reachable
        held.release()
        await asyncio.sleep(0.2)
        assert not prober.done() and bed.probes_sent() == 1, "nothing sent again"
        # Its first round, the test's own, and at most one for the answer read after all; a spin makes hundreds.
        assert len(rounds) <= 3, f"the prober spun: {len(rounds)} rounds"
        assert bed.ready()["reason"] == reasons.DECOMMISSIONED
    finally:
        prober.cancel()


async def test_a_host_that_was_unreachable_is_back_when_a_probe_answers_not_when_it_connects() -> None:
    bed = Bed()
    await bed.inventory.probe(HOST)
    bed.host.unreachable = "Cannot recv data: Connection reset by peer"
    await hosts.probe_and_publish(bed.deps, HOST)
    assert not bed.entry.reachable
    bed.host.unreachable = None
    held = bed.host.hold("probe", after=True)  # connected again; the probe is late
    bed.now += 10
    await hosts.probe_and_publish(bed.deps, HOST)
    assert not bed.entry.reachable and not bed.entry.slow and not bed.healthy()
    assert bed.inventory.state(HOST).unreachable_for == 10, "the re-placement clock runs on"
    assert bed.ready()["reason"] == reasons.HOST_UNREACHABLE and "connected again" in bed.ready()["message"]
    held.release()
    await hosts.probe_and_publish(bed.deps, HOST)
    assert bed.entry.reachable and bed.ready()["reason"] == reasons.REACHABLE
