"""One pass over a LibvirtMachine: the phases in order, and the status written at the end (the Provisioned and
Ready conditions, an event when the reason changed). A machine being deleted goes to `teardown`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pydantic

from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core import conditions
from capi_libvirt.hypervisor import errors
from capi_libvirt.kube import api
from capi_libvirt.reconcile.base import Dependencies, Paused, Wait, wait_for_hypervisor, with_backoff
from capi_libvirt.reconcile.machine.addresses import observe_addresses, patch_workload_node, pin_leased_addresses
from capi_libvirt.reconcile.machine.checks import check_addresses, check_networks, record_owner, resolve_addressing
from capi_libvirt.reconcile.machine.identity import adopt_moved_machine, withdraw_unused_record
from capi_libvirt.reconcile.machine.owners import (
    find_cluster,
    find_owner_machine,
    honour_pause,
    read_bootstrap_data,
    wait_for_cluster_infrastructure,
)
from capi_libvirt.reconcile.machine.placing import choose_host, clean_former_hosts
from capi_libvirt.reconcile.machine.provisioning import (
    ensure_domain,
    ensure_image,
    ensure_overlay,
    ensure_running,
    publish_provider_id,
)
from capi_libvirt.reconcile.machine.seed_removal import remove_nocloud_iso
from capi_libvirt.reconcile.machine.state import READY_IGNORES, RECHECK_PROVISIONED, MachinePass, event
from capi_libvirt.reconcile.machine.teardown import delete

log = logging.getLogger(__name__)

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
        await _write_status(deps, body, status, Wait(reasons.INVALID_SPEC, f"invalid spec: {fields}", None, failure=True))
        return None
    p = MachinePass(body=body, spec=spec, status=status)
    try:
        try:
            async with contextlib.AsyncExitStack() as creating:
                for phase in PHASES:
                    if cancelled():
                        await withdraw_unused_record(deps, p)
                        return None
                    if phase is CREATION[0] and p.domain is None:
                        await creating.enter_async_context(deps.creation_slot(p.host or ""))
                    with deps.observe.phase("LibvirtMachine", phase.__name__):
                        await phase(deps, p)
        except Exception:
            await withdraw_unused_record(deps, p)  # no domain there and no define sent: the record says so again
            raise
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
        return await _write_status(deps, p.body, p.status, with_backoff(deps, key, wait) if backoff else wait)
    except errors.HypervisorError as error:
        return await _write_status(deps, p.body, p.status, with_backoff(deps, key, wait_for_hypervisor(error)))
    except Exception as error:  # noqa: BLE001  anything else: a condition that names its kind, details in the log
        log.exception("reconcile of %s/%s failed", namespace, name)
        failed = Wait(reasons.RECONCILE_ERROR, f"unexpected {type(error).__name__}; see the operator log", failure=True)
        return await _write_status(deps, p.body, p.status, with_backoff(deps, key, failed))
    deps.failures.pop(key, None)
    after = await _write_status(deps, p.body, p.status, None)
    return p.come_back_after if after is None else after




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
        await event(deps, body, kind, current["reason"], current.get("message") or "provisioned")
    return wait.retry_after if wait is not None else RECHECK_PROVISIONED
