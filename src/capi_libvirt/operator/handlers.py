"""kopf handlers: each turns an event into a call of one reconcile. No logic lives here.

A LibvirtMachine is driven by one daemon per object that runs `reconcile.machine.reconcile` in a loop: after each
pass it sleeps for what the pass asked, or until a watch on its Machine, its Cluster, a bootstrap Secret or the
object itself wakes it. Deletion runs `reconcile.machine.delete` behind kopf's finalizer.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import kopf

from capi_libvirt.api import kinds, meta, v1alpha1
from capi_libvirt.core import capacity
from capi_libvirt.hypervisor import connection
from capi_libvirt.kube import api
from capi_libvirt.operator import config as operator_config
from capi_libvirt.reconcile import machine as machine_reconcile

log = logging.getLogger(__name__)
MACHINES = kinds.LIBVIRT_MACHINE.plural
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"


class Runtime:
    """What handlers share for the operator's life: the reconcile dependencies, wake-up events and locks."""

    def __init__(self, deps: machine_reconcile.Dependencies) -> None:
        self.deps = deps
        self.wakers: dict[tuple[str, str], asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.locks: dict[tuple[str, str], asyncio.Lock] = collections.defaultdict(asyncio.Lock)

    def wake(self, namespace: str, name: str | None = None) -> None:
        """Wake one machine, or every machine of a namespace."""
        for key, event in list(self.wakers.items()):
            if key[0] == namespace and (name is None or key[1] == name):
                event.set()


def _post_event(body: dict, kind: str, reason: str, message: str) -> None:
    kopf.event(body, type=kind, reason=reason, message=message)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{meta.GROUP}/libvirt"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="capi-libvirt.x-k8s.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="capi-libvirt.x-k8s.io")
    settings.posting.level = logging.WARNING  # kopf's own log lines; the reconciles post their events themselves
    cfg: operator_config.OperatorConfig = memo.get("config") or operator_config.from_environment()
    hosts = connection.HostRegistry(cfg.hosts)
    kube = api.KubeAPI(await api.new_api_client())
    memo.runtime = Runtime(machine_reconcile.Dependencies(kube=kube, hosts=hosts, post_event=_post_event,
                                                          after_phase=cfg.after_phase))
    log.info("managing libvirt hosts: %s", ", ".join(hosts.names()) or "(none configured)")


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None:
        runtime.deps.hosts.close()
        await runtime.deps.kube.client.close()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_kubeconfig(**kwargs) or kopf.login_with_service_account(**kwargs)


# -- LibvirtMachine ---------------------------------------------------------------------------------------------

@kopf.daemon(meta.GROUP, meta.VERSION, MACHINES, cancellation_timeout=30)
async def run_machine(namespace: str, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    key = (namespace, name)
    waker = runtime.wakers[key]
    try:
        while not stopped:
            waker.clear()  # before the pass: a wake-up during the pass triggers another one
            async with runtime.locks[key]:
                delay = await machine_reconcile.reconcile(runtime.deps, namespace, name)
            await _sleep_until_woken(waker, stopped, delay)
    finally:
        runtime.wakers.pop(key, None)


async def _sleep_until_woken(waker: asyncio.Event, stopped: kopf.DaemonStopped, delay: float | None) -> None:
    loop = asyncio.get_running_loop()
    deadline = None if delay is None else loop.time() + delay
    while not stopped and not waker.is_set() and (deadline is None or loop.time() < deadline):
        try:
            await asyncio.wait_for(waker.wait(), timeout=1.0)  # 1 s granularity to notice `stopped`
        except asyncio.TimeoutError:
            pass


@kopf.on.delete(meta.GROUP, meta.VERSION, MACHINES)
async def delete_machine(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    async with runtime.locks[(namespace, name)]:
        try:
            await machine_reconcile.delete(runtime.deps, dict(body))
        except machine_reconcile.Wait as wait:
            raise kopf.TemporaryError(wait.message, delay=wait.retry_after or 30) from None
    runtime.locks.pop((namespace, name), None)


@kopf.on.update(meta.GROUP, meta.VERSION, MACHINES)
def machine_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wake(namespace, name)


# -- what a machine waits for: its Machine, its Cluster, bootstrap Secrets ------------------------------------

@kopf.on.event("cluster.x-k8s.io", "v1beta2", "machines")
def owner_machine_changed(namespace: str, spec: kopf.Spec, memo: kopf.Memo, **_: Any) -> None:
    ref = spec.get("infrastructureRef") or {}
    if ref.get("kind") == kinds.LIBVIRT_MACHINE.kind and ref.get("name"):
        memo.runtime.wake(namespace, ref["name"])


@kopf.on.event("cluster.x-k8s.io", "v1beta2", "clusters")
def cluster_changed(namespace: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wake(namespace)


@kopf.on.event("", "v1", "secrets", labels={CLUSTER_NAME_LABEL: kopf.PRESENT})
def bootstrap_secret_changed(namespace: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wake(namespace)


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
