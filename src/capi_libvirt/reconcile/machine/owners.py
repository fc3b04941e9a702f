"""The phases before placement: the owner Machine and Cluster, Cluster API's pause, the Cluster's infrastructure,
and the bootstrap data Secret.
"""

from __future__ import annotations

from capi_libvirt.api import meta, reasons
from capi_libvirt.core import capi_objects, conditions
from capi_libvirt.kube import api
from capi_libvirt.reconcile.base import Dependencies, Paused, Wait, is_paused, secrets_forbidden_message
from capi_libvirt.reconcile.machine.identity import recorded_host
from capi_libvirt.reconcile.machine.state import (
    BOOTSTRAP_FORMATS,
    RECHECK_BOOTSTRAP,
    RECHECK_REFUSED_BOOTSTRAP,
    MachinePass,
)


async def find_owner_machine(deps: Dependencies, p: MachinePass) -> None:
    refs = [ref for ref in p.body["metadata"].get("ownerReferences", [])
            if ref.get("kind") == "Machine" and ref.get("apiVersion", "").startswith("cluster.x-k8s.io/")]
    if not refs:
        raise Wait(reasons.WAITING_FOR_OWNER, "waiting for Cluster API to set the owner Machine")
    machine = await deps.kube.get_machine(p.namespace, refs[0]["name"])
    if machine is None:
        raise Wait(reasons.WAITING_FOR_OWNER, f"owner Machine {refs[0]['name']} not found")
    p.machine = capi_objects.MachineView.of(machine)


async def find_cluster(deps: Dependencies, p: MachinePass) -> None:
    cluster_name = p.body["metadata"].get("labels", {}).get(meta.CLUSTER_NAME_LABEL) or \
        (p.machine.cluster_name if p.machine else None)
    if not cluster_name:
        raise Wait(reasons.WAITING_FOR_OWNER, f"waiting for the {meta.CLUSTER_NAME_LABEL} label")
    cluster = await deps.kube.get_cluster(p.namespace, cluster_name)
    if cluster is None:
        raise Wait(reasons.WAITING_FOR_OWNER, f"Cluster {cluster_name} not found")
    p.cluster = capi_objects.ClusterView.of(cluster)


async def honour_pause(deps: Dependencies, p: MachinePass) -> None:
    paused = is_paused(p.body, p.cluster)
    p.status["conditions"] = conditions.set_condition(
        p.status.get("conditions"), conditions.PAUSED, "True" if paused else "False",
        reasons.PAUSED_REASON if paused else reasons.NOT_PAUSED, "reconciliation is paused" if paused else "",
        now=deps.now(), observed_generation=p.body["metadata"].get("generation"))
    if paused:
        raise Paused()


async def wait_for_cluster_infrastructure(deps: Dependencies, p: MachinePass) -> None:
    if p.cluster is None or not p.cluster.infrastructure_provisioned:
        raise Wait(reasons.WAITING_FOR_CLUSTER_INFRASTRUCTURE, "the Cluster's infrastructure is not provisioned yet")


async def read_bootstrap_data(deps: Dependencies, p: MachinePass) -> None:
    """Before placement: nothing is placed for a machine whose data is missing or unusable. Once placed, the Secret
    is read again only if the domain must still be made (ensure_domain), not on every pass."""
    if recorded_host(p.body) is None:
        await fetch_bootstrap_data(deps, p)


async def fetch_bootstrap_data(deps: Dependencies, p: MachinePass) -> None:
    secret_name = p.machine.bootstrap_secret if p.machine else None
    if not secret_name:
        raise Wait(reasons.WAITING_FOR_BOOTSTRAP_DATA, "waiting for the Machine's bootstrap.dataSecretName")
    try:
        p.bootstrap = await deps.kube.get_bootstrap_data(p.namespace, secret_name)
    except api.Forbidden:
        raise Wait(reasons.SECRETS_FORBIDDEN, secrets_forbidden_message(p.namespace, deps.provider_namespace),
                   failure=True) from None
    if p.bootstrap is None:
        raise Wait(reasons.WAITING_FOR_BOOTSTRAP_DATA, f"bootstrap Secret {secret_name} not found", RECHECK_BOOTSTRAP)
    # Both refusals back off (a bootstrap provider may still rewrite the Secret, which is not watched); the format is
    # quoted cut short (it is not secret, but it is anyone's text), the data never.
    if p.bootstrap.format not in BOOTSTRAP_FORMATS:
        raise Wait(reasons.BOOTSTRAP_FORMAT_UNSUPPORTED,
                   f"bootstrap data format {p.bootstrap.format[:64]!r} is not supported; use cloud-config or ignition",
                   RECHECK_REFUSED_BOOTSTRAP, failure=True)
    if not p.bootstrap.value:
        raise Wait(reasons.BOOTSTRAP_DATA_MISSING, f"bootstrap Secret {secret_name} has no data under 'value'",
                   RECHECK_REFUSED_BOOTSTRAP, failure=True)
