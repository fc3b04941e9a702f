"""The LibvirtHost reconcile: keep the inventory in step with the objects, and probe every host periodically.

The probe results feed placement and are published as LibvirtHost status (reachable, versions, CPUs, memory,
this provider's domains, pool space) with a Ready condition that names the problem when a host cannot be reached.
"""

from __future__ import annotations

import asyncio
import logging

import pydantic

from capi_libvirt.api import v1alpha1
from capi_libvirt.core import conditions
from capi_libvirt.hypervisor import connection, credentials
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile.machine import Dependencies

log = logging.getLogger(__name__)
PROBE_INTERVAL_S = 30.0
REACHABLE, UNREACHABLE, INVALID = "Reachable", "HostUnreachable", "InvalidSpec"


async def _close(replaced: connection.HostConnection | None) -> None:
    if replaced is not None:
        await asyncio.get_running_loop().run_in_executor(None, replaced.close)


async def upsert_host(deps: Dependencies, name: str, spec_data: dict) -> None:
    try:
        spec = v1alpha1.LibvirtHostSpec.model_validate(spec_data)
    except pydantic.ValidationError as error:
        fields = ", ".join(".".join(map(str, e["loc"])) for e in error.errors())
        await _publish(deps, name, {"reachable": False}, "False", INVALID, f"invalid spec: {fields}")
        return
    secret = None
    if spec.credentials_secret_ref is not None:
        ref = spec.credentials_secret_ref
        data = await deps.kube.get_secret_data(ref.namespace, ref.name)
        if data is None:
            await _publish(deps, name, {"reachable": False}, "False", UNREACHABLE,
                           f"credentials Secret {ref.namespace}/{ref.name} not found")
            return
        secret = credentials.Credentials(data)
    await _close(deps.inventory.upsert(name, spec, secret))
    deps.object_hosts.add(name)
    await probe_and_publish(deps, name)


async def remove_host(deps: Dependencies, name: str) -> None:
    deps.object_hosts.discard(name)
    await _close(deps.inventory.remove(name))


async def probe_and_publish(deps: Dependencies, name: str) -> None:
    host = await deps.inventory.probe(name)
    if name not in deps.object_hosts:
        return  # a static (--host) host has no object to publish on
    if host.reachable:
        await _publish(deps, name, inventory_.host_status(host, deps.now()), "True", REACHABLE, "")
    else:
        await _publish(deps, name, inventory_.host_status(host, deps.now()), "False", UNREACHABLE,
                       host.problem or "unreachable")


async def _publish(deps: Dependencies, name: str, status: dict, ready: str, reason: str, message: str) -> None:
    previous = deps.host_conditions.get(name)
    status["conditions"] = conditions.set_condition(previous, conditions.READY, ready, reason, message,
                                                    now=deps.now(), observed_generation=None)
    deps.host_conditions[name] = status["conditions"]
    await deps.kube.patch_libvirt_host_status(name, status)


async def probe_forever(deps: Dependencies) -> None:
    """Every host, every PROBE_INTERVAL_S, concurrently (a slow host delays only itself)."""
    while True:
        names = list(deps.inventory.hosts)
        results = await asyncio.gather(*(probe_and_publish(deps, name) for name in names), return_exceptions=True)
        for name, result in zip(names, results):
            if isinstance(result, Exception):
                log.warning("probe of host %s failed: %s", name, type(result).__name__)
        await asyncio.sleep(PROBE_INTERVAL_S)
