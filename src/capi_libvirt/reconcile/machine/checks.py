"""The checks before anything is made on the host: networks, bridges and the CPU model exist; the owner recorded
in the domain's metadata; the addresses known up front (static or from an IP pool) resolved and free of conflicts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from capi_libvirt.api import meta, reasons
from capi_libvirt.core import address_conflicts, domain_owner, ipam, naming
from capi_libvirt.hypervisor import errors
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.kube import api
from capi_libvirt.reconcile.base import RECHECK_WAITING, Dependencies, Wait
from capi_libvirt.reconcile.machine.identity import domain_record, owner_matches
from capi_libvirt.reconcile.machine.placing import placed_now
from capi_libvirt.reconcile.machine.state import RECHECK_IPAM, MachinePass, event


async def check_networks(deps: Dependencies, p: MachinePass) -> None:
    """Before anything is created: a missing network would otherwise leave an overlay and a domain that cannot start."""
    host = deps.hosts.get(p.host or "")
    p.domain = await host.domain_info(p.domain_uuid)
    p.no_domain_seen = p.domain is None
    if p.domain is not None:
        if not owner_matches(domain_owner.parse_owner(p.domain.xml), p.namespace, p.name, p.domain_uuid):
            raise Wait(reasons.ADOPTION_REFUSED, f"domain {p.domain_uuid} on host {p.host} belongs to another machine; left "
                       "alone", failure=True)
        return  # already defined: it was checked then
    # Placed, nothing made yet: the host's access rules again (its admin may have narrowed them since placement).
    refused = deps.inventory.refusal(p.host or "", p.namespace, p.spec)
    if refused is not None:
        raise Wait(reasons.TENANT_NOT_ALLOWED, str(refused), failure=True)
    segments = [address_conflicts.segment_of(nic.model_dump(by_alias=True)) for nic in p.spec.interfaces]
    try:
        p.segments = await host.segment_facts(segments, p.domain_uuid)
    except errors.NetworkNotFound as error:
        raise Wait(reasons.NETWORK_NOT_FOUND, str(error), failure=True) from None
    machine_types = await host.machine_types(p.spec.domain_type)
    if p.spec.machine_type not in machine_types:
        listed = ", ".join(sorted(machine_types)[:12]) + (", ..." if len(machine_types) > 12 else "")
        raise Wait(reasons.MACHINE_TYPE_NOT_SUPPORTED, f"machineType {p.spec.machine_type!r}: the QEMU of host {p.host} has "
                   f"no such machine type for domainType {p.spec.domain_type} (it has: {listed or 'none'})", None,
                   failure=True)
    if p.spec.cpu_model is not None:
        await _check_cpu_model(host, p)


async def _check_cpu_model(host: host_api.Host, p: MachinePass) -> None:
    """A named CPU model the host cannot run (unknown to its QEMU, or lacking features here) would fail every start:
    refused once, naming the model, the host and what it can run, and not retried (the spec is immutable; deleting
    the machine is what is left to do)."""
    model = p.spec.cpu_model or ""
    found = await host.cpu_models(model, p.spec.domain_type, p.spec.machine_type)
    if found.usable:
        return
    why = "cannot run it" if found.known else "does not know it"
    usable = ", ".join(found.usable_models[:12]) + (", ..." if len(found.usable_models) > 12 else "")
    raise Wait(reasons.CPU_MODEL_NOT_SUPPORTED, f"cpuModel {model!r}: host {p.host} {why} for domainType "
               f"{p.spec.domain_type} (usable there: {usable or 'none'})", None, failure=True)


async def record_owner(deps: Dependencies, p: MachinePass) -> None:
    """The domain's owner metadata names this management cluster: a domain adopted after clusterctl move (made by the
    source's operator), released by a move source, or made by a release before management cluster identities.
    Rewritten in place (virDomainSetMetadata): the domain is neither redefined nor restarted. Only then can the
    orphan collector of this management cluster, and no other, ever tell it is ours."""
    if p.domain is None or not deps.management_cluster:
        return
    owner = domain_owner.parse_owner(p.domain.xml)
    if owner is None or owner.management_cluster == deps.management_cluster:
        return
    host = deps.hosts.get(p.host or "")
    await host.set_owner(p.domain_uuid, dataclasses.replace(owner, management_cluster=deps.management_cluster), owner)
    p.domain = await host.domain_info(p.domain_uuid)
    await event(deps, p.body, "Normal", reasons.OWNER_RECORDED, f"domain {p.domain_name} on host {p.host} now records this "
                 f"management cluster as its owner (was {owner.management_cluster or 'none'})")


async def resolve_addressing(deps: Dependencies, p: MachinePass) -> None:
    """The addresses each interface has before the guest boots: its `static` addressing, or what its IP pools
    allocated. For each pool of `addressesFromPools` the machine owns an IPAddressClaim (core.ipam), made here when
    missing; the pass waits (WaitingForIPAddress, naming the claim and the pool, and the claim's Ready=False reason,
    such as PoolExhausted) until every claim names an IPAddress. Runs every pass, also once the domain exists: its
    result is what status.addresses publishes up front."""
    addressing = {index: nic.static for index, nic in enumerate(p.spec.interfaces) if nic.static is not None}
    allocated: dict[int, list[dict[str, Any]]] = {}
    waiting: str | None = None
    cluster = (p.cluster.name if p.cluster else "") or \
        p.body["metadata"].get("labels", {}).get(meta.CLUSTER_NAME_LABEL, "")
    for ref in ipam.claims(p.name, p.spec.interfaces):
        claim = await deps.kube.get_ip_address_claim(p.namespace, ref.name)
        if claim is None:
            try:
                claim = await deps.kube.create_ip_address_claim(ipam.claim_body(p.body, ref, cluster))
            except api.Forbidden as error:
                raise Wait(reasons.IPAM_FORBIDDEN, f"{error}: the provider's ClusterRole must allow ipaddressclaims",
                           failure=True) from None
            await event(deps, p.body, "Normal", reasons.IP_ADDRESS_CLAIM_CREATED, f"created IPAddressClaim {ref.name} for "
                         f"interface {ref.interface} from {ref.pool_ref.kind} {ref.pool_ref.name}")
        if not any(owner.get("uid") == p.body["metadata"]["uid"]
                   for owner in claim["metadata"].get("ownerReferences") or []):
            # A claim of that name another object owns (a deleted machine of the same name, its claim not gone yet).
            waiting = waiting or f"IPAddressClaim {ref.name} exists but is not this machine's; waiting for it to go"
            continue
        name = ipam.address_name(claim)
        address = await deps.kube.get_ip_address(p.namespace, name) if name else None
        if address is None:
            waiting = waiting or ipam.waiting_message(ref, claim)
            continue
        if ((address.get("spec") or {}).get("claimRef") or {}).get("name") != ref.name:
            raise Wait(reasons.INVALID_IP_ADDRESS, f"IPAddress {name} named by IPAddressClaim {ref.name} was not made "
                       "for that claim (spec.claimRef)", failure=True)
        allocated.setdefault(ref.interface, []).append(address)
    if waiting is not None:
        raise Wait(reasons.WAITING_FOR_IP_ADDRESS, waiting, RECHECK_IPAM)
    for index, addresses in allocated.items():
        try:
            addressing[index] = ipam.addressing(addresses)
        except ValueError as error:
            raise Wait(reasons.INVALID_IP_ADDRESS, f"the IPAddresses of interface {index} are not usable: {error}"[:512],
                       failure=True) from None
    p.addressing = addressing


async def check_addresses(deps: Dependencies, p: MachinePass) -> None:
    """Before anything is made: no address or MAC that is the network's own, outside its subnet, or another machine's
    or VM's on the same host and network (core.address_conflicts). A conflict with a holder is looked at again (the
    holder may go); one with the network itself is not retried."""
    if p.domain is not None or p.segments is None:
        return
    nics = [address_conflicts.Nic(index, address_conflicts.segment_of(nic.model_dump(by_alias=True)),
                                  (nic.mac_address or naming.mac_address(p.uid, index)).lower(),
                                  tuple(p.addressing[index].addresses) if index in p.addressing else (),
                                  tuple(nic.allowed_addresses or ()))
            for index, nic in enumerate(p.spec.interfaces)]
    mine = (p.body["metadata"].get("creationTimestamp") or "", p.name, p.namespace)
    # What another machine asks for is its own when it asked first, or once its domain may be defined (it may be
    # starting with that address, before it publishes it).
    holders = [address_conflicts.holder(other.get("spec") or {}, other.get("status") or {},
                                        bool(domain_record(other)) or
                                        (other["metadata"].get("creationTimestamp") or "", other["metadata"]["name"],
                                         other["metadata"]["namespace"]) < mine)
               for other in await _placed_on_host(deps, p.host)
               if other["metadata"]["uid"] != p.body["metadata"]["uid"]]
    conflict = address_conflicts.first_conflict(nics, p.segments, holders)
    if conflict is not None:
        raise Wait(reasons.ADDRESS_CONFLICT, conflict.message,
                   RECHECK_WAITING if conflict.may_pass else None, failure=True)


async def _placed_on_host(deps: Dependencies, host: str | None) -> list[dict[str, Any]]:
    await placed_now(deps)
    return deps.placed.on_host(host) if host else []
