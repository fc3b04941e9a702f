"""Cluster API IPAM (ipam.cluster.x-k8s.io/v1beta2), the pure part: claim names and bodies, and what an IPAddress
gives an interface.

For every pool an interface lists in `addressesFromPools` the machine owns one IPAddressClaim, named from the
machine and the interface and pool indexes (so every pass, and the delete path, finds the same claim without a
LIST); an IPAM provider answers it with an IPAddress (address, prefix, gateway) named in the claim's
status.addressRef. No I/O here: kube.api reads and writes the objects, reconcile.machine decides when.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
from collections.abc import Iterator
from typing import Any

from capi_libvirt.api import meta, v1alpha1

GROUP = "ipam.cluster.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
CLAIMS, ADDRESSES = "ipaddressclaims", "ipaddresses"
NAME_MAX = 253  # a DNS subdomain (what an object name, and the claim's status.addressRef.name, may be)
_HASH = 8


@dataclasses.dataclass(frozen=True)
class ClaimRef:
    """One claim a machine owns: for interface `interface`, its `pool`-th pool."""

    interface: int
    pool: int
    pool_ref: v1alpha1.IPPoolReference
    name: str


def claim_name(machine: str, interface: int, pool: int) -> str:
    """`<machine>-nic<i>-pool<j>`: a DNS subdomain. A machine name is one already; when the result would pass 253
    characters the name is cut and a hash of the full machine name keeps it apart from others cut the same way."""
    suffix = f"-nic{interface}-pool{pool}"
    name = machine + suffix
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(machine.encode()).hexdigest()[:_HASH]
    head = machine[:NAME_MAX - len(suffix) - _HASH - 1].rstrip("-.")
    return f"{head}-{digest}{suffix}"


def claims(machine: str, interfaces: list[v1alpha1.NetworkInterface]) -> Iterator[ClaimRef]:
    """Every claim the machine's interfaces ask for, in interface and pool order."""
    for index, nic in enumerate(interfaces):
        for position, pool in enumerate(nic.addresses_from_pools or []):
            yield ClaimRef(index, position, pool, claim_name(machine, index, position))


def claim_body(machine: dict[str, Any], ref: ClaimRef, cluster_name: str) -> dict[str, Any]:
    """The IPAddressClaim: in the machine's namespace, owned by (and deleted with) the LibvirtMachine, labelled with
    its cluster (so the IPAM provider honours the cluster's pause), asking `ref`'s pool."""
    metadata = machine["metadata"]
    return {
        "apiVersion": API_VERSION, "kind": "IPAddressClaim",
        "metadata": {
            "name": ref.name, "namespace": metadata["namespace"],
            "labels": {meta.CLUSTER_NAME_LABEL: cluster_name},
            "ownerReferences": [{"apiVersion": meta.API_VERSION, "kind": "LibvirtMachine", "name": metadata["name"],
                                 "uid": metadata["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"clusterName": cluster_name, "poolRef": ref.pool_ref.to_api()},
    }


def address_name(claim: dict[str, Any]) -> str | None:
    """The IPAddress the claim was answered with (status.addressRef.name), or None while it waits."""
    name: str | None = (((claim.get("status") or {}).get("addressRef")) or {}).get("name") or None
    return name


def not_ready(claim: dict[str, Any]) -> tuple[str, str] | None:
    """The claim's Ready=False condition as (reason, message), e.g. ("PoolExhausted", ...); else None."""
    for condition in (claim.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "False":
            return str(condition.get("reason") or "NotReady"), str(condition.get("message") or "")
    return None


def waiting_message(ref: ClaimRef, claim: dict[str, Any] | None) -> str:
    """What the machine waits for, naming the claim and the pool, with the claim's Ready=False reason when it has
    one (an exhausted pool)."""
    pool = f"{ref.pool_ref.kind} {ref.pool_ref.name}"
    message = f"waiting for IPAddressClaim {ref.name} (interface {ref.interface}) to get an address from {pool}"
    problem = not_ready(claim) if claim is not None else None
    if problem is not None:
        reason, detail = problem
        message += f": {reason}" + (f": {detail[:256]}" if detail else "")
    return message


def addressing(addresses: list[dict[str, Any]]) -> v1alpha1.StaticAddressing:
    """The interface's addressing from its IPAddresses (one per pool, in pool order): each spec.address with its
    spec.prefix as a CIDR; the first gateway. ValueError when one is malformed."""
    cidrs, gateway = [], None
    for address in addresses:
        spec = address.get("spec") or {}
        interface = ipaddress.ip_interface(f"{spec.get('address')}/{spec.get('prefix')}")
        cidrs.append(f"{interface.ip}/{interface.network.prefixlen}")
        if gateway is None and spec.get("gateway"):
            gateway = str(ipaddress.ip_address(spec["gateway"]))
    try:
        return v1alpha1.StaticAddressing(addresses=cidrs, gateway=gateway)
    except Exception as error:  # pydantic's ValidationError is a ValueError too; one kind for the caller
        raise ValueError(str(error)) from None
