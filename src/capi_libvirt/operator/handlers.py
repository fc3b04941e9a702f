"""kopf handlers: each turns an event into a call of one reconcile. No logic lives here.

LibvirtMachines go through a work queue (operator.workqueue) drained by a fixed number of workers: the watches of
LibvirtMachines, Machines and Clusters put each body into the cache (kube.cache) and queue the LibvirtMachines whose
inputs changed; a pass returns when it wants to look again, and the queue's timer brings the key back then. Between
passes a machine costs nothing. The IPAddressClaims the machines own (Cluster API IPAM) are watched only to queue
their owner when an IPAM provider answers one. (Bootstrap Secrets are not watched: Cluster API sets
Machine.spec.bootstrap.dataSecretName once the Secret exists, and that Machine change queues the machine; reading
every Secret of the cluster is not worth that privilege.) A LibvirtMachine being deleted is torn down by the same
reconcile, which releases the finalizer it put on at placement (kopf puts none on LibvirtMachines).

A LibvirtCluster (a handful per management cluster) is driven by a kopf daemon per object. Every reconcile is
measured (operator.metrics); the machine workers and the host prober run only while this replica leads (or runs
standalone): kopf pauses the handlers of a standby replica, but not a task of our own. What the handlers share
(the queue, the wake-ups, the relist) is operator.runtime's Runtime.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import kopf

from capi_libvirt.api import kinds, meta, v1alpha1
from capi_libvirt.core import capacity, ipam, orphans
from capi_libvirt.hypervisor import credentials
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.kube import api
from capi_libvirt.kube import client as kube_client
from capi_libvirt.operator import config as operator_config
from capi_libvirt.operator import election, metrics
from capi_libvirt.operator import login as operator_login
from capi_libvirt.operator.runtime import Runtime
from capi_libvirt.reconcile import cluster as cluster_reconcile
from capi_libvirt.reconcile import hosts as hosts_reconcile
from capi_libvirt.reconcile import images as reconcile_images
from capi_libvirt.reconcile import inventory
from capi_libvirt.reconcile import machine as machine_reconcile
from capi_libvirt.reconcile import orphans as orphans_reconcile

log = logging.getLogger(__name__)
MACHINES = kinds.LIBVIRT_MACHINE.plural
CLUSTERS = kinds.LIBVIRT_CLUSTER.plural
HOSTS = kinds.LIBVIRT_HOST.plural
EXIT_TIMEOUT_S = 50  # SIGKILL after this long exiting (kopf's ultimate exit); below the Deployment's grace period
class EventPoster:
    """Posts the reconciles' events in the background: a pass does not wait for them, and a failed post is logged,
    not a failed pass. (kopf's own kopf.event works only inside kopf's per-object tasks; the machine workers are not.)"""

    def __init__(self, kube: api.KubeAPI) -> None:
        self.kube = kube
        self.pending: set[asyncio.Task] = set()

    def __call__(self, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
        task = asyncio.create_task(self.kube.post_event(body, kind, reason, message, machine_reconcile.utc_now()))
        self.pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.pending.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.info("posting an event failed: %s", api.describe_error(error))


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    _configure_kopf(settings)
    cfg: operator_config.OperatorConfig = memo.get("config") or operator_config.from_arguments({})
    credentials.sweep_leftovers()  # key files a crash in the middle of connecting may have left behind
    hosts = host_api.HostRegistry(cfg.hosts, observe=metrics.libvirt_call)
    limit = None if cfg.kube_api_qps is None else kube_client.RateLimit(cfg.kube_api_qps, cfg.kube_api_burst)
    kube = api.KubeAPI(api.new_api_client(observe=metrics.api_request, rate_limit=limit))
    observer = metrics.Observer()
    management_cluster = cfg.management_cluster_id or await _management_cluster_identity(kube)
    deps = machine_reconcile.Dependencies(kube=kube, inventory=inventory.Inventory(
                                              hosts, management_cluster=management_cluster,
                                              probe_timeout_s=cfg.probe_timeout_s),
                                          post_event=EventPoster(kube), observe=observer,
                                          images=reconcile_images.ImageImports(observe=metrics.image_import),
                                          creates_per_host=cfg.creates_per_host,
                                          probe_interval_s=cfg.probe_interval_s, replace_after_s=cfg.replace_after_s,
                                          management_cluster=management_cluster,
                                          orphan_grace_s=cfg.orphan_grace_s,
                                          provider_namespace=cfg.provider_namespace)
    memo.runtime = _start_runtime(Runtime(deps, memo.get("namespaces") or [], cfg),
                                  memo.setdefault("state", election.State(None)), observer)
    log.info("static libvirt hosts: %s; LibvirtHost objects add more", ", ".join(hosts.names()) or "none")


MANAGEMENT_NAMESPACE = "kube-system"  # every cluster has it, and its UID lives as long as the cluster's data


async def _management_cluster_identity(kube: api.KubeAPI, attempts: int = 5) -> str | None:
    """The kube-system Namespace's UID: what tells this management cluster's domains from another's. None (logged)
    when it cannot be read: domains then carry no management cluster, and no orphan is ever removed."""
    for attempt in range(attempts):
        try:
            uid = await kube.namespace_uid(MANAGEMENT_NAMESPACE)
            if uid:
                log.info("management cluster identity: %s (the %s Namespace's UID)", uid, MANAGEMENT_NAMESPACE)
                return uid
        except Exception as error:  # noqa: BLE001  forbidden, or the API server not answering yet
            log.warning("reading the %s Namespace failed: %s", MANAGEMENT_NAMESPACE, type(error).__name__)
        await asyncio.sleep(min(2.0 ** attempt, 10.0))
    log.error("no management cluster identity (the %s Namespace's UID could not be read, and --management-cluster-id "
              "is not set): orphaned domains are not collected", MANAGEMENT_NAMESPACE)
    return None


def _configure_kopf(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = f"{meta.GROUP}/libvirt"  # LibvirtHosts, LibvirtClusters (machines: their own)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="capi-libvirt.x-k8s.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="capi-libvirt.x-k8s.io")
    settings.posting.level = logging.WARNING  # kopf's own log lines; the reconciles post their events themselves
    settings.process.ultimate_exiting_timeout = EXIT_TIMEOUT_S


def _start_runtime(runtime: Runtime, state: election.State, observer: metrics.Observer) -> Runtime:
    """The shared state's metrics, and the background tasks: the machine workers and the host prober."""
    deps = runtime.deps
    runtime.metrics = metrics.Source(observer, deps.inventory, state, deps.kube.cache.events)
    metrics.attach(runtime.metrics)
    runtime.prober = asyncio.create_task(_probe_while_active(deps, state, runtime.namespaces,
                                                             runtime.orphan_interval_s))
    runtime.machine_worker = asyncio.create_task(runtime.work_machines_while_active(state))
    return runtime


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    if memo.get("state") is not None:
        memo.state.stopping()
    if runtime is not None:
        runtime.closing = True
        tasks = [task for task in (runtime.machine_worker, runtime.prober,
                                   *runtime.relists.values()) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Let a probe in flight end before its connection closes under it (a late one: for its timeout at most).
        probing = [host.probing for host in runtime.deps.inventory.hosts.values() if host.probing is not None]
        if probing:
            await asyncio.wait(probing, timeout=runtime.deps.inventory.probe_timeout_s)
        await runtime.deps.images.close()  # image imports: their waits end; an unfinished import is never marked
        if runtime.metrics is not None:
            metrics.detach(runtime.metrics)
        await asyncio.get_running_loop().run_in_executor(None, runtime.deps.hosts.close)  # libvirt close blocks
        await runtime.deps.kube.client.close()


async def _probe_while_active(deps: machine_reconcile.Dependencies, state: election.State,
                              namespaces: Sequence[str] = (),
                              orphan_interval_s: float = orphans_reconcile.INTERVAL_S) -> None:
    """The host prober and the orphan collector, while this replica does the work: a standby would publish host
    status twice, and its machine cache is not kept complete."""
    while True:
        await state.leading.wait()
        tasks = [asyncio.create_task(hosts_reconcile.probe_forever(deps)),
                 asyncio.create_task(orphans_reconcile.collect_forever(deps, namespaces, orphan_interval_s))]
        try:
            await state.not_leading.wait()
        finally:
            for task in tasks:
                task.cancel()


@kopf.on.login()
async def login(**_: Any) -> kopf.ConnectionInfo:
    return await operator_login.connection()


def _body(event: kopf.RawEvent) -> dict[str, Any]:
    """The watched object: kopf types it as a TypedDict of a few fields; it is the plain JSON dict the cache keeps."""
    return cast(dict[str, Any], event["object"])


# -- LibvirtMachine, and what a machine waits for: its Machine and its Cluster -------------------------------------

@kopf.on.event(meta.GROUP, meta.VERSION, MACHINES)
async def libvirt_machine_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    body = _body(event)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if event["type"] is None:
        runtime.relisted(api.LIBVIRT_MACHINES)
    if not runtime.deps.kube.cache.apply(api.LIBVIRT_MACHINES, event["type"], body):
        return  # the echo of our own write
    if event["type"] == "DELETED":
        moved = machine_reconcile.DELETE_FOR_MOVE_ANNOTATION in (body["metadata"].get("annotations") or {})
        if moved:
            runtime.deps.moved_away.update(orphans.moved_away_keys(body))  # lives on in the move target: not an orphan
        runtime.machines.forget(key)
        runtime.deps.observe.machine_gone(*key)
        if not moved and machine_reconcile.recorded_host(body) is not None:
            runtime.wake_unplaced_soon()  # its room on its host is free: placement stopped counting it just now
    else:
        runtime.machines.add(key)


@kopf.on.event(meta.CAPI_GROUP, meta.CAPI_VERSION, "machines")
async def owner_machine_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    body = _body(event)
    ref = (body.get("spec") or {}).get("infrastructureRef") or {}
    if event["type"] is None:
        runtime.relisted(api.MACHINES)
    if runtime.deps.kube.cache.apply(api.MACHINES, event["type"], body) and \
            ref.get("kind") == kinds.LIBVIRT_MACHINE.kind and ref.get("name"):
        runtime.machines.add((body["metadata"]["namespace"], ref["name"]))


@kopf.on.event(meta.CAPI_GROUP, meta.CAPI_VERSION, "clusters")
async def cluster_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    body = _body(event)
    if event["type"] is None:
        runtime.relisted(api.CLUSTERS)
    if runtime.deps.kube.cache.apply(api.CLUSTERS, event["type"], body):
        runtime.wake_cluster(body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.event(ipam.GROUP, ipam.VERSION, ipam.CLAIMS)
async def ip_address_claim_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A claim an IPAM provider answered (or found its pool exhausted): its LibvirtMachine looks again now."""
    runtime: Runtime = memo.runtime
    body = _body(event)
    for owner in body["metadata"].get("ownerReferences") or []:
        if owner.get("kind") == kinds.LIBVIRT_MACHINE.kind and owner.get("apiVersion") == meta.API_VERSION:
            runtime.machines.add((body["metadata"]["namespace"], owner["name"]))


# -- LibvirtCluster -----------------------------------------------------------------------------------------------

# The two ignores below: kopf types `namespace` as str | None for any resource; LibvirtClusters are namespaced.
def _watched(labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> bool:
    """kopf's `when` filter for --watch-filter (memo.config is set before kopf starts)."""
    config: operator_config.OperatorConfig | None = memo.get("config")
    return operator_config.watched(dict(labels), config.watch_filter if config is not None else None)


@kopf.daemon(meta.GROUP, meta.VERSION, CLUSTERS, cancellation_timeout=30, when=_watched)  # type: ignore[arg-type]
async def run_cluster(namespace: str, name: str, labels: kopf.Labels, memo: kopf.Memo,
                      stopped: kopf.DaemonStopped, **_: Any) -> None:
    async def one_pass() -> float | None:
        with metrics.reconcile_pass(kinds.LIBVIRT_CLUSTER.kind):
            return await cluster_reconcile.reconcile(memo.runtime.deps, namespace, name)
    await _run_loop(memo.runtime, ("cluster", namespace, name), labels.get(meta.CLUSTER_NAME_LABEL), one_pass, stopped)


async def _run_loop(runtime: Runtime, key: tuple[str, str, str], cluster: str | None,
                    one_pass: Callable[[], Awaitable[float | None]],
                    stopped: kopf.DaemonStopped) -> None:
    """Pass after pass until the object goes: each sleeps for what the last asked, or until a watch wakes it."""
    waker = runtime.wakers[key]
    runtime.clusters[key] = cluster
    try:
        while not stopped:
            waker.clear()  # before the pass: a wake-up during the pass triggers another one
            async with runtime.locks[key]:
                delay = await one_pass()
            await _sleep_until_woken(waker, stopped, delay)
    finally:
        runtime.wakers.pop(key, None)
        runtime.clusters.pop(key, None)


async def _sleep_until_woken(waker: asyncio.Event, stopped: kopf.DaemonStopped, delay: float | None) -> None:
    loop = asyncio.get_running_loop()
    deadline = None if delay is None else loop.time() + delay
    while not stopped and not waker.is_set() and (deadline is None or loop.time() < deadline):
        try:
            await asyncio.wait_for(waker.wait(), timeout=1.0)  # 1 s granularity to notice `stopped`
        except TimeoutError:
            pass


@kopf.on.update(meta.GROUP, meta.VERSION, CLUSTERS, when=_watched)  # type: ignore[arg-type]  # see run_cluster
async def libvirt_cluster_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wake("cluster", namespace, name)


# -- LibvirtHost: the inventory ----------------------------------------------------------------------------------

@kopf.on.resume(meta.GROUP, meta.VERSION, HOSTS)
@kopf.on.create(meta.GROUP, meta.VERSION, HOSTS)
@kopf.on.update(meta.GROUP, meta.VERSION, HOSTS, field="spec")
async def host_changed(name: str, spec: kopf.Spec, memo: kopf.Memo, **_: Any) -> None:
    try:
        with metrics.reconcile_pass(kinds.LIBVIRT_HOST.kind):
            await hosts_reconcile.upsert_host(memo.runtime.deps, name, dict(spec))
    except machine_reconcile.Wait as wait:
        raise kopf.TemporaryError(wait.message, delay=wait.retry_after or 30) from None


@kopf.on.delete(meta.GROUP, meta.VERSION, HOSTS)
async def host_deleted(name: str, memo: kopf.Memo, **_: Any) -> None:
    """Behind the finalizer: the host leaves the inventory only once no machine is placed on it."""
    try:
        with metrics.reconcile_pass(kinds.LIBVIRT_HOST.kind, "delete"):
            await hosts_reconcile.remove_host(memo.runtime.deps, name)
    except machine_reconcile.Wait as wait:
        raise kopf.TemporaryError(wait.message, delay=wait.retry_after or 30) from None


# -- LibvirtMachineTemplate -------------------------------------------------------------------------------------

@kopf.on.event(meta.GROUP, meta.VERSION, kinds.LIBVIRT_MACHINE_TEMPLATE.plural)
def reconcile_machine_template(event: kopf.RawEvent, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Keep status.capacity and status.nodeInfo in step with the template, for scale-from-zero, and say when its spec
    was edited in place (the EditedInPlace condition and a warning log line: such an edit rolls no machine).

    Level-triggered on every event, not on kopf's create/resume/update: a copy clusterctl move makes carries kopf's
    diff-base annotation of the source, so kopf would take it for handled and never run a create handler, and the copy
    arrives without status. Writes only what differs, so its own status write ends the loop."""
    body = event["object"]
    if event["type"] == "DELETED" or body["metadata"].get("deletionTimestamp"):
        return
    if not operator_config.watched(body["metadata"].get("labels"), memo.config.watch_filter):
        return
    try:
        template = v1alpha1.LibvirtMachineTemplateSpec.model_validate(body.get("spec") or {})
    except ValueError as error:
        log.warning("LibvirtMachineTemplate %s/%s: invalid template spec: %s", body["metadata"].get("namespace"),
                    body["metadata"].get("name"), error)
        return
    found = body["metadata"].get("generation")
    generation = found if isinstance(found, int) else 1
    changed = capacity.template_status_update(template, body.get("status"), generation, machine_reconcile.utc_now())
    if changed and "conditions" in changed:
        log.warning("LibvirtMachineTemplate %s/%s: %s", body["metadata"].get("namespace"), body["metadata"].get("name"),
                    v1alpha1.template_edited_message(generation))
    for key, value in (changed or {}).items():
        patch.status[key] = value
