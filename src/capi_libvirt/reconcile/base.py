"""The floor every reconcile stands on: what a reconcile talks to (`Dependencies`), how a phase says it cannot go on
(`Wait`) and how often it is retried (`with_backoff`), what a reconcile reports for the metrics (`Observer`), and the
facts the machine, cluster and host reconciles share (a paused object, a namespace whose Secrets are not readable).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from capi_libvirt.api import meta, reasons
from capi_libvirt.core import capi_objects, outage, placement
from capi_libvirt.hypervisor import errors
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.kube import api
from capi_libvirt.reconcile import images as images_
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile import placed as placed_
from capi_libvirt.reconcile.waiting import RECHECK_WAITING, Wait

__all__ = ["RECHECK_WAITING", "Wait"]  # (what every reconcile shares; defined on the floor below)


BACKOFF_FIRST, BACKOFF_MAX = 5.0, 300.0
ORPHAN_GRACE_S = 3600.0  # default: an orphan is removed an hour after it was first seen (operator config)


EventSink = Callable[[dict[str, Any], str, str, str], Awaitable[None] | None]  # (body, type, reason, message)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Observer:
    """What a reconcile reports as it goes, for the operator's metrics (operator.metrics); by default nothing."""

    def phase(self, kind: str, phase: str) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()  # around one phase: its duration

    def machine_outcome(self, body: dict[str, Any], status: dict[str, Any], wait: Wait | None, paused: bool) -> None:
        """One pass's result, as `_write_status` writes it."""

    def machine_deleting(self, namespace: str, name: str, host: str | None) -> None:
        """A machine's teardown began."""

    def machine_gone(self, namespace: str, name: str) -> None:
        """A machine's finalizer was released."""

    def orphans_removed(self, host: str, domains: int, volumes: int) -> None:
        """The orphan collector removed domains and volumes from a host."""


@dataclasses.dataclass
class Dependencies:
    """What a reconcile talks to, passed in (never globals): the API, the hosts, the clock, the event sink."""

    kube: api.KubeAPI
    inventory: inventory_.Inventory
    post_event: EventSink
    now: Callable[[], str] = utc_now
    observe: Observer = dataclasses.field(default_factory=Observer)  # metrics: phase durations, pass outcomes
    failures: dict[tuple[str, ...], int] = dataclasses.field(default_factory=dict)  # per machine, for backoff
    placement_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # one placement at a time
    # Every machine's host and claim, kept by difference from the cache (placement and the address checks read it).
    placed: placed_.PlacedMachines = dataclasses.field(default_factory=placed_.PlacedMachines)
    creates_per_host: int = placement.DEFAULT_CREATES_PER_HOST
    creation_slots: dict[str, asyncio.Semaphore] = dataclasses.field(default_factory=dict)
    replace_after_s: float = outage.DEFAULT_REPLACE_AFTER_S  # an unreachable host's never-defined machines move then
    probe_interval_s: float = inventory_.PROBE_INTERVAL_S
    # Queue the machines on a host, their backoff cleared: it entered the inventory (a copy clusterctl move made), went
    # down, came back, or was decommissioned.
    wake_host: Callable[[str], None] = lambda host: None
    wake_unplaced: Callable[[], None] = lambda: None  # a host gained room: machines waiting for one decide again
    # Queue these machines ((namespace, name)) now: the host's probe saw their domains change.
    wake_machines: Callable[[Iterable[tuple[str, str]]], None] = lambda keys: None
    provider_namespace: str = meta.PROVIDER_NAMESPACE  # where host credentials live, and the ServiceAccount
    # This management cluster's identity, written into every domain's owner metadata (None: unknown, so no domain is
    # ever provably ours to collect), and the orphan collector's grace period (None: report only, never remove).
    management_cluster: str | None = None
    orphan_grace_s: float | None = ORPHAN_GRACE_S
    moved_away: set[str] = dataclasses.field(default_factory=set)  # identities deleted here by clusterctl move
    images: images_.ImageImports = dataclasses.field(default_factory=images_.ImageImports)  # imports from a URL

    def creation_slot(self, host: str) -> asyncio.Semaphore:
        """Held while a machine's overlay, ISO and domain are made on `host`."""
        return self.creation_slots.setdefault(host, asyncio.Semaphore(self.creates_per_host))

    @property
    def hosts(self) -> host_api.HostRegistry:
        return self.inventory.registry


class Paused(Exception):
    """The cluster or the machine is paused: do nothing until a watch says otherwise."""


def is_paused(body: dict[str, Any], cluster: capi_objects.ClusterView | None) -> bool:
    """Cluster API's pause: the Cluster's spec.paused, or the object's paused annotation."""
    return (cluster is not None and cluster.paused) or meta.PAUSED_ANNOTATION in (body["metadata"].get("annotations") or {})


def secrets_forbidden_message(namespace: str, provider_namespace: str) -> str:
    """What to bind when the API refuses the provider a Secret of `namespace` (HTTP 403)."""
    return (f"the provider may not read Secrets in namespace {namespace}: bind ClusterRole "
            f"{meta.SECRETS_CLUSTER_ROLE} to ServiceAccount {provider_namespace}/{meta.PROVIDER_SERVICE_ACCOUNT} "
            f"with a RoleBinding in namespace {namespace} (the cluster templates include one)")


def with_backoff(deps: Dependencies, key: tuple[str, ...], wait: Wait) -> Wait:
    attempts = deps.failures.get(key, 0)
    deps.failures[key] = attempts + 1
    wait.retry_after = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempts)
    return wait


def wait_for_hypervisor(error: errors.HypervisorError) -> Wait:
    if isinstance(error, errors.HostUnreachable):
        return Wait(reasons.HOST_UNREACHABLE, str(error), failure=True)
    if isinstance(error, errors.PoolNotFound):
        return Wait(reasons.POOL_NOT_FOUND, str(error), failure=True)
    return Wait(reasons.HYPERVISOR_ERROR, str(error), failure=True)
