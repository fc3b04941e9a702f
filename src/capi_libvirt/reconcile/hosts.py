"""The LibvirtHost reconcile: keep the inventory in step with the objects, and probe every host periodically.

The probe results feed placement and are published as LibvirtHost status (reachable, versions, CPUs, memory,
free memory, this provider's domains, the foreign VMs, pool space) with a Ready condition that names the problem when a host cannot be reached.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NoReturn

import pydantic

from capi_libvirt.api import reasons, v1alpha1_host
from capi_libvirt.core import conditions
from capi_libvirt.hypervisor import credentials, probe
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.kube import api
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile.base import RECHECK_WAITING, Dependencies, Wait, secrets_forbidden_message
from capi_libvirt.reconcile.machine.identity import recorded_host

log = logging.getLogger(__name__)
PROBE_INTERVAL_S = inventory_.PROBE_INTERVAL_S
# A LibvirtHost's status is written when anything in it changed, and otherwise at least this often (its lastProbeTime
# then says the prober is alive): 100 hosts probed every 30 s were 3 status writes a second of an idle fleet.
STATUS_HEARTBEAT_S = 300.0
REACHABLE, UNREACHABLE, INVALID, IN_USE = reasons.REACHABLE, reasons.HOST_UNREACHABLE, reasons.INVALID_SPEC, reasons.HOST_IN_USE
async def _close(replaced: host_api.Host | None) -> None:
    if replaced is not None:
        await asyncio.get_running_loop().run_in_executor(None, replaced.close)


async def _refuse(deps: Dependencies, name: str, reason: str, message: str) -> NoReturn:
    """Out of the inventory (no new machines, no stale credentials), with a condition; raises Wait to be retried."""
    await _close(deps.inventory.remove(name))
    await _publish(deps, name, {"reachable": False}, "False", reason, message)
    raise Wait(reason, message, RECHECK_WAITING)


async def upsert_host(deps: Dependencies, name: str, spec_data: dict[str, Any]) -> None:
    """Add or update the host; raises Wait (retried) while its spec or credentials Secret are not usable."""
    try:
        spec = v1alpha1_host.LibvirtHostSpec.model_validate(spec_data)
        credentials.check_uri(spec.uri)
    except (pydantic.ValidationError, credentials.CredentialsError) as error:
        problem = str(error) if isinstance(error, credentials.CredentialsError) else \
            "invalid spec: " + ", ".join(".".join(map(str, e["loc"])) for e in error.errors())
        await _refuse(deps, name, INVALID, problem)
    secret = None
    if spec.credentials_secret_ref is not None:
        ref = spec.credentials_secret_ref
        if ref.namespace != deps.provider_namespace:  # a tenant namespace's Secret could be read, or swapped, there
            await _refuse(deps, name, reasons.CREDENTIALS_NAMESPACE, f"credentialsSecretRef {ref.namespace}/{ref.name}: host "
                          f"credentials must be in the provider's namespace {deps.provider_namespace}")
        try:
            data = await deps.kube.get_secret_data(ref.namespace, ref.name)
        except api.Forbidden:
            await _refuse(deps, name, reasons.SECRETS_FORBIDDEN, secrets_forbidden_message(ref.namespace,
                                                                                   deps.provider_namespace))
        if data is None:
            await _refuse(deps, name, UNREACHABLE, f"credentials Secret {ref.namespace}/{ref.name} not found")
        secret = credentials.Credentials(data)
    current = deps.inventory.hosts.get(name)
    decommissioning_changed = current is not None and current.spec.decommissioned != spec.decommissioned
    await _close(deps.inventory.upsert(name, spec, secret))
    await probe_and_publish(deps, name)
    if current is None or decommissioning_changed:
        deps.wake_host(name)  # its machines decide again: a copied host's adopted, re-placed, held, or released
    if current is None or current.spec != spec:
        deps.wake_unplaced()  # a new host, or one whose overcommit or rules changed, may take a waiting machine


async def remove_host(deps: Dependencies, name: str) -> None:
    """Take the host out of the inventory; raises Wait while machines are still placed on it."""
    users = sorted(f"{m['metadata']['namespace']}/{m['metadata']['name']}" for m in await deps.kube.list_libvirt_machines()
                   if recorded_host(m) == name)
    if users:
        message = f"{len(users)} machine(s) still placed here: {', '.join(users[:5])}"
        await _publish(deps, name, {}, "False", IN_USE, message)
        raise Wait(IN_USE, message, RECHECK_WAITING)
    deps.inventory.conditions.pop(name, None)
    await _close(deps.inventory.remove(name))


def _changed_domains(before: frozenset[tuple[str, str, str, bool]],
                     after: frozenset[tuple[str, str, str, bool]]) -> set[tuple[str, str]]:
    """The machines (namespace, name) whose domain, seen at the last probe, now runs or stops, or is gone. A domain
    new since then is not a change: its machine made it, and is looking at it."""
    running_now = {(namespace, name, uid): running for namespace, name, uid, running in after}
    return {(namespace, name) for namespace, name, uid, running in before
            if running_now.get((namespace, name, uid)) != running}


async def probe_and_publish(deps: Dependencies, name: str) -> None:
    """Probe, publish, and wake the host's machines when it went down or came back (a machine waiting on it with a
    long backoff converges as soon as the host answers; a provisioned one reports the outage without waiting for its
    next periodic pass), and each machine whose domain changed since the last probe (stopped, paused, running again,
    or gone): a provisioned machine has no timer of its own but the sync period."""
    before = deps.inventory.hosts.get(name)
    was_up, was_down = (before.reachable, before.unreachable_since is not None) if before else (False, False)
    foreign_before = _foreign_load(before.probe) if before and before.probe else None
    domains_before = before.probe.machine_domains if before and before.probe else None
    host = await deps.inventory.probe(name)
    if host is not None and host.probe is not None and domains_before is not None:
        changed = _changed_domains(domains_before, host.probe.machine_domains)
        if changed:  # a domain stopped, paused, came back or is gone: its machine looks now, not at its next pass
            deps.wake_machines(changed)
    if host is not None and ((was_up and not host.reachable) or (was_down and host.reachable)):
        log.info("host %s is %s", name, "reachable again" if host.reachable else "unreachable")
        deps.wake_host(name)
    if host is not None and host.reachable and host.probe is not None and foreign_before is not None and \
            _gained_room(foreign_before, _foreign_load(host.probe)):
        log.info("host %s: foreign VMs take less than at the last probe; machines waiting for a host decide again",
                 name)
        deps.wake_unplaced()
    if host is None or name in deps.inventory.static:
        return  # gone meanwhile, or a static (--host) host with no object to publish on
    if host.spec.decommissioned:
        await _publish(deps, name, inventory_.host_status(host, deps.now()), "False", reasons.DECOMMISSIONED,
                       "spec.decommissioned: gone for good; not probed, nothing placed here")
    elif host.slow:  # reachable: placement goes on with the last figures; else it waits for the first answer
        await _publish(deps, name, inventory_.host_status(host, deps.now()), "True" if host.reachable else "False",
                       reasons.PROBE_SLOW, f"the probe has not answered within {deps.inventory.probe_timeout_s:.0f}s, "
                       "but the connection is alive: busy, not lost; " + (
                           "placement goes on with the last probe's figures" if host.reachable else
                           "nothing is placed here until it answers"))
    elif host.reachable:
        await _publish(deps, name, inventory_.host_status(host, deps.now()), "True", REACHABLE, "")
    else:
        await _publish(deps, name, inventory_.host_status(host, deps.now()), "False", UNREACHABLE,
                       host.problem or "unreachable")


def _foreign_load(probe: probe.HostProbe) -> tuple[int, int]:
    return probe.foreign_cpus, probe.foreign_memory_mib


def _gained_room(before: tuple[int, int], after: tuple[int, int]) -> bool:
    """Foreign VMs take fewer vCPUs or less memory than before (stopped, removed, shrunk)."""
    return after[0] < before[0] or after[1] < before[1]


async def _publish(deps: Dependencies, name: str, status: dict[str, Any], ready: conditions.Status, reason: str,
                   message: str) -> None:
    previous = deps.inventory.conditions.get(name)
    status["conditions"] = conditions.set_condition(previous, conditions.READY, ready, reason, message,
                                                    now=deps.now(), observed_generation=None)
    deps.inventory.conditions[name] = status["conditions"]
    what = {key: value for key, value in status.items() if key != "lastProbeTime"}
    written, when = deps.inventory.published.get(name, (None, 0.0))
    now = deps.inventory.clock()
    if what == written and now - when < STATUS_HEARTBEAT_S:
        return  # nothing new to say, and said recently
    await deps.kube.patch_libvirt_host_status(name, status)
    deps.inventory.published[name] = (what, now)


async def add_missing_hosts(deps: Dependencies) -> list[str]:
    """Every LibvirtHost object (not being deleted) that is not in the inventory, added (upsert_host); returns their
    names. Level-triggered, beside kopf's create/resume handler: a LibvirtHost that clusterctl move creates on a
    running operator carries kopf's diff-base annotation of the source, so kopf takes it for handled and runs no
    handler. A host still refused (a Secret not copied yet) is tried again on the next round."""
    tried = []
    for body in await deps.kube.list_libvirt_hosts():
        name = body["metadata"]["name"]
        if body["metadata"].get("deletionTimestamp") or name in deps.inventory.hosts or name in deps.inventory.static:
            continue
        tried.append(name)
        try:
            await upsert_host(deps, name, dict(body.get("spec") or {}))
        except Wait as wait:
            log.info("LibvirtHost %s not added yet: %s", name, wait.message)
    return tried


async def probe_forever(deps: Dependencies) -> None:
    """Every host, every `deps.probe_interval_s` (PROBE_INTERVAL_S unless configured), concurrently; a host whose
    probe does not answer within its timeout (--host-probe-timeout) is busy or unreachable (reconcile.inventory), so one
    such host delays a round by that much at most, and its late answer is taken as soon as it comes. Each round first
    adds the LibvirtHosts the inventory lacks (add_missing_hosts)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            await add_missing_hosts(deps)
        except Exception as error:  # noqa: BLE001  the API server hiccuped: the next round tries again
            log.warning("listing LibvirtHosts failed: %s", type(error).__name__)
        await _probe_all(deps, list(deps.inventory.hosts))
        next_round = loop.time() + deps.probe_interval_s
        while (remaining := next_round - loop.time()) > 0:
            late = {host.probing: name for name, host in deps.inventory.hosts.items() if host.probing is not None}
            if not late:
                await asyncio.sleep(remaining)
                break
            answered, _ = await asyncio.wait(set(late), timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            await _probe_all(deps, [late[probing] for probing in answered])  # their answers taken at once


async def _probe_all(deps: Dependencies, names: list[str]) -> None:
    results = await asyncio.gather(*(probe_and_publish(deps, name) for name in names), return_exceptions=True)
    for name, result in zip(names, results, strict=True):
        if isinstance(result, Exception):
            log.warning("probe of host %s failed: %s", name, type(result).__name__)
