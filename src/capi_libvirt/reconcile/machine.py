"""The LibvirtMachine reconcile: from bootstrap data to a running domain, and back to nothing.

`reconcile` is level-triggered and idempotent: it reads the object (from the watch-fed cache, see kube.api), runs the
phases in order, and each phase either moves on or raises `Wait` with the reason that becomes the Provisioned
condition's. Every host operation is idempotent and keyed by names and a domain UUID fixed before anything is created
(core.naming), so a retry, a duplicate event or a restart in the middle converges on the same single domain.

Placement is one write: the finalizer, spec.providerID (which names the host and the domain UUID) and the identity
annotation (the UID every name derives from, which a copy made by clusterctl move keeps) together, before anything is
made on the host. A copy arriving with a providerID is adopted (its status rebuilt from the host), never placed again;
one deleted by clusterctl move (delete-for-move) releases its finalizer without touching the host. The status follows in one write at the end of each pass that changed it. Deletion
(`delete`, once the object has a deletionTimestamp) tears everything down, "not found" counting as done, and then
releases the finalizer; an unreachable host keeps it, with a condition saying why. Creation on a host is limited to
`Dependencies.creates_per_host` machines at a time, so a burst cannot swamp one hypervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import logging
import posixpath
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic

from capi_libvirt.api import meta, reasons, v1alpha1
from capi_libvirt.core import (
    address_conflicts,
    cloud_init,
    conditions,
    domain_xml,
    ipam,
    machine_addresses,
    naming,
    nocloud,
    outage,
    placement,
    provider_id,
    tenancy,
    traffic_filter,
)
from capi_libvirt.hypervisor import connection, errors, host_domains, machines, networks, traffic_filters
from capi_libvirt.kube import api
from capi_libvirt.reconcile import images as images_
from capi_libvirt.reconcile import inventory as inventory_

log = logging.getLogger(__name__)

WAITING_FOR_OWNER = reasons.WAITING_FOR_OWNER
INVALID_SPEC = reasons.INVALID_SPEC
NETWORK_NOT_FOUND = reasons.NETWORK_NOT_FOUND
RECONCILE_ERROR = reasons.RECONCILE_ERROR
ADOPTION_REFUSED = reasons.ADOPTION_REFUSED
TENANT_NOT_ALLOWED = tenancy.TENANT_NOT_ALLOWED
SECRETS_FORBIDDEN = reasons.SECRETS_FORBIDDEN
DELETED_FOR_MOVE = reasons.DELETED_FOR_MOVE
REPLACED = reasons.REPLACED
DOMAIN_HOST_MISMATCH = reasons.DOMAIN_HOST_MISMATCH
NOCLOUD_ISO_REMOVED = reasons.NOCLOUD_ISO_REMOVED
NOCLOUD_ISO_NOT_REMOVED = reasons.NOCLOUD_ISO_NOT_REMOVED
IGNITION_CONFIG_REMOVED = reasons.IGNITION_CONFIG_REMOVED
IGNITION_CONFIG_NOT_REMOVED = reasons.IGNITION_CONFIG_NOT_REMOVED
IPAM_FORBIDDEN = reasons.IPAM_FORBIDDEN
CPU_MODEL_NOT_SUPPORTED = reasons.CPU_MODEL_NOT_SUPPORTED
MACHINE_TYPE_NOT_SUPPORTED = reasons.MACHINE_TYPE_NOT_SUPPORTED
TRAFFIC_FILTER_NOT_FOUND = reasons.TRAFFIC_FILTER_NOT_FOUND
TRAFFIC_FILTER_PINNED = reasons.TRAFFIC_FILTER_PINNED
TRAFFIC_FILTER_NOT_PINNED = reasons.TRAFFIC_FILTER_NOT_PINNED
BOOTSTRAP_FORMATS = ("cloud-config", "ignition")  # cloud-config on a NoCloud ISO; ignition through fw_cfg

# clusterctl move puts this on every source object just before deleting it: the object goes, its machine does not.
DELETE_FOR_MOVE_ANNOTATION = "clusterctl.cluster.x-k8s.io/delete-for-move"
IDENTITY_ANNOTATION = naming.IDENTITY_ANNOTATION
# Where a domain of the machine may have been defined (core.outage): "" from placement, the host's name from just
# before the first define. Only a machine with "" is ever placed on another host.
DOMAIN_RECORD_ANNOTATION = f"{meta.GROUP}/libvirt-domain-defined-on"
# Hosts a machine was moved away from while they were unreachable, whose volumes of it are removed once they answer.
FORMER_HOSTS_ANNOTATION = f"{meta.GROUP}/libvirt-former-hosts"

# Conditions a machine's Ready does not summarise: Paused (Cluster API reports it on its own) and AddressesDiscovered
# (informational: a lease or an agent that flaps while the last known address stands never makes a machine unready).
READY_IGNORES = (conditions.PAUSED, conditions.ADDRESSES_DISCOVERED)

# Seconds until the next pass. Watches on Machines, Clusters and Secrets wake a waiting machine sooner.
RECHECK_WAITING = 30.0
RECHECK_BOOTSTRAP = 10.0  # a missing bootstrap Secret: the Machine watch usually wakes us first
RECHECK_ADDRESS = 2.0  # no libvirt event says a lease was given: look again soon (one cheap call)
RECHECK_PROVISIONED = 60.0
RECHECK_IPAM = 3.0  # an IPAM provider answers a claim in about a second; claim events wake the machine sooner
BACKOFF_FIRST, BACKOFF_MAX = 5.0, 300.0
ORPHAN_GRACE_S = 3600.0  # default: an orphan is removed an hour after it was first seen (operator config)

# Cluster API's naming of an infrastructure machine's finalizer. Not kopf's (infrastructure.cluster.x-k8s.io/libvirt,
# on LibvirtHosts and LibvirtClusters): kopf removes its own from objects none of its handlers needs it on.
FINALIZER = f"libvirtmachine.{meta.GROUP}"

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
    creates_per_host: int = placement.DEFAULT_CREATES_PER_HOST
    creation_slots: dict[str, asyncio.Semaphore] = dataclasses.field(default_factory=dict)
    replace_after_s: float = outage.DEFAULT_REPLACE_AFTER_S  # an unreachable host's never-defined machines move then
    probe_interval_s: float = inventory_.PROBE_INTERVAL_S
    # Queue the machines on a host, their backoff cleared: it entered the inventory (a copy clusterctl move made), went
    # down, came back, or was decommissioned.
    wake_host: Callable[[str], None] = lambda host: None
    wake_unplaced: Callable[[], None] = lambda: None  # a host gained room: machines waiting for one decide again
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
    def hosts(self) -> connection.HostRegistry:
        return self.inventory.registry


class Wait(Exception):
    """A phase cannot go on: `reason`/`message` go into the Provisioned condition; retry after `retry_after` s."""

    def __init__(self, reason: str, message: str, retry_after: float | None = RECHECK_WAITING, *,
                 failure: bool = False) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry_after, self.failure = reason, message, retry_after, failure


class Paused(Exception):
    """The cluster or the machine is paused: do nothing until a watch says otherwise."""


@dataclasses.dataclass
class MachinePass:
    """What one pass learns as it goes, phase by phase."""

    body: dict[str, Any]
    spec: v1alpha1.LibvirtMachineSpec
    status: dict[str, Any]
    machine: dict[str, Any] | None = None
    cluster: dict[str, Any] | None = None
    bootstrap: api.BootstrapData | None = None
    host: str | None = None
    domain: machines.DomainInfo | None = None
    # Interface index -> its addresses, known before the guest boots (its `static`, or an IP pool's allocation).
    addressing: dict[int, v1alpha1.StaticAddressing] = dataclasses.field(default_factory=dict)
    # The base image volume in the image pool: spec.image.volume, or the imported image of spec.image.url.
    image_volume: str | None = None
    # What the host says of the networks and bridges the machine joins (before its domain exists).
    segments: dict[address_conflicts.Segment, address_conflicts.SegmentFacts] | None = None

    @property
    def namespace(self) -> str:
        namespace: str = self.body["metadata"]["namespace"]
        return namespace

    @property
    def name(self) -> str:
        name: str = self.body["metadata"]["name"]
        return name

    @property
    def uid(self) -> str:
        """The machine's identity (naming.identity_uid): the UID it was placed with, which a moved copy keeps."""
        return naming.identity_uid(self.body)

    @property
    def domain_uuid(self) -> str:
        return naming.domain_uuid(self.uid)

    @property
    def domain_name(self) -> str:
        return naming.domain_name(self.namespace, self.name, self.uid)

    def volumes(self) -> machines.MachineVolumes:
        return machine_volumes(self.namespace, self.name, self.uid, self.spec.storage_pool, len(self.spec.data_disks))


def machine_volumes(namespace: str, name: str, uid: str, pool: str, data_disks: int = 0) -> machines.MachineVolumes:
    """The names of the machine's volumes: the Ignition config's always (the bootstrap format is the Secret's, not the
    spec's: teardown looks for both kinds of seed), and `data_disks` data disks."""
    return machines.MachineVolumes(
        pool=pool,
        overlay=naming.overlay_volume_name(namespace, name, uid),
        nocloud=naming.nocloud_volume_name(namespace, name, uid),
        serial_log=naming.serial_log_file_name(namespace, name, uid),
        ignition=naming.ignition_volume_name(namespace, name, uid),
        data_disks=tuple(naming.data_disk_volume_name(namespace, name, uid, index) for index in range(data_disks)),
    )


# -- the phases, in order -----------------------------------------------------------------------------------------

async def find_owner_machine(deps: Dependencies, p: MachinePass) -> None:
    refs = [ref for ref in p.body["metadata"].get("ownerReferences", [])
            if ref.get("kind") == "Machine" and ref.get("apiVersion", "").startswith("cluster.x-k8s.io/")]
    if not refs:
        raise Wait(WAITING_FOR_OWNER, "waiting for Cluster API to set the owner Machine")
    p.machine = await deps.kube.get_machine(p.namespace, refs[0]["name"])
    if p.machine is None:
        raise Wait(WAITING_FOR_OWNER, f"owner Machine {refs[0]['name']} not found")


async def find_cluster(deps: Dependencies, p: MachinePass) -> None:
    cluster_name = p.body["metadata"].get("labels", {}).get(meta.CLUSTER_NAME_LABEL) or \
        (p.machine or {}).get("spec", {}).get("clusterName")
    if not cluster_name:
        raise Wait(WAITING_FOR_OWNER, f"waiting for the {meta.CLUSTER_NAME_LABEL} label")
    p.cluster = await deps.kube.get_cluster(p.namespace, cluster_name)
    if p.cluster is None:
        raise Wait(WAITING_FOR_OWNER, f"Cluster {cluster_name} not found")


def is_paused(body: dict[str, Any], cluster: dict[str, Any] | None) -> bool:
    return bool((cluster or {}).get("spec", {}).get("paused")) or \
        meta.PAUSED_ANNOTATION in (body["metadata"].get("annotations") or {})


async def honour_pause(deps: Dependencies, p: MachinePass) -> None:
    paused = is_paused(p.body, p.cluster)
    p.status["conditions"] = conditions.set_condition(
        p.status.get("conditions"), conditions.PAUSED, "True" if paused else "False",
        reasons.PAUSED_REASON if paused else reasons.NOT_PAUSED, "reconciliation is paused" if paused else "",
        now=deps.now(), observed_generation=p.body["metadata"].get("generation"))
    if paused:
        raise Paused()


async def wait_for_cluster_infrastructure(deps: Dependencies, p: MachinePass) -> None:
    status = (p.cluster or {}).get("status", {})
    if not (status.get("initialization", {}).get("infrastructureProvisioned") or status.get("infrastructureReady")):
        raise Wait(reasons.WAITING_FOR_CLUSTER_INFRASTRUCTURE, "the Cluster's infrastructure is not provisioned yet")


async def read_bootstrap_data(deps: Dependencies, p: MachinePass) -> None:
    """Before placement: nothing is placed for a machine whose data is missing or unusable. Once placed, the Secret
    is read again only if the domain must still be made (ensure_domain), not on every pass."""
    if recorded_host(p.body) is None:
        await _fetch_bootstrap_data(deps, p)


async def _fetch_bootstrap_data(deps: Dependencies, p: MachinePass) -> None:
    secret_name = (p.machine or {}).get("spec", {}).get("bootstrap", {}).get("dataSecretName")
    if not secret_name:
        raise Wait(reasons.WAITING_FOR_BOOTSTRAP_DATA, "waiting for the Machine's bootstrap.dataSecretName")
    try:
        p.bootstrap = await deps.kube.get_bootstrap_data(p.namespace, secret_name)
    except api.Forbidden:
        raise Wait(SECRETS_FORBIDDEN, secrets_forbidden_message(p.namespace, deps.provider_namespace),
                   failure=True) from None
    if p.bootstrap is None:
        raise Wait(reasons.WAITING_FOR_BOOTSTRAP_DATA, f"bootstrap Secret {secret_name} not found", RECHECK_BOOTSTRAP)
    # Both refusals back off (a bootstrap provider may still rewrite the Secret, which is not watched); the format is
    # quoted cut short (it is not secret, but it is anyone's text), the data never.
    if p.bootstrap.format not in BOOTSTRAP_FORMATS:
        raise Wait(reasons.BOOTSTRAP_FORMAT_UNSUPPORTED,
                   f"bootstrap data format {p.bootstrap.format[:64]!r} is not supported; use cloud-config or ignition",
                   RECHECK_PROVISIONED, failure=True)
    if not p.bootstrap.value:
        raise Wait(reasons.BOOTSTRAP_DATA_MISSING, f"bootstrap Secret {secret_name} has no data under 'value'",
                   RECHECK_PROVISIONED, failure=True)


def secrets_forbidden_message(namespace: str, provider_namespace: str) -> str:
    """What to bind when the API refuses the provider a Secret of `namespace` (HTTP 403)."""
    return (f"the provider may not read Secrets in namespace {namespace}: bind ClusterRole "
            f"{meta.SECRETS_CLUSTER_ROLE} to ServiceAccount {provider_namespace}/{meta.PROVIDER_SERVICE_ACCOUNT} "
            f"with a RoleBinding in namespace {namespace} (the cluster templates include one)")


GROUP_LABELS = ("cluster.x-k8s.io/deployment-name", "cluster.x-k8s.io/control-plane-name",
                "cluster.x-k8s.io/set-name")
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"


def placement_group(body: dict[str, Any]) -> tuple[str, str, str] | None:
    """The group a machine is spread with: its MachineDeployment, or its control plane, within its cluster."""
    labels = body["metadata"].get("labels") or {}
    for label in GROUP_LABELS:
        if labels.get(label):
            return body["metadata"]["namespace"], labels.get(meta.CLUSTER_NAME_LABEL, ""), f"{label}={labels[label]}"
    return None


def recorded_host(body: dict[str, Any]) -> str | None:
    """Where the machine was placed: placement's own record, written first (the providerID, when it names the domain
    of the machine's identity: also a moved copy's, which has no status), else its status (machines of a release that
    set the providerID last). The two agree but after a re-placement, which changes the providerID first."""
    recorded = (body.get("spec") or {}).get("providerID")
    if recorded and FINALIZER in (body["metadata"].get("finalizers") or []):
        try:
            parsed = provider_id.parse_provider_id(recorded)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.domain_uuid == naming.domain_uuid(naming.identity_uid(body)):
            return parsed.host  # ours, not one a spec made up
    host: str | None = (body.get("status") or {}).get("host")
    return host or None


def domain_record(body: dict[str, Any]) -> str | None:
    """DOMAIN_RECORD_ANNOTATION: "" (no define yet), a host (a define may have been sent there), None (unknown)."""
    record: str | None = (body["metadata"].get("annotations") or {}).get(DOMAIN_RECORD_ANNOTATION)
    return record


def former_hosts(body: dict[str, Any]) -> list[str]:
    value = (body["metadata"].get("annotations") or {}).get(FORMER_HOSTS_ANNOTATION) or ""
    return [host for host in value.split(",") if host]


async def choose_host(deps: Dependencies, p: MachinePass) -> None:
    """Place the machine (once): the finalizer and the providerID naming the host are written BEFORE anything is
    created, under one lock for all placements, so machines placed a moment ago count against their host and a burst
    spreads. Allocation is counted from the cache of every LibvirtMachine, not a LIST."""
    host = recorded_host(p.body)
    if host:
        record = domain_record(p.body)
        if record and record != host:  # someone changed the providerID's host under a defined domain: never follow
            raise Wait(DOMAIN_HOST_MISMATCH, f"spec.providerID names host {host}, but the domain was defined on host "
                       f"{record}; not defining another", failure=True)
        decision = outage.decide(host, record, deps.inventory.state(host), deps.replace_after_s,
                                 pinned=p.spec.host is not None)
        if isinstance(decision, outage.Replace):
            await _replace(deps, p, host, decision.message)
            return
        p.host = host
        p.status.update(host=host, domainUUID=p.domain_uuid)
        if isinstance(decision, outage.Hold):
            raise Wait(decision.reason, decision.message, decision.retry_after)
        deps.hosts.get(p.host)  # a host gone from the inventory raises HostUnreachable
        known = deps.inventory.hosts.get(host)
        if not p.status.get("failureDomain") and known is not None and known.spec.failure_domain:
            p.status["failureDomain"] = known.spec.failure_domain  # a moved copy comes without status
        await _keep_finalizer_and_identity(deps, p)
        return
    if (p.body.get("spec") or {}).get("providerID"):  # adopt_moved_machine found nothing to adopt: never re-place
        raise Wait(ADOPTION_REFUSED, f"spec.providerID {p.body['spec']['providerID']} names no domain of this machine;"
                   " not placing it again", failure=True)
    never_probed = [name for name, known in deps.inventory.hosts.items() if known.probe is None and not known.problem]
    if never_probed:  # just added (or the operator just started): look before deciding, outside the lock
        await asyncio.gather(*(deps.inventory.probe(name) for name in never_probed))
    async with deps.placement_lock:
        result = await _choose(deps, p)
        if isinstance(result, placement.NoHost):
            # A refusal waits for the host's admin (a LibvirtHost change wakes nothing here): looked at again slowly.
            raise Wait(result.reason, result.message, RECHECK_WAITING, failure=result.reason == TENANT_NOT_ALLOWED)
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, placement_patch(p.body, result.host))
        _placed_on(p, result)
    await _event(deps, p.body, "Normal", reasons.PLACED, f"placed on host {p.host}")


async def _choose(deps: Dependencies, p: MachinePass) -> placement.Placed | placement.NoHost:
    """Placement's decision for the machine, from the inventory and every other machine's record (under the lock)."""
    placed: list[tuple[str, str, dict[str, Any]]] = []
    group_per_host: dict[str, int] = {}
    group = placement_group(p.body)
    for other in await deps.kube.list_libvirt_machines():
        host = recorded_host(other)
        if not host or other["metadata"]["uid"] == p.body["metadata"]["uid"]:
            continue
        placed.append(_claim_of(host, other))
        if group is not None and placement_group(other) == group:
            group_per_host[host] = group_per_host.get(host, 0) + 1
    holding = inventory_.machine_holding(p.spec)
    request = placement.Request(cpus=p.spec.cpus, memory_mib=p.spec.memory_mib, pinned_host=p.spec.host,
                                failure_domain=(p.machine or {}).get("spec", {}).get("failureDomain"),
                                control_plane=CONTROL_PLANE_LABEL in (p.body["metadata"].get("labels") or {}),
                                pool=p.spec.storage_pool, disk_bytes=holding.disk_gib * placement.GIB)
    claims = placement.claims_by_host(placed)
    return placement.choose_host(request, deps.inventory.loads(claims, p.namespace, p.spec), group_per_host)


def _claim_of(host: str, body: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    return host, body["metadata"]["namespace"], body.get("spec") or {}


async def pool_room(deps: Dependencies, host: str, pool: str) -> int | None:
    """What placement may still promise in `pool` on `host` (every machine placed there counted), or None when the
    host's last probe did not see the pool."""
    claims = placement.claims_by_host(_claim_of(recorded, body) for body in await deps.kube.list_libvirt_machines()
                                      if (recorded := recorded_host(body)) == host)
    return deps.inventory.pool_room(host, pool, claims.get(host))


def _placed_on(p: MachinePass, result: placement.Placed) -> None:
    p.host = result.host
    p.status.update(host=result.host, domainUUID=p.domain_uuid)
    if result.failure_domain:
        p.status["failureDomain"] = result.failure_domain
    elif p.status.get("failureDomain"):  # re-placed from a host of another failure domain
        p.status["failureDomain"] = None


async def _replace(deps: Dependencies, p: MachinePass, old: str, why: str) -> None:
    """Place a machine that never had a domain on another host (core.outage decided it may move): one guarded write
    of the providerID's new host, the record still "never defined", and the old host among the former hosts, whose
    volumes of the machine (an overlay or ISO made before the outage) are removed once it answers."""
    async with deps.placement_lock:
        result = await _choose(deps, p)  # the old host is unreachable or decommissioned: never a candidate
        if isinstance(result, placement.NoHost) or result.host == old:
            message = result.message if isinstance(result, placement.NoHost) else f"only {old} fits"
            raise Wait(placement.HOST_UNREACHABLE, f"{why}; no other host: {message}", RECHECK_WAITING)
        formers = [host for host in former_hosts(p.body) if host not in (old, result.host)] + [old]
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {
            "metadata": {"annotations": {FORMER_HOSTS_ANNOTATION: ",".join(formers),
                                         DOMAIN_RECORD_ANNOTATION: outage.NEVER_DEFINED},
                         "resourceVersion": p.body["metadata"]["resourceVersion"]},
            "spec": {"providerID": provider_id.format_provider_id(result.host, p.domain_uuid)}})
        _placed_on(p, result)
    await _event(deps, p.body, "Warning", REPLACED, f"{why}: placed on host {p.host} instead")


async def clean_former_hosts(deps: Dependencies, p: MachinePass) -> None:
    """Remove what a re-placed machine left on the hosts it moved away from, once they answer (the prober says so);
    a decommissioned (or forgotten) former host is let go with a Warning naming what may remain there."""
    formers = former_hosts(p.body)
    if not formers:
        return
    done = []
    for host in formers:
        known = deps.inventory.hosts.get(host)
        if host == p.host:  # placed back where it was: its volumes there are its own again
            done.append(host)
        elif known is None or known.spec.decommissioned:
            await _event(deps, p.body, "Warning", placement.HOST_DECOMMISSIONED,
                         outage.what_may_remain(host, None, volume_names(p.volumes())))
            done.append(host)
        elif known.reachable:
            try:
                await deps.hosts.get(host).call(machines.delete_machine, p.domain_uuid, p.uid, p.volumes(),
                                                p.namespace, p.name, doing="delete machine")
            except errors.HypervisorError as error:
                log.info("%s/%s: former host %s not cleaned yet: %s", p.namespace, p.name, host, error)
                continue
            done.append(host)
    if done:
        left = [host for host in formers if host not in done]
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"metadata": {
            "annotations": {FORMER_HOSTS_ANNOTATION: ",".join(left) or None},
            "resourceVersion": p.body["metadata"]["resourceVersion"]}})


def placement_patch(body: dict[str, Any], host: str) -> dict[str, Any]:
    """The one write that places a machine, guarded by its resourceVersion: our finalizer, the providerID naming the
    host and the domain UUID, and the identity annotation (the UID all names derive from, which survives a move)."""
    finalizers = list(body["metadata"].get("finalizers") or [])
    uid = body["metadata"]["uid"]
    return {
        "metadata": {"finalizers": finalizers + [f for f in [FINALIZER] if f not in finalizers],
                     "annotations": {IDENTITY_ANNOTATION: uid, DOMAIN_RECORD_ANNOTATION: outage.NEVER_DEFINED},
                     "resourceVersion": body["metadata"]["resourceVersion"]},
        "spec": {"providerID": provider_id.format_provider_id(host, naming.domain_uuid(uid))}}


def identity_migration_patch(body: dict[str, Any]) -> dict[str, Any] | None:
    """What a placed machine lacks of placement's record, or None: the finalizer (a release whose finalizer was kopf's,
    which kopf now takes off) and the identity annotation (a release before it, or a machine adopted by its domain)."""
    finalizers = list(body["metadata"].get("finalizers") or [])
    identity = naming.identity_uid(body)
    metadata: dict[str, Any] = {}
    if FINALIZER not in finalizers:
        metadata["finalizers"] = finalizers + [FINALIZER]
    if (body["metadata"].get("annotations") or {}).get(IDENTITY_ANNOTATION) != identity:
        metadata["annotations"] = {IDENTITY_ANNOTATION: identity}
    if not metadata:
        return None
    return {"metadata": {**metadata, "resourceVersion": body["metadata"]["resourceVersion"]}}


async def _keep_finalizer_and_identity(deps: Dependencies, p: MachinePass) -> None:
    patch = identity_migration_patch(p.body)
    if patch is not None:
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, patch)


async def adopt_moved_machine(deps: Dependencies, p: MachinePass) -> None:
    """A machine with a providerID that names no domain of its identity (copied by clusterctl move from a release that
    wrote no identity annotation): look the domain up on the providerID's host. Its owner metadata naming this
    namespace/name, with a UID the UUID derives from, is the identity: written as the annotation, and the pass goes on
    as for any placed machine. Anything else stops here: a machine with a providerID is never placed again."""
    recorded = (p.body.get("spec") or {}).get("providerID")
    if not recorded or recorded_host(p.body) is not None:
        return
    identity = await identity_from_domain(deps, p.body)
    if identity is None:
        raise Wait(ADOPTION_REFUSED, f"spec.providerID {recorded} names no domain of this machine; not placing it "
                   "again", failure=True)
    annotations = {IDENTITY_ANNOTATION: identity}
    finalizers = list(p.body["metadata"].get("finalizers") or [])
    p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"metadata": {
        "annotations": annotations, "finalizers": finalizers + [f for f in [FINALIZER] if f not in finalizers],
        "resourceVersion": p.body["metadata"]["resourceVersion"]}})
    await _event(deps, p.body, "Normal", reasons.ADOPTED, f"adopted domain {naming.domain_uuid(identity)} on host "
                 f"{provider_id.parse_provider_id(recorded).host} by its owner metadata")


def owner_matches(owner: domain_xml.Owner | None, namespace: str, name: str, uuid: str) -> bool:
    """The domain's owner metadata names this machine, and the domain UUID derives from the owner's UID."""
    return owner is not None and owner.namespace == namespace and owner.name == name and \
        naming.domain_uuid(owner.uid) == uuid


async def identity_from_domain(deps: Dependencies, body: dict[str, Any]) -> str | None:
    """The identity the domain named by spec.providerID records for this machine, or None (no such domain, or one
    another machine owns). HypervisorError when the host cannot be asked."""
    try:
        parsed = provider_id.parse_provider_id((body.get("spec") or {}).get("providerID") or "")
    except ValueError:
        return None
    host = deps.hosts.get(parsed.host)
    info = await host.call(machines.domain_info, parsed.domain_uuid, doing="look up domain")
    if info is None:
        return None
    owner = domain_xml.parse_owner(info.xml)
    if not owner_matches(owner, body["metadata"]["namespace"], body["metadata"]["name"], parsed.domain_uuid):
        return None
    return owner.uid if owner is not None else None


async def check_networks(deps: Dependencies, p: MachinePass) -> None:
    """Before anything is created: a missing network would otherwise leave an overlay and a domain that cannot start."""
    host = deps.hosts.get(p.host or "")
    p.domain = await host.call(machines.domain_info, p.domain_uuid, doing="look up domain")
    if p.domain is not None:
        if not owner_matches(domain_xml.parse_owner(p.domain.xml), p.namespace, p.name, p.domain_uuid):
            raise Wait(ADOPTION_REFUSED, f"domain {p.domain_uuid} on host {p.host} belongs to another machine; left "
                       "alone", failure=True)
        return  # already defined: it was checked then
    # Placed, nothing made yet: the host's access rules again (its admin may have narrowed them since placement).
    refused = deps.inventory.refusal(p.host or "", p.namespace, p.spec)
    if refused is not None:
        raise Wait(TENANT_NOT_ALLOWED, str(refused), failure=True)
    segments = [address_conflicts.segment_of(nic.model_dump(by_alias=True)) for nic in p.spec.interfaces]
    try:
        p.segments = await host.call(networks.segment_facts, segments, p.domain_uuid, doing="look up networks")
    except errors.NetworkNotFound as error:
        raise Wait(NETWORK_NOT_FOUND, str(error), failure=True) from None
    machine_types = await host.call(machines.machine_types, p.spec.domain_type, doing="read capabilities")
    if p.spec.machine_type not in machine_types:
        listed = ", ".join(sorted(machine_types)[:12]) + (", ..." if len(machine_types) > 12 else "")
        raise Wait(MACHINE_TYPE_NOT_SUPPORTED, f"machineType {p.spec.machine_type!r}: the QEMU of host {p.host} has "
                   f"no such machine type for domainType {p.spec.domain_type} (it has: {listed or 'none'})", None,
                   failure=True)
    if p.spec.cpu_model is not None:
        await _check_cpu_model(host, p)


async def _check_cpu_model(host: connection.HostConnection, p: MachinePass) -> None:
    """A named CPU model the host cannot run (unknown to its QEMU, or lacking features here) would fail every start:
    refused once, naming the model, the host and what it can run, and not retried (the spec is immutable; deleting
    the machine is what is left to do)."""
    model = p.spec.cpu_model or ""
    found = await host.call(machines.cpu_models, model, p.spec.domain_type, p.spec.machine_type,
                            doing="read domain capabilities")
    if found.usable:
        return
    why = "cannot run it" if found.known else "does not know it"
    usable = ", ".join(found.usable_models[:12]) + (", ..." if len(found.usable_models) > 12 else "")
    raise Wait(CPU_MODEL_NOT_SUPPORTED, f"cpuModel {model!r}: host {p.host} {why} for domainType "
               f"{p.spec.domain_type} (usable there: {usable or 'none'})", None, failure=True)


async def record_owner(deps: Dependencies, p: MachinePass) -> None:
    """The domain's owner metadata names this management cluster: a domain adopted after clusterctl move (made by the
    source's operator), released by a move source, or made by a release before management cluster identities.
    Rewritten in place (virDomainSetMetadata): the domain is neither redefined nor restarted. Only then can the
    orphan collector of this management cluster, and no other, ever tell it is ours."""
    if p.domain is None or not deps.management_cluster:
        return
    owner = domain_xml.parse_owner(p.domain.xml)
    if owner is None or owner.management_cluster == deps.management_cluster:
        return
    host = deps.hosts.get(p.host or "")
    await host.call(host_domains.set_owner, p.domain_uuid,
                    dataclasses.replace(owner, management_cluster=deps.management_cluster), owner,
                    doing="set owner metadata")
    p.domain = await host.call(machines.domain_info, p.domain_uuid, doing="look up domain")
    await _event(deps, p.body, "Normal", reasons.OWNER_RECORDED, f"domain {p.domain_name} on host {p.host} now records this "
                 f"management cluster as its owner (was {owner.management_cluster or 'none'})")


async def resolve_addressing(deps: Dependencies, p: MachinePass) -> None:
    """The addresses each interface has before the guest boots: its `static` addressing, or what its IP pools
    allocated. For each pool of `addressesFromPools` the machine owns an IPAddressClaim (core.ipam), made here when
    missing; the pass waits (WaitingForIPAddress, naming the claim and the pool, and the claim's Ready=False reason,
    such as PoolExhausted) until every claim names an IPAddress. Runs every pass, also once the domain exists: its
    result is what status.addresses publishes up front."""
    addressing = {index: nic.static for index, nic in enumerate(p.spec.interfaces) if nic.static is not None}
    allocated: dict[int, list[dict[str, Any]]] = {}
    waiting: str | None = None
    cluster = (p.cluster or {}).get("metadata", {}).get("name") or \
        p.body["metadata"].get("labels", {}).get(meta.CLUSTER_NAME_LABEL, "")
    for ref in ipam.claims(p.name, p.spec.interfaces):
        claim = await deps.kube.get_ip_address_claim(p.namespace, ref.name)
        if claim is None:
            try:
                claim = await deps.kube.create_ip_address_claim(ipam.claim_body(p.body, ref, cluster))
            except api.Forbidden as error:
                raise Wait(IPAM_FORBIDDEN, f"{error}: the provider's ClusterRole must allow ipaddressclaims",
                           failure=True) from None
            await _event(deps, p.body, "Normal", reasons.IP_ADDRESS_CLAIM_CREATED, f"created IPAddressClaim {ref.name} for "
                         f"interface {ref.interface} from {ref.pool_ref.kind} {ref.pool_ref.name}")
        if not any(owner.get("uid") == p.body["metadata"]["uid"]
                   for owner in claim["metadata"].get("ownerReferences") or []):
            # A claim of that name another object owns (a deleted machine of the same name, its claim not gone yet).
            waiting = waiting or f"IPAddressClaim {ref.name} exists but is not this machine's; waiting for it to go"
            continue
        name = ipam.address_name(claim)
        address = await deps.kube.get_ip_address(p.namespace, name) if name else None
        if address is None:
            waiting = waiting or ipam.waiting_message(ref, claim)
            continue
        if ((address.get("spec") or {}).get("claimRef") or {}).get("name") != ref.name:
            raise Wait(ipam.INVALID_IP_ADDRESS, f"IPAddress {name} named by IPAddressClaim {ref.name} was not made "
                       "for that claim (spec.claimRef)", failure=True)
        allocated.setdefault(ref.interface, []).append(address)
    if waiting is not None:
        raise Wait(ipam.WAITING_FOR_IP_ADDRESS, waiting, RECHECK_IPAM)
    for index, addresses in allocated.items():
        try:
            addressing[index] = ipam.addressing(addresses)
        except ValueError as error:
            raise Wait(ipam.INVALID_IP_ADDRESS, f"the IPAddresses of interface {index} are not usable: {error}"[:512],
                       failure=True) from None
    p.addressing = addressing


async def check_addresses(deps: Dependencies, p: MachinePass) -> None:
    """Before anything is made: no address or MAC that is the network's own, outside its subnet, or another machine's
    or VM's on the same host and network (core.address_conflicts). A conflict with a holder is looked at again (the
    holder may go); one with the network itself is not retried."""
    if p.domain is not None or p.segments is None:
        return
    nics = [address_conflicts.Nic(index, address_conflicts.segment_of(nic.model_dump(by_alias=True)),
                                  (nic.mac_address or naming.mac_address(p.uid, index)).lower(),
                                  tuple(p.addressing[index].addresses) if index in p.addressing else (),
                                  tuple(nic.allowed_addresses or ()))
            for index, nic in enumerate(p.spec.interfaces)]
    mine = (p.body["metadata"].get("creationTimestamp") or "", p.name, p.namespace)
    # What another machine asks for is its own when it asked first, or once its domain may be defined (it may be
    # starting with that address, before it publishes it).
    holders = [address_conflicts.holder(other.get("spec") or {}, other.get("status") or {},
                                        bool(domain_record(other)) or
                                        (other["metadata"].get("creationTimestamp") or "", other["metadata"]["name"],
                                         other["metadata"]["namespace"]) < mine)
               for other in await deps.kube.list_libvirt_machines()
               if recorded_host(other) == p.host and other["metadata"]["uid"] != p.body["metadata"]["uid"]]
    conflict = address_conflicts.first_conflict(nics, p.segments, holders)
    if conflict is not None:
        raise Wait(address_conflicts.ADDRESS_CONFLICT, conflict.message,
                   RECHECK_WAITING if conflict.may_pass else None, failure=True)


async def ensure_image(deps: Dependencies, p: MachinePass) -> None:
    """The base image in the host's pool: a volume the admin put there, or the image of spec.image.url, imported once
    per host, pool and sha256 (reconcile.images) while the machine waits with ImageImporting."""
    if p.domain is not None:
        return  # the domain exists, so its disk (and the image under it) was made before it
    image = p.spec.image
    if image.url is None:
        p.image_volume = image.volume
        return
    known = deps.inventory.hosts.get(p.host or "")
    prefixes = known.spec.access.image_url_prefixes if known is not None else []
    try:
        pool = image.pool or p.spec.storage_pool
        found = await deps.images.ensure(deps.hosts.get(p.host or ""), pool, image, prefixes, deps.wake_host,
                                         room=functools.partial(pool_room, deps, p.host or "", pool))
    except images_.NotReady as not_ready:
        raise Wait(not_ready.reason, not_ready.message, not_ready.retry_after, failure=not_ready.failure) from None
    p.image_volume = found.name


async def ensure_overlay(deps: Dependencies, p: MachinePass) -> None:
    """The root disk (an overlay on the base image) and the data disks, in the machine's pool."""
    if p.domain is not None:
        return  # the domain exists, so its disks were made before it
    host = deps.hosts.get(p.host or "")
    base_pool = p.spec.image.pool or p.spec.storage_pool
    base_volume = p.image_volume or p.spec.image.volume or ""
    try:
        await host.call(machines.ensure_overlay, p.volumes(), base_pool, base_volume, p.spec.disk_gib,
                        doing="create overlay volume")
    except errors.VolumeNotFound:
        raise Wait(reasons.IMAGE_NOT_FOUND, f"base image volume {base_volume!r} not found in pool "
                   f"{base_pool!r} on host {p.host}", failure=True) from None
    if p.spec.data_disks:
        await host.call(machines.ensure_data_disks, p.volumes(), [disk.size_gib for disk in p.spec.data_disks],
                        doing="create data disk volumes")


async def ensure_domain(deps: Dependencies, p: MachinePass) -> None:
    if p.domain is not None:
        return
    if p.bootstrap is None:  # placed in an earlier pass (that ended, or crashed, before the domain was made)
        await _fetch_bootstrap_data(deps, p)
    host = deps.hosts.get(p.host or "")
    volumes = p.volumes()
    pool_dir = await host.call(machines.pool_path, volumes.pool, doing="read pool path")
    provider = provider_id.format_provider_id(p.host or "", p.domain_uuid)
    owner = domain_xml.Owner(namespace=p.namespace, name=p.name, uid=p.uid,
                             cluster=(p.cluster or {}).get("metadata", {}).get("name"),
                             management_cluster=deps.management_cluster)
    overlay_path = f"{pool_dir}/{volumes.overlay}"
    ignition = p.bootstrap is not None and p.bootstrap.format == "ignition"
    try:
        await host.call(traffic_filters.ensure_filters, doing="look up traffic filters")
    except traffic_filters.TrafficFilterMissing as error:
        raise Wait(TRAFFIC_FILTER_NOT_FOUND, str(error), failure=True) from None
    try:
        config = domain_xml.from_spec(p.spec, name=p.domain_name, uuid=p.domain_uuid, disk_path=overlay_path,
                                      iso_path=None if ignition else f"{pool_dir}/{volumes.nocloud}",
                                      serial_log_path=f"{pool_dir}/{volumes.serial_log}", owner=owner,
                                      data_disk_paths=tuple(f"{pool_dir}/{disk}" for disk in volumes.data_disks),
                                      ignition_path=f"{pool_dir}/{volumes.ignition}" if ignition else None,
                                      known_addresses={i: a.addresses for i, a in p.addressing.items()})
    except ValueError as error:  # a spec admission let through that no domain XML can carry: the spec is immutable
        raise Wait(INVALID_SPEC, f"invalid spec: {error}", None, failure=True) from None
    user_data = (p.bootstrap.value if p.bootstrap else None) or b""  # (always set and non-empty: fetched above)
    if ignition:  # the config as it is, for Ignition to read from fw_cfg; no NoCloud seed
        await host.call(machines.replace_ignition, volumes, user_data, doing="upload Ignition config")
    else:
        iso = nocloud.build_nocloud_iso(
            user_data=user_data,
            meta_data=cloud_init.meta_data(p.domain_uuid, naming.hostname(p.name), provider),
            network_config=cloud_init.network_config(p.spec.interfaces, [nic.mac for nic in config.interfaces],
                                                     p.addressing),
            vendor_data=None if p.spec.keep_nocloud_iso else cloud_init.DISABLE_AFTER_FIRST_BOOT,
        )
        await host.call(machines.replace_nocloud, volumes, iso, doing="upload NoCloud ISO")
    if p.spec.serial_log:
        await host.call(machines.ensure_serial_log, volumes, doing="create serial log")
    if domain_record(p.body) != p.host:  # written ahead: from here on a domain may exist there (core.outage)
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"metadata": {
            "annotations": {DOMAIN_RECORD_ANNOTATION: p.host},
            "resourceVersion": p.body["metadata"]["resourceVersion"]}})
    p.domain = await host.call(machines.define_domain, p.domain_uuid, domain_xml.domain_xml(config),
                               doing="define domain")
    await _event(deps, p.body, "Normal", reasons.DOMAIN_DEFINED, f"domain {p.domain_name} defined on host {p.host}")


async def ensure_running(deps: Dependencies, p: MachinePass) -> None:
    host = deps.hosts.get(p.host or "")
    if p.domain is None or p.domain.state != "running":
        paused_for = p.domain.pause_reason if p.domain else None
        if await host.call(machines.start_domain, p.domain_uuid, doing="start domain"):
            await _event(deps, p.body, "Warning", reasons.DOMAIN_RESUMED,
                         f"domain {p.domain_name} on host {p.host} was paused ({paused_for or 'reason unknown'}); resumed")
        p.domain = await host.call(machines.domain_info, p.domain_uuid, doing="look up domain")
    p.status["state"] = p.domain.state if p.domain else "unknown"


async def publish_provider_id(deps: Dependencies, p: MachinePass) -> None:
    wanted = provider_id.format_provider_id(p.host or "", p.domain_uuid)
    if p.body.get("spec", {}).get("providerID") != wanted:
        await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"spec": {"providerID": wanted}})


async def observe_addresses(deps: Dependencies, p: MachinePass) -> None:
    """Publish the machine's addresses (core.machine_addresses): those known up front (p.addressing) as soon as the domain
    runs, then what discovery finds, the last discovered kept while discovery finds nothing; the machine is
    provisioned once it has any. The AddressesDiscovered condition says where this look found them, or what it asked."""
    host = deps.hosts.get(p.host or "")
    discovery = await host.call(machines.domain_addresses, p.domain_uuid, doing="read addresses")
    known = machine_addresses.known_addresses(p.addressing)
    previous = [a["address"] for a in p.status.get("addresses") or [] if a.get("type") == "InternalIP"]
    internal = machine_addresses.internal_addresses(known, discovery.addresses, previous)
    kept = machine_addresses.kept_addresses(known, discovery.addresses, previous)
    p.status["addresses"] = [{"type": "Hostname", "address": naming.hostname(p.name)}] + \
        [{"type": "InternalIP", "address": address} for address in internal]
    p.status["conditions"] = conditions.set_condition(
        p.status.get("conditions"), conditions.ADDRESSES_DISCOVERED,
        *machine_addresses.discovery_condition(discovery.asked, discovery.source, discovery.addresses, known, kept),
        now=deps.now(), observed_generation=p.body["metadata"].get("generation"))
    if not internal:
        raise Wait(reasons.WAITING_FOR_ADDRESS, "the domain runs; waiting for its address", RECHECK_ADDRESS)
    p.status["ready"] = True  # v1beta1 contract
    p.status["initialization"] = {"provisioned": True}  # v1beta2 contract


async def pin_leased_addresses(deps: Dependencies, p: MachinePass) -> None:
    """A NIC on a libvirt network whose address comes from DHCP starts able to send only a DHCP client's traffic; once
    the host's network has leased it an address, its filter is pinned to that address (core.traffic_filter), on the running domain and
    its definition, without a restart. Asked of the host only while a NIC of the domain read this pass is unpinned."""
    if p.domain is None or p.domain.state != "running":
        return
    unpinned = [nic for nic in ET.fromstring(p.domain.xml).findall("devices/interface[@type='network']")
                if (found := traffic_filter.parse_filterref(nic)) is not None and found.awaiting_lease]
    if not unpinned:
        return
    allowed = {(nic.mac_address or naming.mac_address(p.uid, index)).lower():
               traffic_filter.ipv4_only(nic.allowed_addresses or []) for index, nic in enumerate(p.spec.interfaces)}
    try:
        pinned = await deps.hosts.get(p.host or "").call(traffic_filters.pin_leased_addresses, p.domain_uuid,
                                                         allowed, doing="pin traffic filters")
    except errors.HostUnreachable:
        raise
    except errors.HypervisorError as error:  # no provisioning failure: the next pass tries again
        log.warning("%s/%s: traffic filter not pinned yet: %s", p.namespace, p.name, error)
        await _event(deps, p.body, "Warning", TRAFFIC_FILTER_NOT_PINNED, f"the NIC's filter is not pinned yet: {error}")
        return
    for mac, address in pinned:
        await _event(deps, p.body, "Normal", TRAFFIC_FILTER_PINNED, f"the NIC {mac} may now send only from {address}"
                     " (leased by the host's network) and its allowed addresses")


def control_plane_initialized(cluster: dict[str, Any]) -> bool:
    """Cluster API's word that the workload cluster's API server answers (v1beta2 status, or v1beta1's condition)."""
    status = cluster.get("status") or {}
    if (status.get("initialization") or {}).get("controlPlaneInitialized"):
        return True
    return any(c.get("type") == "ControlPlaneInitialized" and c.get("status") == "True"
               for c in status.get("conditions") or [])


async def patch_workload_node(deps: Dependencies, p: MachinePass) -> None:
    """Give the workload cluster's Node our providerID when its kubelet did not, as the Docker provider does.

    Best effort: until the control plane answers there is no Node to patch, and that is not a provisioning failure.
    Once Cluster API has matched the Node (Machine.status.nodeRef) there is nothing left to do.
    """
    if (p.machine or {}).get("status", {}).get("nodeRef") or p.cluster is None or \
            not control_plane_initialized(p.cluster):
        return  # matched already, or no control plane to have a Node (and no kubeconfig Secret to read yet)
    nodes = api.WorkloadNodes(deps.kube)
    try:
        kubeconfig = await nodes.kubeconfig(p.namespace, p.cluster["metadata"]["name"])
        if kubeconfig is None:
            return
        wanted = provider_id.format_provider_id(p.host or "", p.domain_uuid)
        outcome = await nodes.set_provider_id(kubeconfig, naming.hostname(p.name), wanted)
    except Exception as error:  # an unreachable or half-built workload cluster: try again on the next pass
        log.info("workload cluster of %s/%s not usable yet: %s", p.namespace, p.name, type(error).__name__)
        return
    if outcome == "patched":
        await _event(deps, p.body, "Normal", reasons.NODE_PROVIDER_ID_SET, f"set providerID on Node {naming.hostname(p.name)}")
    elif outcome == "other":
        log.warning("Node %s of %s/%s carries another providerID", naming.hostname(p.name), p.namespace, p.name)


async def remove_nocloud_iso(deps: Dependencies, p: MachinePass) -> None:
    """Once the bootstrap data was provably consumed (the owner Machine has a nodeRef: Cluster API's word that the
    node joined, so cloud-init ran it), eject the NoCloud ISO from the domain and delete it from the host: the join
    token is then nowhere on the hypervisor. Unless spec.keepNoCloudISO keeps it for debugging (status says false).

    Looked at every pass from the domain XML this pass read (free); the host is asked only while the ISO is still in
    the CD-ROM or its removal is not recorded in status.noCloudISORemoved (a crash between the eject and the delete,
    or a moved copy without status, converges). A failure is no provisioning failure: a Warning event, and the next
    pass tries again.
    """
    if p.domain is None or not ((p.machine or {}).get("status") or {}).get("nodeRef"):
        return
    if any(posixpath.basename(path) == p.volumes().ignition for path in domain_xml.fw_cfg_files(p.domain.xml)) or \
            "ignitionConfigRemoved" in p.status:
        await _remove_ignition_config(deps, p)
        return
    if p.spec.keep_nocloud_iso:
        p.status["noCloudISORemoved"] = False  # looked at with the node joined, and kept
        return
    inserted = any(posixpath.basename(path) == p.volumes().nocloud for path in domain_xml.cdrom_sources(p.domain.xml))
    if p.status.get("noCloudISORemoved") and not inserted:
        return
    host, volumes = deps.hosts.get(p.host or ""), p.volumes()
    try:
        ejected = await host.call(machines.eject_nocloud, p.domain_uuid, volumes.nocloud, doing="eject NoCloud ISO")
        deleted = await host.call(machines.delete_nocloud, volumes, doing="delete NoCloud ISO")
    except errors.HostUnreachable:
        raise
    except errors.HypervisorError as error:
        log.warning("%s/%s: the NoCloud ISO was not removed yet: %s", p.namespace, p.name, error)
        await _event(deps, p.body, "Warning", NOCLOUD_ISO_NOT_REMOVED, f"the NoCloud ISO stays for now: {error}")
        return
    p.status["noCloudISORemoved"] = True
    done = ([f"ejected from the domain ({' and '.join(ejected)})"] if ejected else []) + \
        ([f"volume {volumes.nocloud} deleted"] if deleted else [])
    if done:
        await _event(deps, p.body, "Normal", NOCLOUD_ISO_REMOVED, "the node joined, so the bootstrap data was used: "
                     f"NoCloud ISO {', '.join(done)} on host {p.host}")


async def _remove_ignition_config(deps: Dependencies, p: MachinePass) -> None:
    """An Ignition machine's bootstrap data, once the node joined: its fw_cfg entry out of the domain's definition
    (the running guest read it at boot; the next start comes without it) and its volume deleted from the host. The
    domain's live XML keeps naming the file until it stops, so status.ignitionConfigRemoved records that it is done."""
    if p.spec.keep_nocloud_iso:
        p.status["ignitionConfigRemoved"] = False
        return
    if p.status.get("ignitionConfigRemoved"):
        return
    host, volumes = deps.hosts.get(p.host or ""), p.volumes()
    try:
        done = await host.call(machines.drop_ignition, p.domain_uuid, volumes, doing="remove Ignition config")
    except errors.HostUnreachable:
        raise
    except errors.HypervisorError as error:
        log.warning("%s/%s: the Ignition config was not removed yet: %s", p.namespace, p.name, error)
        await _event(deps, p.body, "Warning", IGNITION_CONFIG_NOT_REMOVED,
                     f"the Ignition config stays for now: {error}")
        return
    p.status["ignitionConfigRemoved"] = True
    said = {"definition": "taken out of the domain's definition", "volume": f"volume {volumes.ignition} deleted"}
    if done:
        await _event(deps, p.body, "Normal", IGNITION_CONFIG_REMOVED, "the node joined, so the bootstrap data was "
                     f"used: Ignition config {', '.join(said[what] for what in done)} on host {p.host}")


PHASES = (find_owner_machine, find_cluster, honour_pause, wait_for_cluster_infrastructure, adopt_moved_machine,
          read_bootstrap_data, choose_host, clean_former_hosts, check_networks, record_owner, resolve_addressing,
          check_addresses, ensure_image, ensure_overlay, ensure_domain, ensure_running, publish_provider_id,
          observe_addresses, pin_leased_addresses, patch_workload_node, remove_nocloud_iso)
CREATION = (ensure_overlay, ensure_domain, ensure_running)  # under the host's creation slot while the domain is new


# -- the reconcile --------------------------------------------------------------------------------------------------

async def reconcile(deps: Dependencies, namespace: str, name: str,
                    cancelled: Callable[[], bool] = lambda: False) -> float | None:
    """One pass over the machine; returns seconds until the next pass (None: only when a watch wakes it).

    `cancelled` is asked before every phase: once the object is being deleted, no phase starts creating things.
    A machine being deleted is `delete`d instead.
    """
    body = await deps.kube.get_libvirt_machine(namespace, name)
    if body is None:
        return None
    if body["metadata"].get("deletionTimestamp"):
        return await delete(deps, namespace, name)
    status = dict(body.get("status") or {})
    key = (namespace, name)
    try:
        spec = v1alpha1.LibvirtMachineSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError as error:
        fields = ", ".join(".".join(map(str, e["loc"])) for e in error.errors())
        await _write_status(deps, body, status, Wait(INVALID_SPEC, f"invalid spec: {fields}", None, failure=True))
        return None
    p = MachinePass(body=body, spec=spec, status=status)
    try:
        async with contextlib.AsyncExitStack() as creating:
            for phase in PHASES:
                if cancelled():
                    return None
                if phase is CREATION[0] and p.domain is None:
                    await creating.enter_async_context(deps.creation_slot(p.host or ""))
                with deps.observe.phase("LibvirtMachine", phase.__name__):
                    await phase(deps, p)
    except Paused:
        await _write_status(deps, p.body, p.status, None, paused=True)
        return None
    except api.Conflict:
        await deps.kube.reread_libvirt_machine(namespace, name)
        return 0.0  # again, from what the object is now
    except Wait as wait:
        if not wait.failure:
            deps.failures.pop(key, None)
        # A failure with no retry (an invalid spec: immutable, so retrying cannot help) waits for a watch event.
        backoff = wait.failure and wait.retry_after is not None
        return await _write_status(deps, p.body, p.status, _with_backoff(deps, key, wait) if backoff else wait)
    except errors.HypervisorError as error:
        return await _write_status(deps, p.body, p.status, _with_backoff(deps, key, _wait_for_hypervisor(error)))
    except Exception as error:  # noqa: BLE001  anything else: a condition that names its kind, details in the log
        log.exception("reconcile of %s/%s failed", namespace, name)
        failed = Wait(RECONCILE_ERROR, f"unexpected {type(error).__name__}; see the operator log", failure=True)
        return await _write_status(deps, p.body, p.status, _with_backoff(deps, key, failed))
    deps.failures.pop(key, None)
    return await _write_status(deps, p.body, p.status, None)


def _wait_for_hypervisor(error: errors.HypervisorError) -> Wait:
    if isinstance(error, errors.HostUnreachable):
        return Wait(reasons.HOST_UNREACHABLE, str(error), failure=True)
    if isinstance(error, errors.PoolNotFound):
        return Wait(reasons.POOL_NOT_FOUND, str(error), failure=True)
    return Wait(reasons.HYPERVISOR_ERROR, str(error), failure=True)


def _with_backoff(deps: Dependencies, key: tuple[str, ...], wait: Wait) -> Wait:
    attempts = deps.failures.get(key, 0)
    deps.failures[key] = attempts + 1
    wait.retry_after = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** attempts)
    return wait


async def _write_status(deps: Dependencies, body: dict[str, Any], status: dict[str, Any], wait: Wait | None, *,
                        paused: bool = False) -> float | None:
    """Set the Provisioned and Ready conditions, post an event when the reason changed, patch what changed."""
    now, generation = deps.now(), body["metadata"].get("generation")
    previous = conditions.get_condition(status.get("conditions"), conditions.PROVISIONED)
    if not paused:
        state: tuple[conditions.Status, str, str] = \
            ("True", reasons.PROVISIONED_REASON, "") if wait is None else ("False", wait.reason, wait.message)
        status["conditions"] = conditions.set_condition(status.get("conditions"), conditions.PROVISIONED, *state,
                                                        now=now, observed_generation=generation)
    status.setdefault("ready", False)
    status["conditions"] = conditions.summarize_ready(status.get("conditions"), now, generation,
                                                      order=(conditions.PROVISIONED,), ignore=READY_IGNORES)
    status["observedGeneration"] = generation
    # Every condition was judged in this pass, against this generation (placement, earlier in the pass, moved it on).
    if generation is not None:
        status["conditions"] = [{**c, "observedGeneration": generation} for c in status["conditions"]]
    deps.observe.machine_outcome(body, status, wait, paused)
    if status != (body.get("status") or {}):
        await deps.kube.patch_libvirt_machine_status(body["metadata"]["namespace"], body["metadata"]["name"], status)
    current = conditions.get_condition(status["conditions"], conditions.PROVISIONED)
    if current and (previous is None or previous.get("reason") != current.get("reason")):
        kind = "Warning" if wait is not None and wait.failure else "Normal"
        await _event(deps, body, kind, current["reason"], current.get("message") or "provisioned")
    return wait.retry_after if wait is not None else RECHECK_PROVISIONED


async def _event(deps: Dependencies, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
    result = deps.post_event(body, kind, reason, message)
    if result is not None:
        await result


# -- deletion -----------------------------------------------------------------------------------------------------

async def delete(deps: Dependencies, namespace: str, name: str) -> float | None:
    """Remove the domain (with its UEFI variable store), overlay, data disks, ISO or Ignition config and serial log from
    the machine's host, then release the finalizer; returns seconds until the next try while that is impossible (an
    unreachable host, a paused cluster), else None.

    While the cluster or the machine is paused (clusterctl move), nothing is touched and the finalizer stays.
    """
    body = await deps.kube.get_libvirt_machine(namespace, name)
    if body is None or FINALIZER not in (body["metadata"].get("finalizers") or []):
        return None  # gone, or never placed (nothing was made: the finalizer comes first)
    if DELETE_FOR_MOVE_ANNOTATION in (body["metadata"].get("annotations") or {}):
        # clusterctl move deletes the source copy of a machine that lives on: never touch the host, and never take
        # its domain for an orphan (the orphan collector releases its owner metadata to the move target).
        deps.moved_away.add(naming.identity_uid(body))
        log.info("%s/%s deleted by clusterctl move (%s): its domain stays, the finalizer goes", namespace, name,
                 DELETE_FOR_MOVE_ANNOTATION)
        await _event(deps, body, "Normal", DELETED_FOR_MOVE, "deleted by clusterctl move; the domain on host "
                     f"{recorded_host(body) or '(none recorded)'} is left to the moved copy")
        return await _release_finalizer(deps, body)
    cluster_name = body["metadata"].get("labels", {}).get(meta.CLUSTER_NAME_LABEL)
    cluster = await deps.kube.get_cluster(namespace, cluster_name) if cluster_name else None
    if is_paused(body, cluster):
        return RECHECK_WAITING
    deps.observe.machine_deleting(namespace, name, recorded_host(body))
    try:
        await _delete_from_host(deps, body)
        await _release_ip_address_claims(deps, body)
    except Wait as wait:
        return wait.retry_after
    return await _release_finalizer(deps, body)


async def _release_ip_address_claims(deps: Dependencies, body: dict[str, Any]) -> None:
    """After the host's teardown, the machine's IPAddressClaims are deleted, so its addresses go back to their pools
    now (not whenever a garbage collector gets to the owner references). Their deletion is asked for, never waited
    for: the IPAM provider's finalizer releases the address. A refusal (403) is a Warning event, not a stuck machine;
    another API error is retried with backoff."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        spec = v1alpha1.LibvirtMachineSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError:
        return  # never valid, so never claimed anything
    key = ("release", namespace, name)
    for ref in ipam.claims(name, spec.interfaces):
        try:
            if await deps.kube.delete_ip_address_claim(namespace, ref.name):
                await _event(deps, body, "Normal", reasons.IP_ADDRESS_RELEASED, f"deleted IPAddressClaim {ref.name}")
        except api.Forbidden:
            await _event(deps, body, "Warning", IPAM_FORBIDDEN, f"may not delete IPAddressClaim {ref.name}; "
                         "its owner reference lets the garbage collector remove it")
        except Exception as error:  # noqa: BLE001  the API hiccuped: again, with backoff
            log.info("deleting IPAddressClaim %s/%s failed: %s", namespace, ref.name, type(error).__name__)
            raise _with_backoff(deps, key, Wait(RECONCILE_ERROR, "deleting IPAddressClaims failed")) from None
    deps.failures.pop(key, None)


async def _release_finalizer(deps: Dependencies, body: dict[str, Any]) -> float | None:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    remaining = [f for f in body["metadata"].get("finalizers") or [] if f != FINALIZER]
    try:
        await deps.kube.patch_libvirt_machine(namespace, name, {
            "metadata": {"finalizers": remaining or None, "resourceVersion": body["metadata"]["resourceVersion"]}})
    except api.Conflict:
        await deps.kube.reread_libvirt_machine(namespace, name)
        return 0.0
    except Exception as error:  # noqa: BLE001  gone meanwhile (404) or the API hiccuped: the next pass sees
        log.info("releasing the finalizer of %s/%s failed: %s", namespace, name, type(error).__name__)
        return BACKOFF_FIRST
    deps.observe.machine_gone(namespace, name)
    return None


async def _delete_from_host(deps: Dependencies, body: dict[str, Any]) -> None:
    """What the machine has on its host, removed; raises Wait (with a Deleting condition written) while it cannot be."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    key = ("delete", namespace, name)
    status = dict(body.get("status") or {})
    host_name, uid = recorded_host(body), naming.identity_uid(body)
    recorded: str = (body.get("spec") or {}).get("providerID") or ""
    if host_name is None and not recorded:
        return  # the host is recorded before anything is created: no host, nothing was made
    try:
        spec = v1alpha1.LibvirtMachineSpec.model_validate(body.get("spec") or {})
        pool, data_disks = spec.storage_pool, len(spec.data_disks)
    except pydantic.ValidationError:  # look for as many data disks as any spec may have
        pool, data_disks = (body.get("spec") or {}).get("storagePool", "default"), v1alpha1.MAX_DATA_DISKS
    removed: list[str] = []
    try:
        # Hosts the machine moved away from first (a re-placement: volumes, never a domain), then its own.
        for former in [host for host in former_hosts(body) if host != host_name]:
            volumes = machine_volumes(namespace, name, uid, pool, data_disks)
            if former not in deps.inventory.hosts:  # its LibvirtHost is gone: nobody to ask
                await _event(deps, body, "Warning", placement.HOST_DECOMMISSIONED,
                             outage.what_may_remain(former, None, volume_names(volumes)))
            elif not await _released_from_decommissioned(deps, body, former, None, volumes):
                await deps.hosts.get(former).call(machines.delete_machine, naming.domain_uuid(uid), uid, volumes,
                                                  namespace, name, doing="delete machine")
        current = host_name or provider_id.parse_provider_id(recorded).host
        domain = naming.domain_name(namespace, name, uid) if outage.may_have_domain(domain_record(body)) else None
        volumes = machine_volumes(namespace, name, uid, pool, data_disks)
        if await _released_from_decommissioned(deps, body, current, domain, volumes):
            return
        if host_name is None:
            # A providerID that names no domain of this identity (a copy moved without the identity annotation):
            # ask the host what it has, rather than take "no host" for "nothing made" and leak the domain.
            identity = await identity_from_domain(deps, body)
            if identity is None:
                log.info("%s/%s: no domain of this machine at %s; nothing to delete", namespace, name, recorded)
                return
            host_name, uid = provider_id.parse_provider_id(recorded).host, identity
        volumes = machine_volumes(namespace, name, uid, pool, data_disks)
        host = deps.hosts.get(host_name)
        removed = await host.call(machines.delete_machine, naming.domain_uuid(uid), uid, volumes, namespace, name,
                                  doing="delete machine")
    except errors.HypervisorError as error:
        wait = _wait_for_hypervisor(error)
        if not isinstance(error, errors.HostUnreachable):
            wait.reason = reasons.DELETION_FAILED
        status["conditions"] = conditions.set_condition(
            status.get("conditions"), conditions.DELETING, "True", wait.reason, f"cannot delete yet: {error}",
            now=deps.now(), observed_generation=body["metadata"].get("generation"))
        status["conditions"] = conditions.summarize_ready(status["conditions"], deps.now(),
                                                          body["metadata"].get("generation"), ignore=READY_IGNORES)
        await deps.kube.patch_libvirt_machine_status(namespace, name, status)
        raise _with_backoff(deps, key, wait) from None
    deps.failures.pop(key, None)
    if removed:
        await _event(deps, body, "Normal", reasons.DELETED, f"removed from host {host_name}: {', '.join(removed)}")


def volume_names(volumes: machines.MachineVolumes) -> list[str]:
    return volumes.all_names()


async def _released_from_decommissioned(deps: Dependencies, body: dict[str, Any], host: str, domain: str | None,
                                        volumes: machines.MachineVolumes) -> bool:
    """A decommissioned host is never asked: True, with a Warning event naming what of the machine may remain there
    (`domain` when one may have been defined)."""
    if not deps.inventory.state(host).decommissioned:
        return False
    log.warning("%s/%s: host %s is decommissioned; releasing without touching it", body["metadata"]["namespace"],
                body["metadata"]["name"], host)
    await _event(deps, body, "Warning", placement.HOST_DECOMMISSIONED,
                 outage.what_may_remain(host, domain, volume_names(volumes)))
    return True
