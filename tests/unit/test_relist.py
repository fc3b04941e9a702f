"""A LibvirtMachine deleted while the operator's watch was not looking (kube-apiserver restarted: the watch resumes
with "410 Gone" and kopf lists again, and a list says nothing of what is gone) must not stay in the cache for the
operator's life. Found by tests/e2e/test_chaos.py: the phantom counted as allocated on its host, and a machine placed
later waited forever in InsufficientCapacity. kopf's listing (events of type None) makes the operator read the kind
itself once, and drop what is gone."""

from __future__ import annotations

import asyncio
import inspect

import kopf
import pytest

from capi_libvirt.kube import api
from capi_libvirt.kube.cache import ObjectCache
from capi_libvirt.operator import handlers
from capi_libvirt.operator import runtime as runtime_module
from capi_libvirt.operator.config import OperatorConfig

pytestmark = pytest.mark.unit


def body(name: str, version: int) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(version)}}


class FakeKube:
    """The API as the relist sees it: each LIST answers `listed`, or fails `failures` times first."""

    def __init__(self, listed: list[dict], failures: int = 0) -> None:
        self.cache, self.listed, self.failures, self.lists = ObjectCache(), listed, failures, 0

    async def relist(self, plural: str, namespaces: list[str]) -> list:
        self.lists += 1
        if self.failures:
            self.failures -= 1
            raise OSError("connection refused")
        return self.cache.replace_all(plural, self.listed, "100")


class Observer:
    def __init__(self) -> None:
        self.gone: list[tuple[str, str]] = []

    def machine_gone(self, namespace: str, name: str) -> None:
        self.gone.append((namespace, name))


@pytest.fixture(autouse=True)
def no_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "RELIST_DELAY_S", 0.0)


def dependencies(kube: FakeKube) -> handlers.machine_reconcile.Dependencies:
    return handlers.machine_reconcile.Dependencies(kube=kube, inventory=None, post_event=lambda *args: None,
                                                   observe=Observer())


def runtime_with(kube: FakeKube) -> handlers.Runtime:
    return handlers.Runtime(dependencies(kube))


async def test_a_listing_by_kopf_drops_a_machine_deleted_unseen_and_forgets_its_key() -> None:
    kube = FakeKube(listed=[body("kept", 50)])
    runtime = runtime_with(kube)
    kube.cache.put(api.LIBVIRT_MACHINES, body("phantom", 40))  # its DELETED event was lost with the watch
    forgotten = []
    runtime.machines.forget = forgotten.append  # type: ignore[method-assign]
    memo = kopf.Memo(runtime=runtime)
    for listed in kube.listed:  # kopf's listing: one event of type None per object, then the watch again
        await handlers.libvirt_machine_event(event={"type": None, "object": listed}, memo=memo)
    assert len(runtime.relists) == 1, "a listing asks once, not once per object"
    await asyncio.gather(*runtime.relists.values())
    assert kube.lists == 1 and not runtime.relists
    assert kube.cache.get(api.LIBVIRT_MACHINES, "ns", "phantom") is None
    assert kube.cache.get(api.LIBVIRT_MACHINES, "ns", "kept") is not None
    assert forgotten == [("ns", "phantom")] and runtime.deps.observe.gone == [("ns", "phantom")]
    await runtime.machines.stop()


async def test_watch_events_ask_for_no_relist() -> None:
    kube = FakeKube(listed=[])
    runtime = runtime_with(kube)
    memo = kopf.Memo(runtime=runtime)
    await handlers.libvirt_machine_event(event={"type": "ADDED", "object": body("a", 1)}, memo=memo)
    await handlers.cluster_event(event={"type": "MODIFIED", "object": body("c", 2)}, memo=memo)
    assert not runtime.relists


async def test_a_relist_the_api_server_refuses_is_tried_again() -> None:
    kube = FakeKube(listed=[], failures=2)
    runtime = runtime_with(kube)
    kube.cache.put(api.CLUSTERS, body("gone", 3))
    memo = kopf.Memo(runtime=runtime)
    await handlers.cluster_event(event={"type": None, "object": body("other", 4)}, memo=memo)
    await asyncio.gather(*runtime.relists.values())
    assert kube.lists == 3
    assert kube.cache.get(api.CLUSTERS, "ns", "gone") is None


@pytest.mark.parametrize("handler", [handlers.libvirt_machine_event, handlers.owner_machine_event,
                                     handlers.cluster_event, handlers.libvirt_cluster_changed])
def test_handlers_that_touch_the_event_loops_objects_run_in_the_event_loop(handler) -> None:
    """kopf runs a plain `def` handler in a thread of its executor: the work queue (an asyncio.Queue), its timers,
    the wake-up events and the relist task are the event loop's, and are not thread-safe (a key put from a thread
    may wait for a worker until something else wakes the loop; a task cannot be made there at all)."""
    assert inspect.iscoroutinefunction(handler)


async def test_the_sync_period_queues_every_cached_machine() -> None:
    kube = FakeKube(listed=[body("a", 1), body("b", 2)])
    await kube.relist(handlers.api.LIBVIRT_MACHINES, [])
    runtime = runtime_with(kube)
    assert runtime.machines.pending == 0
    assert runtime.resync() == 2
    assert runtime.machines.pending == 2  # queued now (a pending timer of a key is replaced by this pass)


async def test_a_machine_of_another_watch_filter_is_not_reconciled_but_stays_counted() -> None:
    theirs, ours = body("theirs", 1), body("ours", 2)
    theirs["metadata"]["labels"] = {"cluster.x-k8s.io/watch-filter": "other-instance"}
    ours["metadata"]["labels"] = {"cluster.x-k8s.io/watch-filter": "this-instance"}
    kube = FakeKube(listed=[theirs, ours])
    await kube.relist(handlers.api.LIBVIRT_MACHINES, [])
    runtime = handlers.Runtime(dependencies(kube), config=OperatorConfig(hosts={}, watch_filter="this-instance"))
    assert await runtime.reconcile_machine(("ns", "theirs")) is None  # skipped before any reconcile
    assert len(list(kube.cache.items(handlers.api.LIBVIRT_MACHINES))) == 2  # placement still counts it
    from capi_libvirt.operator import config
    assert config.watched({"cluster.x-k8s.io/watch-filter": "a"}, "a")
    assert not config.watched({}, "a") and not config.watched({"cluster.x-k8s.io/watch-filter": "b"}, "a")
    assert config.watched(None, None) and config.watched({"cluster.x-k8s.io/watch-filter": "b"}, None)


async def test_after_a_relist_every_machine_is_looked_at_since_a_listed_change_silences_its_own_event() -> None:
    deleting = {**body("m1", 60), "metadata": {**body("m1", 60)["metadata"], "deletionTimestamp": "2026-12-06T03:19:48Z"}}
    kube = FakeKube(listed=[deleting, body("m2", 50)])
    runtime = runtime_with(kube)
    kube.cache.put(api.LIBVIRT_MACHINES, body("m1", 40))
    kube.cache.put(api.LIBVIRT_MACHINES, body("m2", 50))
    queued = []
    runtime.machines.add = lambda key, after=0: queued.append(key)  # type: ignore[method-assign]
    runtime.relisted(api.LIBVIRT_MACHINES)
    await asyncio.gather(*runtime.relists.values())
    memo = kopf.Memo(runtime=runtime)
    await handlers.libvirt_machine_event(event={"type": "MODIFIED", "object": deleting}, memo=memo)
    assert ("ns", "m1") in queued, "its deletion's own event came after the LIST had it: ignored, so the relist queues it"
    await runtime.machines.stop()


async def test_a_deleted_machine_that_held_room_on_a_host_wakes_the_machines_waiting_for_one_once_per_burst(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine waiting for a host (InsufficientCapacity, QuotaExceeded) decides again once a deletion frees room on
    one, not at its 30-second recheck: one wake for a burst of deletions, none for a machine that held no room (never
    placed) or lives on elsewhere (deleted by clusterctl move), none once the operator stops."""
    monkeypatch.setattr(runtime_module, "WAKE_UNPLACED_AFTER_S", 0.01)
    kube = FakeKube(listed=[])
    runtime = runtime_with(kube)
    wakes: list[bool] = []
    woken = asyncio.Event()

    def wake_unplaced() -> None:
        wakes.append(True)
        woken.set()
    runtime.wake_unplaced = wake_unplaced  # type: ignore[method-assign]
    memo = kopf.Memo(runtime=runtime)

    def placed(name: str, version: int, **annotations: str) -> dict:
        return {**body(name, version), "status": {"host": "kvm1"},
                "metadata": {**body(name, version)["metadata"], "annotations": annotations}}

    async def deleted(machine: dict) -> None:  # (the handler never yields to the loop: a burst is one step of it)
        await handlers.libvirt_machine_event(event={"type": "ADDED", "object": machine}, memo=memo)
        await handlers.libvirt_machine_event(event={"type": "DELETED", "object": machine}, memo=memo)

    async def pending_wake_ran() -> None:
        await asyncio.wait_for(woken.wait(), 5)
        woken.clear()
        assert runtime.unplaced_wake is None

    await deleted(body("never-placed", 1))
    await deleted(placed("moved", 2, **{handlers.machine_reconcile.DELETE_FOR_MOVE_ANNOTATION: ""}))
    assert runtime.unplaced_wake is None and wakes == [], "no room was freed"
    for i in range(5):
        await deleted(placed(f"scaled-down-{i}", 10 + i))
    assert runtime.unplaced_wake is not None and wakes == [], "not yet: the burst's deletions are gathered first"
    await pending_wake_ran()
    assert wakes == [True]
    await deleted(placed("later", 20))
    await pending_wake_ran()
    assert wakes == [True, True]
    runtime.closing = True
    await deleted(placed("while-stopping", 21))
    assert runtime.unplaced_wake is None and wakes == [True, True]
    await runtime.machines.stop()
