"""Which domains and volumes on a host are this management cluster's orphans, and which must never be touched.

Pure: the host's domains (with their owner metadata and the files they use), the LibvirtMachines of this management
cluster and its identity in, a verdict per domain out. The safety rule, in the order `classify` applies it:

1. No owner metadata of ours: NOT_OURS (a domain someone else made, whatever its name looks like).
2. Metadata whose UUID or name does not derive from its own UID (naming): NOT_OURS (metadata copied onto another
   domain proves nothing).
3. A namespace the operator does not watch: UNWATCHED (its machines are invisible here, so "gone" is not known).
4. Claimed by a LibvirtMachine here: by identity (the identity annotation, metadata.uid, the domain UUID its
   providerID or status names) or by namespace/name (a machine being created, or a copy adopted by its name):
   CLAIMED.
5. Deleted by clusterctl move from here (delete-for-move): MOVED_AWAY. The move target adopts it; the caller releases
   the owner metadata so that no later pass (nor a restarted operator) takes it for an orphan.
6. Its cluster (the owner's Cluster, in the owner's namespace) is paused here, as clusterctl move pauses the source:
   PAUSED. Cluster API's contract: nothing of a paused cluster is acted on.
7. Owner metadata of another management cluster: OTHER_MANAGEMENT_CLUSTER; none at all (an older release, or released
   by a move): NO_PROOF. Both are reported at most, never removed.
8. Otherwise (this management cluster made it, and no machine here claims it): ORPHAN.

Volumes are removed only with their orphan domain, and only those that are provably its own: the exact names naming
derives from the owner (overlay, data disks, NoCloud ISO, Ignition config, serial log), at a path the orphan domain
itself uses (a disk, the serial log, a fw_cfg file), that no other domain on the host uses. A volume that merely looks like ours (our naming scheme without a domain to prove it, a
suffix added, another domain's disk) has no such proof and stays; `stray_volumes` reports scheme-shaped volumes no
domain accounts for, never for removal. Imported base images (core.images: `capi-image-sha256-<hex>` and its
`.verified` marker) are shared by machines and are never a stray, nor an orphan's volume.
"""

from __future__ import annotations

import dataclasses
import enum
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from capi_libvirt.api import meta, v1alpha1
from capi_libvirt.core import images, naming, provider_id
from capi_libvirt.core.domain_owner import Owner

LIST_MAX = 10  # names in LibvirtHost status and in an event message
_SCHEME = re.compile(r"^capi-[a-z0-9-]+-[0-9a-f]{8}(\.qcow2|-data-[0-9]+\.qcow2|-cidata\.iso|\.ign|\.serial\.log)$")


class Verdict(enum.Enum):
    NOT_OURS = "NotOurs"
    UNWATCHED = "Unwatched"
    CLAIMED = "Claimed"
    MOVED_AWAY = "MovedAway"
    PAUSED = "ClusterPaused"
    OTHER_MANAGEMENT_CLUSTER = "OtherManagementCluster"
    NO_PROOF = "NoProof"
    ORPHAN = "Orphan"


REPORTED_NOT_REMOVED = (Verdict.MOVED_AWAY, Verdict.PAUSED, Verdict.OTHER_MANAGEMENT_CLUSTER, Verdict.NO_PROOF)


@dataclasses.dataclass(frozen=True)
class HostDomain:
    """A domain as the host lists it: UUID, name, parsed owner metadata (None: none of ours), the files it uses."""

    uuid: str
    name: str
    owner: Owner | None
    paths: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Claims:
    """What the LibvirtMachines of this management cluster claim; built by `claims_of`."""

    identities: frozenset[str] = frozenset()
    domain_uuids: frozenset[str] = frozenset()
    names: frozenset[tuple[str, str]] = frozenset()
    moved_away: frozenset[str] = frozenset()
    namespaces: frozenset[str] | None = None  # watched namespaces; None: all
    paused_clusters: frozenset[tuple[str, str]] = frozenset()  # (namespace, name) of paused Clusters


@dataclasses.dataclass(frozen=True)
class MachineClaim:
    """What one LibvirtMachine could be the owner of: its identities (UID, annotated identity), the domain UUIDs its
    providerID and status name, and its namespace and name."""

    identities: frozenset[str]
    domain_uuids: frozenset[str]
    name: tuple[str, str]


def machine_claim(body: Mapping[str, Any]) -> MachineClaim:
    metadata = body.get("metadata") or {}
    annotated = (metadata.get("annotations") or {}).get(naming.IDENTITY_ANNOTATION)
    identities = frozenset(uid for uid in (metadata.get("uid"), annotated, naming.identity_uid(dict(body))) if uid)
    uuids = set()
    recorded = (body.get("spec") or {}).get("providerID")
    if recorded:
        try:
            uuids.add(provider_id.parse_provider_id(recorded).domain_uuid)
        except ValueError:
            pass
    status_uuid = (body.get("status") or {}).get("domainUUID")
    if status_uuid:
        uuids.add(str(status_uuid))
    return MachineClaim(identities, frozenset(uuids), (metadata.get("namespace") or "", metadata.get("name") or ""))


def claims_of(machines: Iterable[Mapping[str, Any]], moved_away: Iterable[str] = (),
              namespaces: Iterable[str] | None = None, clusters: Iterable[Mapping[str, Any]] = (),
              claim_of: Callable[[Mapping[str, Any]], MachineClaim] = machine_claim) -> Claims:
    """Everything each LibvirtMachine (in any state, being deleted included) could be the owner of, and the paused
    Clusters among `clusters`. `claim_of` reads one machine's claim (a caller may remember them: reconcile.orphans)."""
    parts = [claim_of(body) for body in machines]
    paused = frozenset((str(c["metadata"].get("namespace") or ""), str(c["metadata"]["name"])) for c in clusters
                       if (c.get("spec") or {}).get("paused") or
                       meta.PAUSED_ANNOTATION in (c["metadata"].get("annotations") or {}))
    return Claims(frozenset().union(*(part.identities for part in parts)),
                  frozenset().union(*(part.domain_uuids for part in parts)),
                  frozenset(part.name for part in parts), frozenset(moved_away),
                  None if namespaces is None else frozenset(namespaces), paused)


def consistent(domain: HostDomain) -> bool:
    """The domain's UUID and name are the ones naming derives from its owner: the metadata was written for it."""
    owner = domain.owner
    if owner is None:
        return False
    try:
        return domain.uuid == naming.domain_uuid(owner.uid) and \
            domain.name == naming.domain_name(owner.namespace, owner.name, owner.uid)
    except ValueError:
        return False


def moved_away_keys(body: Mapping[str, Any]) -> set[str]:
    """What marks a LibvirtMachine clusterctl deleted for move: its identity and the domain UUID its providerID names.
    clusterctl replaces the whole annotation map with its delete-for-move one, so a machine moved before (its identity
    annotation no longer on it, its UID not its identity) is known by the domain UUID alone."""
    keys = {naming.identity_uid(dict(body))}
    try:
        keys.add(provider_id.parse_provider_id((body.get("spec") or {})["providerID"]).domain_uuid)
    except (KeyError, ValueError):
        pass
    return keys - {""}


def classify(domain: HostDomain, management_cluster: str, claims: Claims) -> Verdict:
    """The verdict on one domain (see the module docstring for the order of the rules)."""
    owner = domain.owner
    if owner is None or not consistent(domain):
        return Verdict.NOT_OURS
    if claims.namespaces is not None and owner.namespace not in claims.namespaces:
        return Verdict.UNWATCHED
    if owner.uid in claims.identities or domain.uuid in claims.domain_uuids or \
            (owner.namespace, owner.name) in claims.names:
        return Verdict.CLAIMED
    if owner.uid in claims.moved_away or domain.uuid in claims.moved_away:
        return Verdict.MOVED_AWAY
    if owner.cluster and (owner.namespace, owner.cluster) in claims.paused_clusters:
        return Verdict.PAUSED
    if owner.management_cluster is None:
        return Verdict.NO_PROOF
    if owner.management_cluster != management_cluster:
        return Verdict.OTHER_MANAGEMENT_CLUSTER
    return Verdict.ORPHAN


def owned_volume_names(owner: Owner) -> frozenset[str]:
    """The names naming gives the owner's volumes: overlay, data disks (as many as a spec may have), NoCloud ISO,
    Ignition config, serial log."""
    ns, name, uid = owner.namespace, owner.name, owner.uid
    return frozenset({naming.overlay_volume_name(ns, name, uid), naming.nocloud_volume_name(ns, name, uid),
                      naming.ignition_volume_name(ns, name, uid), naming.serial_log_file_name(ns, name, uid),
                      *(naming.data_disk_volume_name(ns, name, uid, index)
                        for index in range(v1alpha1.MAX_DATA_DISKS))})


def removable_paths(orphan: HostDomain, others: Iterable[HostDomain]) -> frozenset[str]:
    """The files of an orphan domain that go with it: used by it, named exactly as naming names its owner's volumes,
    used by no other domain."""
    if orphan.owner is None:
        return frozenset()
    names = owned_volume_names(orphan.owner)
    used_elsewhere = {path for other in others if other.uuid != orphan.uuid for path in other.paths}
    return frozenset(path for path in orphan.paths
                     if posixpath.basename(path) in names and path not in used_elsewhere)


def stray_volumes(volume_names: Iterable[str], domains: Iterable[HostDomain]) -> list[str]:
    """Volumes named in our scheme that no domain on the host uses: reported, never removed (no proof whose)."""
    used = {posixpath.basename(path) for domain in domains for path in domain.paths}
    return sorted(name for name in volume_names
                  if _SCHEME.match(name) and not images.is_image_volume(name) and name not in used)


@dataclasses.dataclass(frozen=True)
class Findings:
    """One host's verdicts: the orphans (with the files that go with each) and what is reported but kept."""

    orphans: tuple[tuple[HostDomain, frozenset[str]], ...]
    kept: tuple[tuple[HostDomain, Verdict], ...]
    stray_volumes: tuple[str, ...] = ()


def find(domains: list[HostDomain], management_cluster: str, claims: Claims,
         volume_names: Iterable[str] = ()) -> Findings:
    orphans, kept = [], []
    for domain in domains:
        verdict = classify(domain, management_cluster, claims)
        if verdict is Verdict.ORPHAN:
            orphans.append((domain, removable_paths(domain, domains)))
        elif verdict in REPORTED_NOT_REMOVED:
            kept.append((domain, verdict))
    return Findings(tuple(orphans), tuple(kept), tuple(stray_volumes(volume_names, domains)))


def due(first_seen: float, now: float, grace_s: float | None) -> bool:
    """Whether an orphan first seen at `first_seen` may be removed at `now` (None: never, report only)."""
    return grace_s is not None and now - first_seen >= grace_s


def status(findings: Findings, removed_total: int, grace_s: float | None) -> dict[str, Any]:
    """LibvirtHost.status.orphans: counts, and bounded lists of names."""
    return {
        "count": len(findings.orphans),
        "domains": sorted(domain.name for domain, _ in findings.orphans)[:LIST_MAX],
        "removed": removed_total,
        "keptCount": len(findings.kept),
        "kept": sorted(f"{domain.name} ({verdict.value})" for domain, verdict in findings.kept)[:LIST_MAX],
        "strayVolumes": len(findings.stray_volumes),
        "gracePeriodSeconds": None if grace_s is None else int(grace_s),
    }
