"""Which host a machine is on and which identity it was placed with: the providerID, the domain record and
former-host annotations, the placement and identity patches, and the adoption of a copy `clusterctl move` made.
"""

from __future__ import annotations

import logging
from typing import Any

from capi_libvirt.api import reasons
from capi_libvirt.core import domain_owner, naming, outage, provider_id
from capi_libvirt.reconcile.base import Dependencies, Wait
from capi_libvirt.reconcile.machine.state import (
    DOMAIN_RECORD_ANNOTATION,
    FINALIZER,
    FORMER_HOSTS_ANNOTATION,
    IDENTITY_ANNOTATION,
    MachinePass,
    event,
)

log = logging.getLogger(__name__)


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


def placement_patch(body: dict[str, Any], host: str) -> dict[str, Any]:
    """The one write that places a machine, guarded by its resourceVersion: our finalizer, the providerID naming the
    host and the domain UUID, the identity annotation (the UID all names derive from, which survives a move), and the
    domain record naming the host already: the pass that places a machine goes on to define its domain there, and the
    record must say so before the define (core.outage). A pass that ends before it sent the define takes the record
    back (`withdraw_unused_record`), so a machine that never had a domain on a host that then fails may still move."""
    finalizers = list(body["metadata"].get("finalizers") or [])
    uid = body["metadata"]["uid"]
    return {
        "metadata": {"finalizers": finalizers + [f for f in [FINALIZER] if f not in finalizers],
                     "annotations": {IDENTITY_ANNOTATION: uid, DOMAIN_RECORD_ANNOTATION: host},
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


async def withdraw_unused_record(deps: Dependencies, p: MachinePass) -> None:
    """A pass that ends without having sent a define, whose host answered that the machine has no domain there, while
    the record names that host (written ahead by the placement, or left so by a pass that died before its define):
    the record goes back to "never defined". Passes of a machine run one at a time, so no define of its own is in
    flight. Guarded by the resourceVersion the pass last saw; a conflict or an API error leaves the record as it is,
    which only says more than happened (safe: the machine waits for its host), and the next such pass tries again."""
    if not p.no_domain_seen or p.define_sent or not p.host or domain_record(p.body) != p.host:
        return
    p.no_domain_seen = False
    try:
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"metadata": {
            "annotations": {DOMAIN_RECORD_ANNOTATION: outage.NEVER_DEFINED},
            "resourceVersion": p.body["metadata"]["resourceVersion"]}})
    except Exception as error:  # noqa: BLE001  the record stays ahead: safe, only less free to move
        log.info("%s/%s: domain record left naming its host: %s", p.namespace, p.name, type(error).__name__)


async def keep_finalizer_and_identity(deps: Dependencies, p: MachinePass) -> None:
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
        raise Wait(reasons.ADOPTION_REFUSED, f"spec.providerID {recorded} names no domain of this machine; not placing it "
                   "again", failure=True)
    annotations = {IDENTITY_ANNOTATION: identity}
    finalizers = list(p.body["metadata"].get("finalizers") or [])
    p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"metadata": {
        "annotations": annotations, "finalizers": finalizers + [f for f in [FINALIZER] if f not in finalizers],
        "resourceVersion": p.body["metadata"]["resourceVersion"]}})
    await event(deps, p.body, "Normal", reasons.ADOPTED, f"adopted domain {naming.domain_uuid(identity)} on host "
                 f"{provider_id.parse_provider_id(recorded).host} by its owner metadata")


def owner_matches(owner: domain_owner.Owner | None, namespace: str, name: str, uuid: str) -> bool:
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
    info = await host.domain_info(parsed.domain_uuid)
    if info is None:
        return None
    owner = domain_owner.parse_owner(info.xml)
    if not owner_matches(owner, body["metadata"]["namespace"], body["metadata"]["name"], parsed.domain_uuid):
        return None
    return owner.uid if owner is not None else None
