"""The orphan collector: domains (and their volumes) this management cluster made whose LibvirtMachine is gone.

A LibvirtMachine whose finalizer was force-removed, or one lost with its API server's data, leaves its domain and
volumes on the host. Every round, for every host in the inventory, the collector lists the host's domains, decides
with core.orphans (the safety rule is there) and:
- reports: LibvirtHost status.orphans (counts, bounded lists of names), the capi_libvirt_orphans gauges, and a
  Warning event on the LibvirtHost when an orphan is first seen;
- removes an orphan once it has been one for the whole grace period (Dependencies.orphan_grace_s), after checking
  again with a fresh LIST from the API server (not the watch cache) that no LibvirtMachine claims it, and on the host
  that its owner metadata did not change meanwhile; a Warning event names what was removed;
- keeps (reports) the orphans of a Cluster that is paused here;
- releases the owner metadata of a domain whose LibvirtMachine clusterctl move deleted here (delete-for-move), so that
  neither a later round nor a restarted operator takes it for an orphan while the move target adopts it.

Nothing runs without a known management cluster identity or before the machine cache is complete, and nothing on a
decommissioned host (LibvirtHost.spec.decommissioned: it is never contacted). The grace clock is in memory: a restart
starts it again (later removal, never earlier).

A machine that host outage re-placement moved (core.outage) never leaves an orphan behind on its old host: it moves
only while no define was ever sent there, so at most its volumes remain, and those are cleaned by the machine's own
reconcile (clean_former_hosts, or its deletion); the collector only counts them as stray volumes. Should a domain of
it be there all the same, it is CLAIMED (claims go by the machine's identity and domain UUID, whatever the host), so
the machine's reconcile is the only one that removes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from capi_libvirt.api import reasons
from capi_libvirt.core import orphans
from capi_libvirt.hypervisor import errors
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile.base import Dependencies

log = logging.getLogger(__name__)
INTERVAL_S = 60.0
LIST_TIMEOUT_S = 60.0  # a host that does not answer delays a round by this much at most
ORPHAN_FOUND, ORPHAN_REMOVED = reasons.ORPHAN_FOUND, reasons.ORPHAN_REMOVED


async def collect_host(deps: Dependencies, name: str, namespaces: Sequence[str] = (),
                       clock: Callable[[], float] = time.monotonic) -> inventory_.OrphanRecord | None:
    """One round on one host; returns its record (None: nothing could be decided)."""
    known = deps.inventory.hosts.get(name)
    if not deps.management_cluster or not deps.kube.primed or known is None or not known.reachable or \
            known.spec.decommissioned:  # gone for good: never contacted (its machines' remains are reported there)
        return None
    host = deps.hosts.get(name)
    domains, volumes = await asyncio.wait_for(
        host.list_domains(known.spec.storage_pool), LIST_TIMEOUT_S)
    claims = _cached_claims(deps, await deps.kube.list_libvirt_machines(), namespaces)
    findings = orphans.find(domains, deps.management_cluster, claims, volumes)
    record = deps.inventory.orphans.setdefault(name, inventory_.OrphanRecord())
    await _release_moved_away(deps, name, findings)

    now = clock()
    current = {domain.uuid for domain, _ in findings.orphans}
    record.first_seen = {uuid: seen for uuid, seen in record.first_seen.items() if uuid in current}
    new = sorted(domain.name for domain, _ in findings.orphans if domain.uuid not in record.first_seen)
    for domain, _ in findings.orphans:
        record.first_seen.setdefault(domain.uuid, now)
    if new:
        when = "never removed (report only)" if deps.orphan_grace_s is None else \
            f"removed after the grace period of {deps.orphan_grace_s:.0f}s"
        log.warning("host %s: %d orphan domain(s) of this management cluster: %s", name, len(new), ", ".join(new))
        await _host_event(deps, name, ORPHAN_FOUND, f"{len(new)} domain(s) made by this management cluster whose "
                          f"LibvirtMachine is gone: {_names(new)}; {when}")

    due = [(domain, paths) for domain, paths in findings.orphans
           if orphans.due(record.first_seen[domain.uuid], now, deps.orphan_grace_s)]
    removed_uuids = await _remove(deps, name, namespaces, due, record) if due else set()

    left = dataclasses.replace(findings, orphans=tuple(o for o in findings.orphans if o[0].uuid not in removed_uuids))
    record.pending, record.kept, record.stray_volumes = len(left.orphans), len(left.kept), len(left.stray_volumes)
    status = orphans.status(left, record.removed_domains, deps.orphan_grace_s)
    if status != record.published and name not in deps.inventory.static:
        await deps.kube.patch_libvirt_host_status(name, {"orphans": status})
        record.published = status
    return record


def _cached_claims(deps: Dependencies, machines: list[dict[str, Any]], namespaces: Sequence[str]) -> orphans.Claims:
    """The claims of the machines the cache holds, each body read once (the cache replaces a body when it changes,
    never edits one): every host's round used to read every machine again."""
    remembered = deps.inventory.machine_claims

    def claim_of(body: Mapping[str, Any]) -> orphans.MachineClaim:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        held = remembered.get(key)
        if held is not None and held[0] is body:
            return held[1]
        claim = orphans.machine_claim(body)
        remembered[key] = (body, claim)
        return claim

    claims = orphans.claims_of(machines, deps.moved_away, namespaces or None, deps.kube.cached_clusters(), claim_of)
    listed = {(body["metadata"]["namespace"], body["metadata"]["name"]) for body in machines}
    for gone in remembered.keys() - listed:
        del remembered[gone]
    return claims


async def _remove(deps: Dependencies, name: str, namespaces: Sequence[str],
                  due: list[tuple[orphans.HostDomain, frozenset[str]]], record: inventory_.OrphanRecord) -> set[str]:
    """Remove the due orphans that a fresh LIST still shows unclaimed; returns their UUIDs."""
    assert deps.management_cluster is not None
    fresh = orphans.claims_of(await deps.kube.list_libvirt_machines_fresh(namespaces), deps.moved_away,
                              namespaces or None, deps.kube.cached_clusters())
    host = deps.hosts.get(name)
    removed_uuids = set()
    for domain, paths in due:
        if orphans.classify(domain, deps.management_cluster, fresh) is not orphans.Verdict.ORPHAN:
            continue  # claimed after all (the cache was behind): not an orphan
        try:
            removed = await host.remove_orphan(domain, paths)
        except errors.HypervisorError as error:
            log.warning("host %s: orphan %s not removed: %s", name, domain.name, error)
            continue
        removed_uuids.add(domain.uuid)
        record.first_seen.pop(domain.uuid, None)
        if not removed:
            continue  # gone meanwhile (undefined by hand, or by another replica just before it stood by)
        volumes = sum(1 for thing in removed if thing.startswith("volume "))
        record.removed_domains += 1
        record.removed_volumes += volumes
        deps.observe.orphans_removed(name, 1, volumes)
        owner = domain.owner
        whose = f" of LibvirtMachine {owner.namespace}/{owner.name} (uid {owner.uid})" if owner else ""
        log.warning("host %s: removed orphan%s: %s", name, whose, ", ".join(removed))
        await _host_event(deps, name, ORPHAN_REMOVED, f"removed the orphan{whose}: {', '.join(removed)}")
    return removed_uuids


async def _release_moved_away(deps: Dependencies, name: str, findings: orphans.Findings) -> None:
    """Domains of machines deleted here by clusterctl move: their owner metadata no longer names this management
    cluster, so no later round, nor a restarted operator, can take them for orphans; the target's adoption writes
    its own identity."""
    host = deps.hosts.get(name)
    for domain, verdict in findings.kept:
        owner = domain.owner
        if verdict is orphans.Verdict.MOVED_AWAY and owner is not None and \
                owner.management_cluster == deps.management_cluster:
            try:
                await host.set_owner(domain.uuid, dataclasses.replace(owner, management_cluster=None), owner)
            except errors.HypervisorError as error:  # adopted (or gone) meanwhile: nothing to release
                log.info("host %s: owner metadata of %s not released: %s", name, domain.name, error)
                continue
            log.info("host %s: domain %s moved away by clusterctl move: owner metadata released", name, domain.name)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:orphans.LIST_MAX])
    return shown + (f" and {len(names) - orphans.LIST_MAX} more" if len(names) > orphans.LIST_MAX else "")


async def _host_event(deps: Dependencies, name: str, reason: str, message: str) -> None:
    """A Warning event on the LibvirtHost (none for a static --host host, which has no object)."""
    if name in deps.inventory.static:
        return
    body = await deps.kube.get_libvirt_host(name)
    if body is None:
        return
    result = deps.post_event(body, "Warning", reason, message)
    if result is not None:
        await result


async def collect_forever(deps: Dependencies, namespaces: Sequence[str] = (), interval: float = INTERVAL_S) -> None:
    """Every host, every `interval` seconds, one after the other (a host failing is logged; the next round retries)."""
    while True:
        for name in list(deps.inventory.hosts):
            try:
                await collect_host(deps, name, namespaces)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001  the host or the API hiccuped: the next round tries again
                log.warning("orphan collection on host %s failed: %s: %s", name, type(error).__name__, error)
        await asyncio.sleep(interval)


def status_counts(record: inventory_.OrphanRecord) -> dict[str, Any]:
    """The gauges' values for one host."""
    return {"pending": record.pending, "kept": record.kept, "stray_volume": record.stray_volumes}
