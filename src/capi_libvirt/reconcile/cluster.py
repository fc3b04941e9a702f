"""The LibvirtCluster reconcile: the cluster-wide infrastructure contract, so Cluster API moves on to machines.

Phases: skip clusters someone else manages (`cluster.x-k8s.io/managed-by`); find the owner Cluster; honour pause;
settle the control-plane endpoint (the spec's, else the one the user set on the Cluster); report provisioned.
Failure domains are those of the host inventory (LibvirtHost.spec.failureDomain).
"""

from __future__ import annotations

import logging
from typing import Any

from capi_libvirt.api import meta, reasons
from capi_libvirt.core import capi_objects, conditions
from capi_libvirt.reconcile.base import RECHECK_WAITING, Dependencies, is_paused
from capi_libvirt.reconcile.machine.state import DELETE_FOR_MOVE_ANNOTATION

log = logging.getLogger(__name__)

MANAGED_BY_LABEL = "cluster.x-k8s.io/managed-by"
RECHECK_FAILURE_DOMAINS = 60.0  # failure domains follow the inventory


def _owner_cluster_name(body: dict[str, Any]) -> str | None:
    for ref in body["metadata"].get("ownerReferences", []):
        if ref.get("kind") == "Cluster" and ref.get("apiVersion", "").startswith(f"{meta.CAPI_GROUP}/"):
            name: str | None = ref.get("name")
            return name
    return None


def _endpoint(body: dict[str, Any], cluster: dict[str, Any]) -> dict[str, Any] | None:
    for candidate in ((body.get("spec") or {}).get("controlPlaneEndpoint"),
                      (cluster.get("spec") or {}).get("controlPlaneEndpoint")):
        if candidate and candidate.get("host") and candidate.get("port"):
            return {"host": candidate["host"], "port": candidate["port"]}
    return None


async def reconcile(deps: Dependencies, namespace: str, name: str) -> float | None:
    """One pass; returns seconds until the next (None: only when a watch wakes it)."""
    body = await deps.kube.get_libvirt_cluster(namespace, name)
    if body is None:
        return None
    if body["metadata"].get("deletionTimestamp"):
        # Nothing of a LibvirtCluster lives on a host; for clusterctl move's deletion of the source copy, say so.
        if DELETE_FOR_MOVE_ANNOTATION in (body["metadata"].get("annotations") or {}):
            log.info("LibvirtCluster %s/%s deleted by clusterctl move; nothing on the hosts is touched", namespace, name)
        return None
    if MANAGED_BY_LABEL in (body["metadata"].get("labels") or {}):
        return None  # another controller owns this infrastructure
    now, generation = deps.now(), body["metadata"].get("generation")
    status = dict(body.get("status") or {})
    retry: float | None = None
    state: tuple[conditions.Status, str, str]
    cluster_name = _owner_cluster_name(body)
    cluster = await deps.kube.get_cluster(namespace, cluster_name) if cluster_name else None
    if cluster is None:
        state, retry = ("False", reasons.WAITING_FOR_OWNER, "waiting for Cluster API to set the owner Cluster"), RECHECK_WAITING
    elif is_paused(body, capi_objects.ClusterView.of(cluster)):
        status["conditions"] = conditions.set_condition(status.get("conditions"), conditions.PAUSED, "True",
                                                        reasons.PAUSED_REASON, "reconciliation is paused", now=now,
                                                        observed_generation=generation)
        await _write(deps, body, status)
        return None
    elif (endpoint := _endpoint(body, cluster)) is None:
        state, retry = ("False", reasons.WAITING_FOR_ENDPOINT,
                        "set spec.controlPlaneEndpoint here or on the Cluster"), RECHECK_WAITING
    else:
        if (body.get("spec") or {}).get("controlPlaneEndpoint") != endpoint:
            await deps.kube.patch_libvirt_cluster(namespace, name, {"spec": {"controlPlaneEndpoint": endpoint}})
        state, retry = ("True", reasons.PROVISIONED_REASON, ""), RECHECK_FAILURE_DOMAINS
        status.update(ready=True, initialization={"provisioned": True},
                      failureDomains=deps.inventory.failure_domains())
    status["conditions"] = conditions.set_condition(status.get("conditions"), conditions.PAUSED, "False", reasons.NOT_PAUSED,
                                                    "", now=now, observed_generation=generation) \
        if cluster is not None else status.get("conditions")
    status["conditions"] = conditions.set_condition(status.get("conditions"), conditions.PROVISIONED, *state, now=now,
                                                    observed_generation=generation)
    status["conditions"] = conditions.summarize_ready(status["conditions"], now, generation,
                                                      order=(conditions.PROVISIONED,))
    status.setdefault("ready", False)
    status["observedGeneration"] = generation
    await _write(deps, body, status)
    return retry


async def _write(deps: Dependencies, body: dict[str, Any], status: dict[str, Any]) -> None:
    if status != (body.get("status") or {}):
        await deps.kube.patch_libvirt_cluster_status(body["metadata"]["namespace"], body["metadata"]["name"], status)
