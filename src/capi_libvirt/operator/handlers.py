"""kopf handlers: each turns an event into a call of one reconcile. No logic lives here.

A LibvirtMachine is driven by one daemon per object that runs `reconcile.machine.reconcile` in a loop: after each
pass it sleeps for what the pass asked, or until a watch on its Machine, its Cluster or the object itself wakes it.
(Bootstrap Secrets are not watched: Cluster API sets Machine.spec.bootstrap.dataSecretName once the Secret exists,
and that Machine change wakes the machine; reading every Secret of the cluster is not worth that privilege.)
Deletion runs `reconcile.machine.delete` behind kopf's finalizer, under the same per-object lock as the passes.
Every reconcile is measured (operator.metrics); the host prober runs only while this replica leads (or runs
standalone): kopf pauses the handlers of a standby replica, but not a task of our own.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import kopf

from capi_libvirt.api import kinds, meta, v1alpha1
from capi_libvirt.core import capacity
from capi_libvirt.hypervisor import connection, credentials
from capi_libvirt.kube import api
from capi_libvirt.operator import config as operator_config
from capi_libvirt.operator import election, metrics
from capi_libvirt.reconcile import cluster as cluster_reconcile
from capi_libvirt.reconcile import hosts as hosts_reconcile
from capi_libvirt.reconcile import inventory
from capi_libvirt.reconcile import machine as machine_reconcile

log = logging.getLogger(__name__)
MACHINES = kinds.LIBVIRT_MACHINE.plural
CLUSTERS = kinds.LIBVIRT_CLUSTER.plural
HOSTS = kinds.LIBVIRT_HOST.plural
EXIT_TIMEOUT_S = 50  # SIGKILL after this long exiting (kopf's ultimate exit); below the Deployment's grace period


class Runtime:
    """What handlers share for the operator's life: the reconcile dependencies, wake-up events and locks."""

    def __init__(self, deps: machine_reconcile.Dependencies) -> None:
        self.deps = deps
        # Keyed by (kind, namespace, name), kind being "machine" or "cluster".
        self.wakers: dict[tuple[str, str, str], asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.locks: dict[tuple[str, str, str], asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self.clusters: dict[tuple[str, str, str], str | None] = {}  # object -> its cluster, to wake a cluster's objects
        self.prober: asyncio.Task | None = None
        self.election: asyncio.Task | None = None
        self.metrics: metrics.Source | None = None

    def wake(self, kind: str, namespace: str, name: str) -> None:
        event = self.wakers.get((kind, namespace, name))
        if event is not None:
            event.set()

    def wake_cluster(self, namespace: str, cluster: str) -> None:
        for key, object_cluster in list(self.clusters.items()):
            if key[1] == namespace and object_cluster == cluster:
                self.wake(*key)


def _post_event(body: dict, kind: str, reason: str, message: str) -> None:
    kopf.event(body, type=kind, reason=reason, message=message)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    _configure_kopf(settings)
    cfg: operator_config.OperatorConfig = memo.get("config") or operator_config.from_environment()
    credentials.sweep_leftovers()  # key files a crash in the middle of connecting may have left behind
    hosts = connection.HostRegistry(cfg.hosts)
    kube = api.KubeAPI(await api.new_api_client())
    deps = machine_reconcile.Dependencies(kube=kube, inventory=inventory.Inventory(hosts), post_event=_post_event,
                                          after_phase=cfg.after_phase, observe=metrics.Observer())
    memo.runtime = _start_runtime(deps, memo.setdefault("state", election.State(None)))
    log.info("static libvirt hosts: %s; LibvirtHost objects add more", ", ".join(hosts.names()) or "none")


def _configure_kopf(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = f"{meta.GROUP}/libvirt"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="capi-libvirt.x-k8s.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="capi-libvirt.x-k8s.io")
    settings.posting.level = logging.WARNING  # kopf's own log lines; the reconciles post their events themselves
    settings.peering.clusterwide = True  # one ClusterKopfPeering, also when watching namespaces (election.py)
    settings.process.ultimate_exiting_timeout = EXIT_TIMEOUT_S


def _start_runtime(deps: machine_reconcile.Dependencies, state: election.State) -> Runtime:
    """The shared state, its metrics, and the background tasks: the election observer and the host prober."""
    runtime = Runtime(deps)
    runtime.metrics = metrics.Source(deps.observe, deps.inventory, state)
    metrics.attach(runtime.metrics)
    if state.peering is not None:
        runtime.election = asyncio.create_task(election.observe(state, deps.kube.objects))
    runtime.prober = asyncio.create_task(_probe_while_active(deps, state))
    return runtime


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    if memo.get("state") is not None:
        memo.state.stopping()
    if runtime is not None:
        tasks = [task for task in (runtime.prober, runtime.election) if task is not None]
        for task in tasks:
            task.cancel()
        # Let a probe in flight end before its connection closes under it.
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics.detach(runtime.metrics)
        await asyncio.get_running_loop().run_in_executor(None, runtime.deps.hosts.close)  # libvirt close blocks
        await runtime.deps.kube.client.close()


async def _probe_while_active(deps: machine_reconcile.Dependencies, state: election.State) -> None:
    """The host prober, while this replica does the work: a standby would publish host status twice."""
    while True:
        await state.leading.wait()
        prober = asyncio.create_task(hosts_reconcile.probe_forever(deps))
        try:
            await state.not_leading.wait()
        finally:
            prober.cancel()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_kubeconfig(**kwargs) or kopf.login_with_service_account(**kwargs)


# -- LibvirtMachine ---------------------------------------------------------------------------------------------

@kopf.daemon(meta.GROUP, meta.VERSION, MACHINES, cancellation_timeout=30)
async def run_machine(namespace: str, name: str, labels: kopf.Labels, memo: kopf.Memo,
                      stopped: kopf.DaemonStopped, **_: Any) -> None:
    async def one_pass(cancelled: Any) -> float | None:
        with metrics.reconcile_pass(kinds.LIBVIRT_MACHINE.kind, count_success=False):  # the reconcile reports it
            return await machine_reconcile.reconcile(memo.runtime.deps, namespace, name, cancelled=cancelled)
    await _run_loop(memo.runtime, ("machine", namespace, name), labels.get(meta.CLUSTER_NAME_LABEL), one_pass, stopped)


@kopf.daemon(meta.GROUP, meta.VERSION, CLUSTERS, cancellation_timeout=30)
async def run_cluster(namespace: str, name: str, labels: kopf.Labels, memo: kopf.Memo,
                      stopped: kopf.DaemonStopped, **_: Any) -> None:
    async def one_pass(cancelled: Any) -> float | None:
        with metrics.reconcile_pass(kinds.LIBVIRT_CLUSTER.kind):
            return await cluster_reconcile.reconcile(memo.runtime.deps, namespace, name)
    await _run_loop(memo.runtime, ("cluster", namespace, name), labels.get(meta.CLUSTER_NAME_LABEL), one_pass, stopped)


async def _run_loop(runtime: Runtime, key: tuple[str, str, str], cluster: str | None, one_pass: Any,
                    stopped: kopf.DaemonStopped) -> None:
    """Pass after pass until the object goes: each sleeps for what the last asked, or until a watch wakes it."""
    waker = runtime.wakers[key]
    runtime.clusters[key] = cluster
    try:
        while not stopped:
            waker.clear()  # before the pass: a wake-up during the pass triggers another one
            async with runtime.locks[key]:
                delay = await one_pass(lambda: bool(stopped))
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
        except asyncio.TimeoutError:
            pass


@kopf.on.delete(meta.GROUP, meta.VERSION, MACHINES)
async def delete_machine(namespace: str, name: str, status: kopf.Status, memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    runtime.deps.observe.machine_deleting(namespace, name, status.get("host"))
    async with runtime.locks[("machine", namespace, name)]:
        try:
            with metrics.reconcile_pass(kinds.LIBVIRT_MACHINE.kind, "delete"):
                await machine_reconcile.delete(runtime.deps, namespace, name)
        except machine_reconcile.Wait as wait:
            raise kopf.TemporaryError(wait.message, delay=wait.retry_after or 30) from None
    runtime.locks.pop(("machine", namespace, name), None)
    runtime.deps.observe.machine_gone(namespace, name)


@kopf.on.update(meta.GROUP, meta.VERSION, MACHINES)
def machine_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wake("machine", namespace, name)


@kopf.on.update(meta.GROUP, meta.VERSION, CLUSTERS)
def libvirt_cluster_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wake("cluster", namespace, name)


# -- what a machine waits for: its Machine and its Cluster ----------------------------------------------------

@kopf.on.event(meta.CAPI_GROUP, meta.CAPI_VERSION, "machines")
def owner_machine_changed(namespace: str, spec: kopf.Spec, memo: kopf.Memo, **_: Any) -> None:
    ref = spec.get("infrastructureRef") or {}
    if ref.get("kind") == kinds.LIBVIRT_MACHINE.kind and ref.get("name"):
        memo.runtime.wake("machine", namespace, ref["name"])


@kopf.on.event(meta.CAPI_GROUP, meta.CAPI_VERSION, "clusters")
def cluster_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wake_cluster(namespace, name)


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

@kopf.on.resume(meta.GROUP, meta.VERSION, kinds.LIBVIRT_MACHINE_TEMPLATE.plural)
@kopf.on.create(meta.GROUP, meta.VERSION, kinds.LIBVIRT_MACHINE_TEMPLATE.plural)
@kopf.on.update(meta.GROUP, meta.VERSION, kinds.LIBVIRT_MACHINE_TEMPLATE.plural, field="spec")
def reconcile_machine_template(spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    """Keep status.capacity and status.nodeInfo in step with the template, for scale-from-zero."""
    try:
        template = v1alpha1.LibvirtMachineTemplateSpec.model_validate(dict(spec))
    except ValueError as error:
        raise kopf.PermanentError(f"invalid template spec: {error}") from None
    machine = template.template.spec
    patch.status["capacity"] = capacity.template_capacity(machine)
    patch.status["nodeInfo"] = capacity.template_node_info(machine)
