"""What one pass over a LibvirtMachine carries from phase to phase (`MachinePass`), the names of its volumes, the
annotations and the finalizer it is marked with, the reasons its conditions and events give, and how an event is
posted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from capi_libvirt.api import meta, v1alpha1
from capi_libvirt.core import address_conflicts, capi_objects, conditions, naming
from capi_libvirt.hypervisor import machines
from capi_libvirt.kube import api
from capi_libvirt.reconcile.base import Dependencies

BOOTSTRAP_FORMATS = ("cloud-config", "ignition")  # cloud-config on a NoCloud ISO; ignition through fw_cfg

# clusterctl move puts this on every source object just before deleting it: the object goes, its machine does not.
DELETE_FOR_MOVE_ANNOTATION = "clusterctl.cluster.x-k8s.io/delete-for-move"
IDENTITY_ANNOTATION = naming.IDENTITY_ANNOTATION
# Where a domain of the machine may have been defined (core.outage): "" from placement, the host's name from just
# before the first define. Only a machine with "" is ever placed on another host.
DOMAIN_RECORD_ANNOTATION = f"{meta.GROUP}/libvirt-domain-defined-on"
# Hosts a machine was moved away from while they were unreachable, whose volumes of it are removed once they answer.
FORMER_HOSTS_ANNOTATION = f"{meta.GROUP}/libvirt-former-hosts"

# Conditions a machine's Ready does not summarise: Paused (Cluster API reports it on its own) and AddressesDiscovered
# (informational: a lease or an agent that flaps while the last known address stands never makes a machine unready).
READY_IGNORES = (conditions.PAUSED, conditions.ADDRESSES_DISCOVERED)

# Seconds until the next pass. Watches on Machines, Clusters and Secrets wake a waiting machine sooner.


RECHECK_BOOTSTRAP = 10.0  # a missing bootstrap Secret: the Machine watch usually wakes us first
RECHECK_ADDRESS = 2.0  # no libvirt event says a lease was given: look again soon (one cheap call)
# A provisioned machine has no timer of its own: its host's probe wakes it when its domain stops, pauses, comes back
# or goes (reconcile.hosts), watches wake it when its objects change, and the sync period (--sync-period) looks at
# every machine anyway. With 2,000 machines a 60 s timer was 33 passes a second of an idle fleet.
RECHECK_PROVISIONED: float | None = None
RECHECK_REFUSED_BOOTSTRAP = 60.0  # bootstrap data refused: a bootstrap provider may still rewrite the Secret
RECHECK_SEED_REMOVAL = 60.0  # the node joined, but its seed could not be removed yet: tried again
RECHECK_IPAM = 3.0  # an IPAM provider answers a claim in about a second; claim events wake the machine sooner


# Cluster API's naming of an infrastructure machine's finalizer. Not kopf's (infrastructure.cluster.x-k8s.io/libvirt,
# on LibvirtHosts and LibvirtClusters): kopf removes its own from objects none of its handlers needs it on.
FINALIZER = f"libvirtmachine.{meta.GROUP}"


@dataclasses.dataclass
class MachinePass:
    """What one pass learns as it goes, phase by phase."""

    body: dict[str, Any]
    spec: v1alpha1.LibvirtMachineSpec
    status: dict[str, Any]
    machine: capi_objects.MachineView | None = None  # the owner Machine, as read this pass
    cluster: capi_objects.ClusterView | None = None
    bootstrap: api.BootstrapData | None = None
    host: str | None = None
    domain: machines.DomainInfo | None = None
    # Interface index -> its addresses, known before the guest boots (its `static`, or an IP pool's allocation).
    addressing: dict[int, v1alpha1.StaticAddressing] = dataclasses.field(default_factory=dict)
    # The base image volume in the image pool: spec.image.volume, or the imported image of spec.image.url.
    image_volume: str | None = None
    # The root disk made or found this pass (ensure_overlay), for the domain made right after it.
    overlay: machines.Overlay | None = None
    # What the host says of the networks and bridges the machine joins (before its domain exists).
    segments: dict[address_conflicts.Segment, address_conflicts.SegmentFacts] | None = None
    # A provisioned pass that left work for later (the seed not removed yet) comes back after this many seconds.
    come_back_after: float | None = None
    # The host answered that the machine has no domain there (checks.check_networks), and whether this pass has sent
    # the define since (its answer may have been lost): a record naming the host with neither may be taken back.
    no_domain_seen: bool = False
    define_sent: bool = False

    @property
    def namespace(self) -> str:
        namespace: str = self.body["metadata"]["namespace"]
        return namespace

    @property
    def name(self) -> str:
        name: str = self.body["metadata"]["name"]
        return name

    @property
    def uid(self) -> str:
        """The machine's identity (naming.identity_uid): the UID it was placed with, which a moved copy keeps."""
        return naming.identity_uid(self.body)

    @property
    def domain_uuid(self) -> str:
        return naming.domain_uuid(self.uid)

    @property
    def domain_name(self) -> str:
        return naming.domain_name(self.namespace, self.name, self.uid)

    def volumes(self) -> machines.MachineVolumes:
        return machine_volumes(self.namespace, self.name, self.uid, self.spec.storage_pool, len(self.spec.data_disks))


def machine_volumes(namespace: str, name: str, uid: str, pool: str, data_disks: int = 0) -> machines.MachineVolumes:
    """The names of the machine's volumes: the Ignition config's always (the bootstrap format is the Secret's, not the
    spec's: teardown looks for both kinds of seed), and `data_disks` data disks."""
    return machines.MachineVolumes(
        pool=pool,
        overlay=naming.overlay_volume_name(namespace, name, uid),
        nocloud=naming.nocloud_volume_name(namespace, name, uid),
        serial_log=naming.serial_log_file_name(namespace, name, uid),
        ignition=naming.ignition_volume_name(namespace, name, uid),
        data_disks=tuple(naming.data_disk_volume_name(namespace, name, uid, index) for index in range(data_disks)),
    )


async def event(deps: Dependencies, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
    result = deps.post_event(body, kind, reason, message)
    if result is not None:
        await result


def volume_names(volumes: machines.MachineVolumes) -> list[str]:
    return volumes.all_names()
