"""Placement: the host chosen once for a machine (under one lock, from every machine's record), its
replacement when its host is unreachable or decommissioned before any domain was defined there, and the cleaning of
the hosts it was moved away from.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from capi_libvirt.api import meta, reasons
from capi_libvirt.core import outage, placement, provider_id
from capi_libvirt.hypervisor import errors
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile import placed
from capi_libvirt.reconcile.base import RECHECK_WAITING, Dependencies, Wait
from capi_libvirt.reconcile.machine.identity import (
    domain_record,
    former_hosts,
    keep_finalizer_and_identity,
    placement_patch,
    recorded_host,
)
from capi_libvirt.reconcile.machine.state import (
    DOMAIN_RECORD_ANNOTATION,
    FORMER_HOSTS_ANNOTATION,
    MachinePass,
    event,
    volume_names,
)

log = logging.getLogger(__name__)

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




async def choose_host(deps: Dependencies, p: MachinePass) -> None:
    """Place the machine (once): the finalizer and the providerID naming the host are written BEFORE anything is
    created, under one lock for all placements, so machines placed a moment ago count against their host and a burst
    spreads. Allocation is counted from the cache of every LibvirtMachine, not a LIST."""
    host = recorded_host(p.body)
    if host:
        record = domain_record(p.body)
        if record and record != host:  # someone changed the providerID's host under a defined domain: never follow
            raise Wait(reasons.DOMAIN_HOST_MISMATCH, f"spec.providerID names host {host}, but the domain was defined on host "
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
        await keep_finalizer_and_identity(deps, p)
        return
    if (p.body.get("spec") or {}).get("providerID"):  # adopt_moved_machine found nothing to adopt: never re-place
        raise Wait(reasons.ADOPTION_REFUSED, f"spec.providerID {p.body['spec']['providerID']} names no domain of this machine;"
                   " not placing it again", failure=True)
    never_probed = [name for name, known in deps.inventory.hosts.items() if known.probe is None and not known.problem]
    if never_probed:  # just added (or the operator just started): look before deciding, outside the lock
        await asyncio.gather(*(deps.inventory.probe(name) for name in never_probed))
    async with deps.placement_lock:
        result = await _choose(deps, p)
        if isinstance(result, placement.NoHost):
            # A refusal waits for the host's admin (a LibvirtHost change wakes nothing here): looked at again slowly.
            raise Wait(result.reason, result.message, RECHECK_WAITING, failure=result.reason == reasons.TENANT_NOT_ALLOWED)
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, placement_patch(p.body, result.host))
        _placed_on(p, result)
    await event(deps, p.body, "Normal", reasons.PLACED, f"placed on host {p.host}")


async def _choose(deps: Dependencies, p: MachinePass) -> placement.Placed | placement.NoHost:
    """Placement's decision for the machine, from the inventory and every other machine's record (under the lock)."""
    uid = p.body["metadata"]["uid"]
    await placed_now(deps)
    group = placement_group(p.body)
    group_per_host = deps.placed.group_per_host(group, excluding_uid=uid) if group is not None else {}
    holding = inventory_.machine_holding(p.spec)
    request = placement.Request(cpus=p.spec.cpus, memory_mib=p.spec.memory_mib, pinned_host=p.spec.host,
                                failure_domain=p.machine.failure_domain if p.machine else None,
                                control_plane=CONTROL_PLANE_LABEL in (p.body["metadata"].get("labels") or {}),
                                pool=p.spec.storage_pool, disk_bytes=holding.disk_gib * placement.GIB)
    claims = deps.placed.claims(excluding_uid=uid)
    return placement.choose_host(request, deps.inventory.loads(claims, p.namespace, p.spec), group_per_host)


async def placed_now(deps: Dependencies) -> None:
    """deps.placed brought up to date: from the machines that changed since it last looked, or, before the cache is
    primed (or when its change log no longer reaches back), from every machine."""
    latest = deps.kube.libvirt_machine_changes(deps.placed.since)
    if latest is None or latest[1] is None or deps.placed.since == 0:  # (a first look: whatever came before, too)
        deps.placed.refresh(await deps.kube.list_libvirt_machines(), placed_record)
    else:
        deps.placed.apply(latest[1], placed_record)
    if latest is not None:
        deps.placed.since = latest[0]


def placed_record(body: dict[str, Any]) -> placed.Record | None:
    """What placement counts of a machine: its host (None: not placed), its group, its claim."""
    host = recorded_host(body)
    if not host:
        return None
    return placed.Record(host, body["metadata"]["uid"], placement_group(body),
                         placement.Claim.of(body["metadata"]["namespace"], body.get("spec") or {}))


async def pool_room(deps: Dependencies, host: str, pool: str) -> int | None:
    """What placement may still promise in `pool` on `host` (every machine placed there counted), or None when the
    host's last probe did not see the pool."""
    await placed_now(deps)
    return deps.inventory.pool_room(host, pool, deps.placed.host_claims(host))


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
            raise Wait(reasons.HOST_UNREACHABLE, f"{why}; no other host: {message}", RECHECK_WAITING)
        formers = [host for host in former_hosts(p.body) if host not in (old, result.host)] + [old]
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {
            "metadata": {"annotations": {FORMER_HOSTS_ANNOTATION: ",".join(formers),
                                         DOMAIN_RECORD_ANNOTATION: outage.NEVER_DEFINED},
                         "resourceVersion": p.body["metadata"]["resourceVersion"]},
            "spec": {"providerID": provider_id.format_provider_id(result.host, p.domain_uuid)}})
        _placed_on(p, result)
    await event(deps, p.body, "Warning", reasons.REPLACED, f"{why}: placed on host {p.host} instead")


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
            await event(deps, p.body, "Warning", reasons.HOST_DECOMMISSIONED,
                         outage.what_may_remain(host, None, volume_names(p.volumes())))
            done.append(host)
        elif known.reachable:
            try:
                await deps.hosts.get(host).delete_machine(p.domain_uuid, p.uid, p.volumes(), p.namespace,
                                                          p.name)
            except errors.HypervisorError as error:
                log.info("%s/%s: former host %s not cleaned yet: %s", p.namespace, p.name, host, error)
                continue
            done.append(host)
    if done:
        left = [host for host in formers if host not in done]
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"metadata": {
            "annotations": {FORMER_HOSTS_ANNOTATION: ",".join(left) or None},
            "resourceVersion": p.body["metadata"]["resourceVersion"]}})
