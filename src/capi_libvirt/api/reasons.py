"""Every condition type and reason the provider writes, and every event reason it posts, each with what it means.

The code takes its reasons from here, so each is spelled once; the book's reference pages (Condition reasons, Event
reasons) are generated from this catalogue by `make reference`, and tests/unit/test_reference.py fails when they
drift or when a reason is written in the code without being catalogued here.

A LibvirtMachine's `Provisioned` condition says which step the machine is at or waits for; each change of its reason
is also posted as an event on the machine (Warning when the pass failed, Normal otherwise).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

# The objects a reason appears on, by kind.
MACHINE, CLUSTER, HOST, TEMPLATE = "LibvirtMachine", "LibvirtCluster", "LibvirtHost", "LibvirtMachineTemplate"
EventType = Literal["Normal", "Warning"]


@dataclasses.dataclass(frozen=True)
class ConditionType:
    name: str
    meaning: str
    kinds: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Reason:
    name: str
    meaning: str
    kinds: tuple[str, ...]
    conditions: tuple[str, ...]  # the condition types it is a reason of; () when it is only an event's reason
    event: tuple[EventType, ...] = ()  # the types of the events posted with it; () when none is


CONDITION_TYPES: list[ConditionType] = []
REASONS: list[Reason] = []


def _type(name: str, meaning: str, *kinds: str) -> str:
    CONDITION_TYPES.append(ConditionType(name, meaning, kinds))
    return name


def _reason(name: str, meaning: str, kinds: tuple[str, ...], conditions: tuple[str, ...],
            event: tuple[EventType, ...] = ()) -> str:
    REASONS.append(Reason(name, meaning, kinds, conditions, event))
    return name


# Condition types.
READY = _type("Ready", "The summary: True when every other condition that counts is True (on a machine, "
              "Provisioned; Paused and AddressesDiscovered do not count).", MACHINE, CLUSTER, HOST)
PROVISIONED = _type("Provisioned", "The machine's VM exists and runs, or the step it is at or waits for.", MACHINE)
PAUSED = _type("Paused", "True while the owner Cluster or the object carries Cluster API's paused mark: nothing is "
               "reconciled but this condition.", MACHINE, CLUSTER)
DELETING = _type("Deleting", "Set while a deletion cannot finish yet, with the reason it waits for.", MACHINE)
ADDRESSES_DISCOVERED = _type("AddressesDiscovered", "Where the last look found the machine's addresses "
                             "(informational: Ready ignores it).", MACHINE)
EDITED_IN_PLACE_TYPE = _type("EditedInPlace", "True when the template's spec changed after creation: machines made "
                             "from it keep their shape; only a new template rolls them.", TEMPLATE)

_M, _C, _H = (MACHINE,), (CLUSTER,), (HOST,)
_PROVISIONED, _READY = (PROVISIONED,), (READY,)
_BOTH: tuple[EventType, ...] = ("Normal", "Warning")
_NORMAL: tuple[EventType, ...] = ("Normal",)
_WARNING: tuple[EventType, ...] = ("Warning",)

# A machine's Provisioned reasons, in the order a machine meets them.
WAITING_FOR_OWNER = _reason("WaitingForOwner", "Cluster API has not set the owner Machine (or Cluster) yet.",
                            (MACHINE, CLUSTER), (PROVISIONED, READY), _NORMAL)
PAUSED_REASON = _reason(PAUSED, "Reconciliation is paused (the Cluster's or the object's paused mark).",
                        (MACHINE, CLUSTER), (PAUSED, PROVISIONED), _NORMAL)
NOT_PAUSED = _reason("NotPaused", "Reconciliation is not paused.", (MACHINE, CLUSTER), (PAUSED,))
WAITING_FOR_CLUSTER_INFRASTRUCTURE = _reason(
    "WaitingForClusterInfrastructure", "The Cluster's infrastructure (its LibvirtCluster) is not provisioned yet.",
    _M, _PROVISIONED, _NORMAL)
WAITING_FOR_BOOTSTRAP_DATA = _reason("WaitingForBootstrapData", "The bootstrap provider has not written the "
                                     "Machine's bootstrap data Secret yet.", _M, _PROVISIONED, _NORMAL)
BOOTSTRAP_DATA_MISSING = _reason("BootstrapDataMissing", "The bootstrap data Secret exists, but holds nothing under "
                                 "`value`.", _M, _PROVISIONED, _BOTH)
BOOTSTRAP_FORMAT_UNSUPPORTED = _reason("BootstrapFormatUnsupported", "The Secret's `format` is neither cloud-config "
                                       "nor ignition.", _M, _PROVISIONED, _BOTH)
SECRETS_FORBIDDEN = _reason("SecretsForbidden", "The operator may not read Secrets in the machine's namespace (the "
                            "namespace lacks the RoleBinding to capi-libvirt-secrets).", _M, _PROVISIONED, _BOTH)
INVALID_SPEC = _reason("InvalidSpec", "The spec (or the LibvirtHost's) is malformed or contradicts itself; the message "
                       "names the field.", (MACHINE, HOST), (PROVISIONED, READY), _BOTH)
ADOPTION_REFUSED = _reason("AdoptionRefused", "A preset providerID names a VM this machine may not take (a foreign VM, "
                           "or another machine's).", _M, _PROVISIONED, _BOTH)
HOST_NOT_FOUND = _reason("HostNotFound", "The pinned host (spec.host) is not a LibvirtHost or a --host the operator "
                         "knows.", _M, _PROVISIONED, _BOTH)
HOST_UNREACHABLE = _reason("HostUnreachable", "The host's libvirt daemon cannot be reached (refused, timed out, "
                           "authentication failed); retried.", (MACHINE, HOST), (PROVISIONED, READY, DELETING), _BOTH)
HOST_DECOMMISSIONED = _reason("HostDecommissioned", "The host is being decommissioned: nothing new is placed there "
                              "and its machines are replaced elsewhere.", _M, (PROVISIONED, DELETING), _WARNING)
TENANT_NOT_ALLOWED = _reason("TenantNotAllowed", "No host's access rules allow this namespace what the spec asks "
                             "(namespace, network, bridge, pool, image, address).", _M, _PROVISIONED, _BOTH)
QUOTA_EXCEEDED = _reason("QuotaExceeded", "The machine would take its namespace over a quota of the host's access "
                         "rules; the message names the quota and the usage.", _M, _PROVISIONED, _BOTH)
INSUFFICIENT_CAPACITY = _reason("InsufficientCapacity", "No allowed host has the memory, vCPUs or storage the machine "
                                "needs left; the message says what is needed and what is left.", _M, _PROVISIONED,
                                _BOTH)
NO_HOST_IN_FAILURE_DOMAIN = _reason("NoHostInFailureDomain", "No host serves the Machine's failure domain.", _M,
                                    _PROVISIONED, _BOTH)
POOL_NOT_FOUND = _reason("PoolNotFound", "The storage pool the machine needs is not active on the host (or on any "
                         "candidate).", _M, _PROVISIONED, _BOTH)
NETWORK_NOT_FOUND = _reason("NetworkNotFound", "A libvirt network the spec names does not exist on the host.", _M,
                            _PROVISIONED, _BOTH)
TRAFFIC_FILTER_NOT_FOUND = _reason("TrafficFilterNotFound", "The host lacks the nwfilter the machine's NICs need "
                                   "(libvirt's clean-traffic): the host's nwfilter driver is missing.", _M,
                                   _PROVISIONED, _BOTH)
CPU_MODEL_NOT_SUPPORTED = _reason("CPUModelNotSupported", "The host's QEMU does not offer the CPU model the spec "
                                  "asks.", _M, _PROVISIONED, _BOTH)
MACHINE_TYPE_NOT_SUPPORTED = _reason("MachineTypeNotSupported", "The host's QEMU does not offer the machine type "
                                     "the spec asks.", _M, _PROVISIONED, _BOTH)
ADDRESS_CONFLICT = _reason("AddressConflict", "A static or pool address, or a MAC, belongs to someone else on the "
                           "network (its gateway or DHCP server, another machine, outside its subnet); nothing was "
                           "created.", _M, _PROVISIONED, _BOTH)
WAITING_FOR_IP_ADDRESS = _reason("WaitingForIPAddress", "An IPAddressClaim (addressesFromPools) has no address yet; "
                                 "the message names the claim, the pool and the pool's own reason.", _M,
                                 _PROVISIONED, _NORMAL)
INVALID_IP_ADDRESS = _reason("InvalidIPAddress", "The IPAddress a pool gave cannot be used (no address, a bad "
                             "prefix or gateway).", _M, _PROVISIONED, _BOTH)
IPAM_FORBIDDEN = _reason("IPAddressClaimsForbidden", "The operator may not create or delete IPAddressClaims in the "
                         "machine's namespace.", _M, _PROVISIONED, _WARNING)
IMAGE_NOT_FOUND = _reason("ImageNotFound", "The base image volume is not in the host's pool.", _M, _PROVISIONED, _BOTH)
BASE_IMAGE_LABELLED = _reason("BaseImageLabelled", "The base image is not readable by every user of the host (or has "
                               "a backing file of its own): libvirt labels it for the QEMU user, and on hosts with "
                               "dynamic ownership never gives it back; make it 0644 to share it as it is.", _M, (),
                               _WARNING)
IMAGE_IMPORTING = _reason("ImageImporting", "spec.image.url is being imported into the host's pool (once per host and "
                          "sha256); the message names the image, the pool and the host.", _M, _PROVISIONED, _NORMAL)
IMAGE_DOWNLOAD_FAILED = _reason("ImageDownloadFailed", "The image download failed (HTTP error, TLS, proxy, size); "
                                "retried.", _M, _PROVISIONED, _BOTH)
IMAGE_CHECKSUM_MISMATCH = _reason("ImageChecksumMismatch", "The downloaded image's sha256 is not the one the spec "
                                  "gives; nothing is kept.", _M, _PROVISIONED, _BOTH)
IMAGE_REFUSED = _reason("ImageRefused", "The image is a qcow2 naming a backing or external data file: a host path "
                        "behind the image.", _M, _PROVISIONED, _BOTH)
INSUFFICIENT_STORAGE = _reason("InsufficientStorage", "The pool has no room for the image being imported.", _M,
                               _PROVISIONED, _BOTH)
DOMAIN_HOST_MISMATCH = _reason("DomainHostMismatch", "The providerID names another host than the one the machine "
                               "is placed on.", _M, _PROVISIONED, _BOTH)
WAITING_FOR_ADDRESS = _reason("WaitingForAddress", "The VM runs; no address is known yet (DHCP lease, guest agent, "
                              "ARP).", _M, _PROVISIONED, _NORMAL)
HYPERVISOR_ERROR = _reason("HypervisorError", "A libvirt call failed for another reason; the message is libvirt's, "
                           "with URIs cut out; retried with backoff.", _M, (PROVISIONED, DELETING), _BOTH)
RECONCILE_ERROR = _reason("ReconcileError", "An unexpected error; the operator's log has the traceback; retried with "
                          "backoff.", _M, _PROVISIONED, _BOTH)
PROVISIONED_REASON = _reason(PROVISIONED, "The VM is defined and running, its providerID and addresses published.",
                             (MACHINE, CLUSTER), (PROVISIONED, READY), _NORMAL)
DELETION_FAILED = _reason("DeletionFailed", "Removing the VM's domain or volumes failed; retried.", _M, (DELETING,),
                          _WARNING)
NO_CONDITIONS = _reason("NoConditions", "Ready, before any other condition was judged.", _M, _READY)

# A machine's AddressesDiscovered reasons: where the addresses came from, or that nothing answered.
DHCP_LEASE = _reason("DHCPLease", "From the libvirt network's DHCP leases.", _M, (ADDRESSES_DISCOVERED,))
GUEST_AGENT = _reason("GuestAgent", "From the QEMU guest agent.", _M, (ADDRESSES_DISCOVERED,))
ARP_TABLE = _reason("ARPTable", "From the host's ARP table (bridged NICs).", _M, (ADDRESSES_DISCOVERED,))
NOTHING_DISCOVERED = _reason("NothingDiscovered", "No source answered; status.addresses keeps the last addresses "
                             "found.", _M, (ADDRESSES_DISCOVERED,))

# A LibvirtCluster's reasons.
WAITING_FOR_ENDPOINT = _reason("WaitingForControlPlaneEndpoint", "spec.controlPlaneEndpoint is not set yet.", _C,
                               _READY)

# A LibvirtHost's Ready reasons.
REACHABLE = _reason("Reachable", "The last probe reached the host's libvirt daemon.", _H, _READY)
PROBE_SLOW = _reason("ProbeSlow", "The probe in flight has not answered within its timeout, but the connection is "
                     "alive (libvirt's keepalive): the host is busy, not lost. Placement goes on with the last "
                     "probe's figures (Ready stays True; with none yet, Ready is False until the probe answers). If "
                     "it stays unanswered far longer (two minutes), the host counts as unreachable.", _H, _READY)
HOST_IN_USE = _reason("HostInUse", "The host is being deleted, but machines still run on it: the deletion waits.", _H,
                      _READY)
DECOMMISSIONED = _reason("Decommissioned", "spec.decommission is set: no new machines; its machines are replaced "
                         "elsewhere.", _H, _READY)
CREDENTIALS_NAMESPACE = _reason("CredentialsNamespaceNotAllowed", "The credentials Secret is outside the provider's "
                                "namespace, the only one it may read host credentials from.", _H, _READY)

# A LibvirtMachineTemplate's.
EDITED_IN_PLACE = _reason(EDITED_IN_PLACE_TYPE, "The spec changed after creation; machines already made keep theirs.",
                          (TEMPLATE,), (EDITED_IN_PLACE_TYPE,))

# Reasons only events carry, on LibvirtMachines.
PLACED = _reason("Placed", "The machine was placed on a host.", _M, (), _NORMAL)
REPLACED = _reason("Replaced", "The machine's host was unreachable or decommissioned past the grace period and the "
                   "machine had no VM there: placed on another host instead.", _M, (), _WARNING)
ADOPTED = _reason("Adopted", "An existing domain was adopted (after clusterctl move, or a preset providerID this "
                  "machine owns).", _M, (), _NORMAL)
OWNER_RECORDED = _reason("OwnerRecorded", "The domain's metadata now records this management cluster as its "
                         "owner.", _M, (), _NORMAL)
IP_ADDRESS_CLAIM_CREATED = _reason("IPAddressClaimCreated", "An IPAddressClaim was created for an interface's "
                                   "pool.", _M, (), _NORMAL)
IP_ADDRESS_RELEASED = _reason("IPAddressReleased", "The machine's IPAddressClaim was deleted, its address back in "
                              "the pool.", _M, (), _NORMAL)
DOMAIN_DEFINED = _reason("DomainDefined", "The domain was defined on the host.", _M, (), _NORMAL)
DOMAIN_RESUMED = _reason("DomainResumed", "The domain was found paused for a reason that mends itself (an I/O "
                         "error after space was freed, a save) and was resumed.", _M, (), _WARNING)
TRAFFIC_FILTER_PINNED = _reason("TrafficFilterPinned", "A DHCP NIC's filter now lets it send only from its leased "
                                "address.", _M, (), _NORMAL)
TRAFFIC_FILTER_NOT_PINNED = _reason("TrafficFilterNotPinned", "Pinning a NIC's filter to its lease failed; retried "
                                    "on the next pass.", _M, (), _WARNING)
NODE_PROVIDER_ID_SET = _reason("NodeProviderIDSet", "The workload cluster's Node got the machine's providerID.", _M,
                               (), _NORMAL)
NOCLOUD_ISO_REMOVED = _reason("NoCloudISODetached", "The node joined: the NoCloud ISO holding the bootstrap data was "
                              "detached and deleted.", _M, (), _NORMAL)
NOCLOUD_ISO_NOT_REMOVED = _reason("NoCloudISONotRemoved", "Removing the NoCloud ISO failed; retried.", _M, (),
                                  _WARNING)
IGNITION_CONFIG_REMOVED = _reason("IgnitionConfigRemoved", "The node joined: the Ignition config left the domain's "
                                  "definition, and its file on the host was emptied (deleted with the machine) or "
                                  "deleted.", _M, (), _NORMAL)
IGNITION_CONFIG_NOT_REMOVED = _reason("IgnitionConfigNotRemoved", "Removing the Ignition config failed; retried.", _M,
                                      (), _WARNING)
DELETED_FOR_MOVE = _reason("DeletedForMove", "clusterctl move deleted the object: its VM stays for the target "
                           "management cluster.", _M, (), _NORMAL)
DELETED = _reason("Deleted", "The machine's VM and volumes were removed from the host.", _M, (), _NORMAL)

# Reasons only events carry, on LibvirtHosts.
ORPHAN_FOUND = _reason("OrphanFound", "Domains made by this management cluster whose machine is gone were found on "
                       "the host.", _H, (), _WARNING)
ORPHAN_REMOVED = _reason("OrphanRemoved", "Orphans past the grace period were removed from the host.", _H, (),
                         _WARNING)
