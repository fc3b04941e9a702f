"""The LibvirtMachine reconcile: from bootstrap data to a running domain, and back to nothing.

`reconcile` is level-triggered and idempotent: it reads the object (from the watch-fed cache, see kube.api), runs the
phases in order, and each phase either moves on or raises `Wait` with the reason that becomes the Provisioned
condition's. Every host operation is idempotent and keyed by names and a domain UUID fixed before anything is created
(core.naming), so a retry, a duplicate event or a restart in the middle converges on the same single domain.

Placement is one write: the finalizer, spec.providerID (which names the host and the domain UUID) and the identity
annotation (the UID every name derives from, which a copy made by clusterctl move keeps) together, before anything is
made on the host. A copy arriving with a providerID is adopted (its status rebuilt from the host), never placed again;
one deleted by clusterctl move (delete-for-move) releases its finalizer without touching the host. The status follows in one write at the end of each pass that changed it. Deletion
(`delete`, once the object has a deletionTimestamp) tears everything down, "not found" counting as done, and then
releases the finalizer; an unreachable host keeps it, with a condition saying why. Creation on a host is limited to
`Dependencies.creates_per_host` machines at a time, so a burst cannot swamp one hypervisor.

The package, in the order a pass meets it: `state` (what a pass carries, the machine's names, annotations, finalizer
and reasons), `owners` (owner Machine and Cluster, pause, bootstrap data), `identity` (which host, which identity;
adoption of a moved copy), `placing` (placement and replacement), `checks` (networks, CPU model, owner record,
addresses), `provisioning` (image, disks, seed, domain), `addresses` (observed, filters pinned, the Node's
providerID), `seed_removal` (the bootstrap data off the host once the node joined), `passes` (the phases in order and
the status written), `teardown` (deletion). What every reconcile shares (`Dependencies`, `Wait`, backoff) is a floor
below, in reconcile.base. The names below are the package's face to the operator and the tests.
"""

from __future__ import annotations

from capi_libvirt.reconcile.base import (
    BACKOFF_FIRST,
    ORPHAN_GRACE_S,
    RECHECK_WAITING,
    Dependencies,
    Observer,
    Wait,
    is_paused,
    secrets_forbidden_message,
    utc_now,
)
from capi_libvirt.reconcile.machine.addresses import observe_addresses
from capi_libvirt.reconcile.machine.checks import check_networks, resolve_addressing
from capi_libvirt.reconcile.machine.identity import (
    former_hosts,
    identity_migration_patch,
    placement_patch,
    recorded_host,
)
from capi_libvirt.reconcile.machine.passes import PHASES, reconcile
from capi_libvirt.reconcile.machine.placing import choose_host
from capi_libvirt.reconcile.machine.provisioning import ensure_domain, ensure_overlay
from capi_libvirt.reconcile.machine.seed_removal import remove_nocloud_iso
from capi_libvirt.reconcile.machine.state import (
    DELETE_FOR_MOVE_ANNOTATION,
    DOMAIN_RECORD_ANNOTATION,
    FINALIZER,
    FORMER_HOSTS_ANNOTATION,
    IDENTITY_ANNOTATION,
    READY_IGNORES,
    RECHECK_PROVISIONED,
    RECHECK_SEED_REMOVAL,
    MachinePass,
    machine_volumes,
)
from capi_libvirt.reconcile.machine.teardown import _release_ip_address_claims, delete

__all__ = [
    "BACKOFF_FIRST",
    "DELETE_FOR_MOVE_ANNOTATION",
    "DOMAIN_RECORD_ANNOTATION",
    "Dependencies",
    "FINALIZER",
    "FORMER_HOSTS_ANNOTATION",
    "IDENTITY_ANNOTATION",
    "MachinePass",
    "ORPHAN_GRACE_S",
    "Observer",
    "PHASES",
    "READY_IGNORES",
    "RECHECK_PROVISIONED",
    "RECHECK_SEED_REMOVAL",
    "RECHECK_WAITING",
    "Wait",
    "_release_ip_address_claims",
    "check_networks",
    "choose_host",
    "delete",
    "ensure_domain",
    "ensure_overlay",
    "former_hosts",
    "identity_migration_patch",
    "is_paused",
    "machine_volumes",
    "observe_addresses",
    "placement_patch",
    "reconcile",
    "recorded_host",
    "remove_nocloud_iso",
    "resolve_addressing",
    "secrets_forbidden_message",
    "utc_now",
]
