"""The running machine's addresses: observed (known up front, the lease, the guest agent, the ARP table),
its traffic filter pinned to a leased address, and the workload cluster's Node given the providerID.
"""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET

from capi_libvirt.api import reasons
from capi_libvirt.core import conditions, machine_addresses, naming, provider_id, traffic_filter
from capi_libvirt.hypervisor import errors
from capi_libvirt.kube import api
from capi_libvirt.reconcile.base import Dependencies, Wait
from capi_libvirt.reconcile.machine.state import RECHECK_ADDRESS, MachinePass, event

log = logging.getLogger(__name__)

async def observe_addresses(deps: Dependencies, p: MachinePass) -> None:
    """Publish the machine's addresses (core.machine_addresses): those known up front (p.addressing) as soon as the domain
    runs, then what discovery finds, the last discovered kept while discovery finds nothing; the machine is
    provisioned once it has any. The AddressesDiscovered condition says where this look found them, or what it asked."""
    host = deps.hosts.get(p.host or "")
    discovery = await host.domain_addresses(p.domain_uuid)
    known = machine_addresses.known_addresses(p.addressing)
    previous = [a["address"] for a in p.status.get("addresses") or [] if a.get("type") == "InternalIP"]
    internal = machine_addresses.internal_addresses(known, discovery.addresses, previous)
    kept = machine_addresses.kept_addresses(known, discovery.addresses, previous)
    p.status["addresses"] = [{"type": "Hostname", "address": naming.hostname(p.name)}] + \
        [{"type": "InternalIP", "address": address} for address in internal]
    p.status["conditions"] = conditions.set_condition(
        p.status.get("conditions"), conditions.ADDRESSES_DISCOVERED,
        *machine_addresses.discovery_condition(discovery.asked, discovery.source, discovery.addresses, known, kept),
        now=deps.now(), observed_generation=p.body["metadata"].get("generation"))
    if not internal:
        raise Wait(reasons.WAITING_FOR_ADDRESS, "the domain runs; waiting for its address", RECHECK_ADDRESS)
    p.status["ready"] = True  # v1beta1 contract
    p.status["initialization"] = {"provisioned": True}  # v1beta2 contract


async def pin_leased_addresses(deps: Dependencies, p: MachinePass) -> None:
    """A NIC on a libvirt network whose address comes from DHCP starts able to send only a DHCP client's traffic; once
    the host's network has leased it an address, its filter is pinned to that address (core.traffic_filter), on the running domain and
    its definition, without a restart. Asked of the host only while a NIC of the domain read this pass is unpinned."""
    if p.domain is None or p.domain.state != "running":
        return
    unpinned = [nic for nic in ET.fromstring(p.domain.xml).findall("devices/interface[@type='network']")
                if (found := traffic_filter.parse_filterref(nic)) is not None and found.awaiting_lease]
    if not unpinned:
        return
    allowed = {(nic.mac_address or naming.mac_address(p.uid, index)).lower():
               traffic_filter.ipv4_only(nic.allowed_addresses or []) for index, nic in enumerate(p.spec.interfaces)}
    try:
        pinned = await deps.hosts.get(p.host or "").pin_leased_addresses(p.domain_uuid, allowed)
    except errors.HostUnreachable:
        raise
    except errors.HypervisorError as error:  # no provisioning failure: the next pass tries again
        log.warning("%s/%s: traffic filter not pinned yet: %s", p.namespace, p.name, error)
        await event(deps, p.body, "Warning", reasons.TRAFFIC_FILTER_NOT_PINNED, f"the NIC's filter is not pinned yet: {error}")
        return
    for mac, address in pinned:
        await event(deps, p.body, "Normal", reasons.TRAFFIC_FILTER_PINNED, f"the NIC {mac} may now send only from {address}"
                     " (leased by the host's network) and its allowed addresses")



async def patch_workload_node(deps: Dependencies, p: MachinePass) -> None:
    """Give the workload cluster's Node our providerID when its kubelet did not, as the Docker provider does.

    Best effort: until the control plane answers there is no Node to patch, and that is not a provisioning failure.
    Once Cluster API has matched the Node (Machine.status.nodeRef) there is nothing left to do.
    """
    if (p.machine is not None and p.machine.node_joined) or p.cluster is None or \
            not p.cluster.control_plane_initialized:
        return  # matched already, or no control plane to have a Node (and no kubeconfig Secret to read yet)
    nodes = api.WorkloadNodes(deps.kube)
    try:
        kubeconfig = await nodes.kubeconfig(p.namespace, p.cluster.name)
        if kubeconfig is None:
            return
        wanted = provider_id.format_provider_id(p.host or "", p.domain_uuid)
        outcome = await nodes.set_provider_id(kubeconfig, naming.hostname(p.name), wanted)
    except Exception as error:  # an unreachable or half-built workload cluster: try again on the next pass
        log.info("workload cluster of %s/%s not usable yet: %s", p.namespace, p.name, type(error).__name__)
        return
    if outcome == "patched":
        await event(deps, p.body, "Normal", reasons.NODE_PROVIDER_ID_SET, f"set providerID on Node {naming.hostname(p.name)}")
    elif outcome == "other":
        log.warning("Node %s of %s/%s carries another providerID", naming.hostname(p.name), p.namespace, p.name)
