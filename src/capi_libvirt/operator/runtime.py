"""What the handlers share for the operator's life (operator.handlers): the reconcile dependencies, the
LibvirtMachines' work queue and its workers, the wake-ups (a host's machines, the machines waiting for a host,
a LibvirtCluster's daemon), and the relist of a kind kopf listed again."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import uuid
from collections.abc import Iterable, Sequence

from capi_libvirt.api import kinds, meta
from capi_libvirt.kube import api
from capi_libvirt.operator import config as operator_config
from capi_libvirt.operator import election, logs, metrics, workqueue
from capi_libvirt.reconcile import machine as machine_reconcile

log = logging.getLogger(__name__)
RELIST_DELAY_S = 1.0  # after kopf's listing of a kind begins: let it end before reading the kind ourselves
RELIST_ATTEMPTS = 6  # 1 + 2 + 4 + ... seconds apart: an API server coming back
# A deleted machine's room on its host wakes the machines waiting for a host this long after the deletion is seen, once
# for every deletion in between (a MachineDeployment scaled down deletes many at once): one look over the cache each.
WAKE_UNPLACED_AFTER_S = 1.0


class Runtime:
    """What handlers share for the operator's life: the reconcile dependencies, the machine queue, wake-up events."""

    def __init__(self, deps: machine_reconcile.Dependencies, namespaces: Sequence[str] = (),
                 config: operator_config.OperatorConfig | None = None) -> None:
        """`deps` as configured; the reconciles get a copy whose wake-ups are this runtime's (queue a host's machines,
        or the unplaced ones). `config`: its concurrency, periods and watch filter (None: the defaults)."""
        cfg = config if config is not None else operator_config.OperatorConfig(hosts={})
        self.deps = dataclasses.replace(deps, wake_host=self.wake_host, wake_unplaced=self.wake_unplaced,
                                        wake_machines=self.wake_machines)
        self.namespaces = list(namespaces)
        self.orphan_interval_s = cfg.orphan_interval_s
        self.sync_period_s = cfg.sync_period_s
        self.watch_filter = cfg.watch_filter
        self.machines: workqueue.WorkQueue[tuple[str, str]] = workqueue.WorkQueue(
            self.reconcile_machine, cfg.workers, metrics.QueueMetrics(metrics.QUEUE))
        self.machine_worker: asyncio.Task | None = None
        # Keyed by (kind, namespace, name), kind being "machine" or "cluster".
        self.wakers: dict[tuple[str, str, str], asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.locks: dict[tuple[str, str, str], asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self.clusters: dict[tuple[str, str, str], str | None] = {}  # object -> its cluster, to wake a cluster's objects
        self.prober: asyncio.Task | None = None
        self.metrics: metrics.Source | None = None
        self.relists: dict[str, asyncio.Task] = {}  # a cached kind -> its pending relist (relisted)
        self.closing = False  # the operator stops: no new background work
        self.unplaced_wake: asyncio.TimerHandle | None = None  # wake_unplaced_soon's pending call

    def relisted(self, plural: str) -> None:
        """kopf lists `plural` (at its start, or because its watch lost track: a "410 Gone" after an API server
        restart, an outage): what was deleted meanwhile comes as no event at all, and would stay in the cache for the
        operator's life (counted by placement as allocated). Read the kind ourselves once that listing is over, and
        drop what is gone. One relist per kind at a time: a listing's many objects ask once."""
        if plural not in self.relists and not self.closing:
            self.relists[plural] = asyncio.create_task(self._relist(plural))

    async def _relist(self, plural: str) -> None:
        delay = RELIST_DELAY_S
        try:
            for attempt in range(RELIST_ATTEMPTS):
                await asyncio.sleep(delay)
                try:
                    dropped = await self.deps.kube.relist(plural, self.namespaces)
                    break
                except Exception as error:  # noqa: BLE001  the API server is not back yet: again, later
                    log.warning("re-reading %s failed (%s); attempt %d of %d", plural, type(error).__name__,
                                attempt + 1, RELIST_ATTEMPTS)
                    delay *= 2
            else:
                return  # kopf's next listing, when its watch recovers, asks again
        finally:
            self.relists.pop(plural, None)
        for _, namespace, name in dropped:
            log.info("%s %s/%s was deleted while the watch was not looking; dropped", plural, namespace, name)
            if plural == api.LIBVIRT_MACHINES:
                self.machines.forget((namespace, name))
                self.deps.observe.machine_gone(namespace, name)
        # A change the LIST brought into the cache silences its own watch event, which comes later with the same
        # resourceVersion (the cache takes it for the echo of what it holds): look at everything again. Found by the
        # scale bench: machines deleted right after an operator restart waited for the sync period.
        self.resync()
        if plural == api.CLUSTERS:
            for kind, namespace, name in list(self.clusters):
                self.wake(kind, namespace, name)

    def wake(self, kind: str, namespace: str, name: str) -> None:
        event = self.wakers.get((kind, namespace, name))
        if event is not None:
            event.set()

    def wake_cluster(self, namespace: str, cluster: str) -> None:
        for key, object_cluster in list(self.clusters.items()):
            if key[1] == namespace and object_cluster == cluster:
                self.wake(*key)
        for body in self.deps.kube.cache.items(api.LIBVIRT_MACHINES):
            labels = body["metadata"].get("labels") or {}
            if body["metadata"].get("namespace") == namespace and labels.get(meta.CLUSTER_NAME_LABEL) == cluster:
                self.machines.add((namespace, body["metadata"]["name"]))

    def wake_host(self, host: str) -> None:
        """Every cached machine placed on `host` (its providerID or status names it) or moved away from it, queued now
        with its backoff cleared: the host just entered the inventory (a LibvirtHost clusterctl move copied), went
        down, came back, or was decommissioned; its machines decide again without waiting out their backoff."""
        for body in self.deps.kube.cache.items(api.LIBVIRT_MACHINES):
            namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
            if machine_reconcile.recorded_host(body) == host or host in machine_reconcile.former_hosts(body):
                self.deps.failures.pop((namespace, name), None)
                self.machines.add((namespace, name))

    def wake_machines(self, keys: Iterable[tuple[str, str]]) -> None:
        """These machines queued now (the host probe saw their domains change); one no longer cached is gone."""
        for namespace, name in keys:
            if self.deps.kube.cache.get(api.LIBVIRT_MACHINES, namespace, name) is not None:
                self.machines.add((namespace, name))

    def wake_unplaced(self) -> None:
        """Every cached machine not placed yet (no host in its providerID or status), queued now with its backoff
        cleared: a host just gained room that placement can see (a foreign VM stopped), so a machine waiting for a
        host decides again without waiting out its recheck."""
        for body in self.deps.kube.cache.items(api.LIBVIRT_MACHINES):
            if machine_reconcile.recorded_host(body) is None and not body["metadata"].get("deletionTimestamp"):
                namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
                self.deps.failures.pop((namespace, name), None)
                self.machines.add((namespace, name))

    def wake_unplaced_soon(self) -> None:
        """wake_unplaced in WAKE_UNPLACED_AFTER_S, once for all the calls until then: a deleted machine no longer
        counts on its host, so a machine waiting for room there decides again instead of waiting out its recheck."""
        if self.unplaced_wake is None and not self.closing:
            self.unplaced_wake = asyncio.get_running_loop().call_later(WAKE_UNPLACED_AFTER_S, self._wake_unplaced_now)

    def _wake_unplaced_now(self) -> None:
        self.unplaced_wake = None
        if not self.closing:
            self.wake_unplaced()

    async def reconcile_machine(self, key: tuple[str, str]) -> float | None:
        namespace, name = key
        cached = self.deps.kube.cache.get(api.LIBVIRT_MACHINES, namespace, name)
        if cached is not None and not operator_config.watched(cached["metadata"].get("labels"), self.watch_filter):
            return None  # another instance's (--watch-filter): placement still counts it, from the cache

        def deleting() -> bool:
            body = self.deps.kube.cache.get(api.LIBVIRT_MACHINES, namespace, name)
            return body is None or bool(body["metadata"].get("deletionTimestamp"))

        body = self.deps.kube.cache.get(api.LIBVIRT_MACHINES, namespace, name) or {"metadata": {}}
        with logs.fields(machine=f"{namespace}/{name}", reconcileID=uuid.uuid4().hex[:12], host=machine_reconcile.recorded_host(body),
                         cluster=(body["metadata"].get("labels") or {}).get(meta.CLUSTER_NAME_LABEL)), \
                metrics.reconcile_pass(kinds.LIBVIRT_MACHINE.kind, count_success=False):  # the reconcile reports it
            after = await machine_reconcile.reconcile(self.deps, namespace, name, cancelled=deleting)
        # A pass that failed left its backoff in deps.failures: the queue counts it as a retry.
        return workqueue.Retry(after) if after is not None and key in self.deps.failures else after

    async def work_machines_while_active(self, state: election.State) -> None:
        """The machine workers, while this replica does the work; each start reads every machine once (a LIST of
        each cached kind) and queues them all, so a new leader picks up what the old one left."""
        while True:
            await state.leading.wait()
            await self._prime()
            for body in self.deps.kube.cache.items(api.LIBVIRT_MACHINES):
                self.machines.add((body["metadata"]["namespace"], body["metadata"]["name"]))
            self.machines.start()
            resync = asyncio.create_task(self._resync_every(self.sync_period_s))
            try:
                await state.not_leading.wait()
            finally:
                resync.cancel()
                await self.machines.stop()

    def resync(self) -> int:
        """Queue every cached machine now (--sync-period): whatever was missed is looked at again. Returns how many."""
        keys = [(b["metadata"]["namespace"], b["metadata"]["name"])
                for b in self.deps.kube.cache.items(api.LIBVIRT_MACHINES)]
        for key in keys:
            self.machines.add(key)
        return len(keys)

    async def _resync_every(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            log.info("sync period: %d LibvirtMachines queued", self.resync())

    async def _prime(self) -> None:
        delay = 1.0
        while True:
            try:
                await self.deps.kube.prime(self.namespaces)
                return
            except Exception as error:  # noqa: BLE001  the API server is not answering yet: try again
                log.warning("reading the machines failed (%s); retrying in %.0fs", type(error).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
