"""A deleted LibvirtMachine torn down: its IP address claims released, its domain and volumes removed from its
host ("not found" counting as done), the finalizer released last; a machine deleted by clusterctl move, or on a
decommissioned host, is released without touching the host.
"""

from __future__ import annotations

import logging
from typing import Any

import pydantic

from capi_libvirt.api import meta, reasons, v1alpha1
from capi_libvirt.core import capi_objects, conditions, ipam, naming, outage, provider_id
from capi_libvirt.hypervisor import errors, machines
from capi_libvirt.kube import api
from capi_libvirt.reconcile.base import (
    BACKOFF_FIRST,
    RECHECK_WAITING,
    Dependencies,
    Wait,
    is_paused,
    wait_for_hypervisor,
    with_backoff,
)
from capi_libvirt.reconcile.machine.identity import domain_record, former_hosts, identity_from_domain, recorded_host
from capi_libvirt.reconcile.machine.state import (
    DELETE_FOR_MOVE_ANNOTATION,
    FINALIZER,
    READY_IGNORES,
    event,
    machine_volumes,
    volume_names,
)

log = logging.getLogger(__name__)

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
        await event(deps, body, "Normal", reasons.DELETED_FOR_MOVE, "deleted by clusterctl move; the domain on host "
                     f"{recorded_host(body) or '(none recorded)'} is left to the moved copy")
        return await _release_finalizer(deps, body)
    cluster_name = body["metadata"].get("labels", {}).get(meta.CLUSTER_NAME_LABEL)
    cluster = await deps.kube.get_cluster(namespace, cluster_name) if cluster_name else None
    if is_paused(body, capi_objects.ClusterView.of(cluster) if cluster else None):
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
                await event(deps, body, "Normal", reasons.IP_ADDRESS_RELEASED, f"deleted IPAddressClaim {ref.name}")
        except api.Forbidden:
            await event(deps, body, "Warning", reasons.IPAM_FORBIDDEN, f"may not delete IPAddressClaim {ref.name}; "
                         "its owner reference lets the garbage collector remove it")
        except Exception as error:  # noqa: BLE001  the API hiccuped: again, with backoff
            log.info("deleting IPAddressClaim %s/%s failed: %s", namespace, ref.name, type(error).__name__)
            raise with_backoff(deps, key, Wait(reasons.RECONCILE_ERROR, "deleting IPAddressClaims failed")) from None
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
                await event(deps, body, "Warning", reasons.HOST_DECOMMISSIONED,
                             outage.what_may_remain(former, None, volume_names(volumes)))
            elif not await _released_from_decommissioned(deps, body, former, None, volumes):
                await deps.hosts.get(former).delete_machine(naming.domain_uuid(uid), uid, volumes, namespace, name)
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
        removed = await host.delete_machine(naming.domain_uuid(uid), uid, volumes, namespace, name)
    except errors.HypervisorError as error:
        wait = wait_for_hypervisor(error)
        if not isinstance(error, errors.HostUnreachable):
            wait.reason = reasons.DELETION_FAILED
        status["conditions"] = conditions.set_condition(
            status.get("conditions"), conditions.DELETING, "True", wait.reason, f"cannot delete yet: {error}",
            now=deps.now(), observed_generation=body["metadata"].get("generation"))
        status["conditions"] = conditions.summarize_ready(status["conditions"], deps.now(),
                                                          body["metadata"].get("generation"), ignore=READY_IGNORES)
        await deps.kube.patch_libvirt_machine_status(namespace, name, status)
        raise with_backoff(deps, key, wait) from None
    deps.failures.pop(key, None)
    if removed:
        await event(deps, body, "Normal", reasons.DELETED, f"removed from host {host_name}: {', '.join(removed)}")




async def _released_from_decommissioned(deps: Dependencies, body: dict[str, Any], host: str, domain: str | None,
                                        volumes: machines.MachineVolumes) -> bool:
    """A decommissioned host is never asked: True, with a Warning event naming what of the machine may remain there
    (`domain` when one may have been defined)."""
    if not deps.inventory.state(host).decommissioned:
        return False
    log.warning("%s/%s: host %s is decommissioned; releasing without touching it", body["metadata"]["namespace"],
                body["metadata"]["name"], host)
    await event(deps, body, "Warning", reasons.HOST_DECOMMISSIONED,
                 outage.what_may_remain(host, domain, volume_names(volumes)))
    return True
