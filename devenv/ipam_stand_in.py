"""A STAND-IN for Cluster API's in-cluster IPAM provider (cluster-api-ipam-provider-in-cluster), for the test bed only.

The real provider cannot be fetched here (the Go module proxy refuses it), so this plays its part, following the
IPAM contract as the provider does (read from its documentation and source for facts, written anew):

- Pools are `InClusterIPPool` objects (ipam.cluster.x-k8s.io/v1alpha2, namespaced), served by a CRD of the same
  shape this module installs (POOL_CRD): spec.addresses (single IPs, ranges `a-b`, CIDRs), spec.prefix,
  spec.gateway. As the provider does by default, the gateway and each CIDR's network and broadcast addresses are
  never handed out.
- For each IPAddressClaim (v1beta2) whose poolRef names such a pool: the ReleaseAddress finalizer goes on the
  claim first; then an IPAddress named like the claim (spec.address, prefix, gateway, claimRef, poolRef; owned by the
  claim as its controller and by the pool; the ProtectAddress finalizer; the claim's cluster-name label) and the
  claim's status.addressRef with a Ready=True condition. No free address: Ready=False, reason PoolExhausted
  (Cluster API's IPAddressClaimReadyPoolExhaustedReason). A pool that does not exist: Ready=False, PoolNotReady.
- A claim being deleted: its IPAddress loses ProtectAddress and is deleted, then the claim loses ReleaseAddress, so
  the address is free again.
- Claims of a paused Cluster (the cluster-name label or spec.clusterName) are left alone, as the provider does.

It polls (every POLL_S) instead of watching: a few objects in a test namespace. Run it with `running(api_client)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

GROUP = "ipam.cluster.x-k8s.io"
POOL_VERSION, POOL_KIND, POOLS = "v1alpha2", "InClusterIPPool", "inclusterippools"
IPAM_VERSION = "v1beta2"  # Cluster API's IPAddressClaim and IPAddress
RELEASE_FINALIZER = "ipam.cluster.x-k8s.io/ReleaseAddress"
PROTECT_FINALIZER = "ipam.cluster.x-k8s.io/ProtectAddress"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
POOL_EXHAUSTED, POOL_NOT_READY = "PoolExhausted", "PoolNotReady"
POLL_S = 0.5
MERGE = {"_content_type": "application/merge-patch+json"}

POOL_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{POOLS}.{GROUP}"},
    "spec": {
        "group": GROUP, "scope": "Namespaced",
        "names": {"kind": POOL_KIND, "listKind": f"{POOL_KIND}List", "plural": POOLS, "singular": "inclusterippool"},
        "versions": [{
            "name": POOL_VERSION, "served": True, "storage": True, "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "required": ["addresses", "prefix"], "properties": {
                    "addresses": {"type": "array", "items": {"type": "string"}},
                    "prefix": {"type": "integer", "minimum": 0, "maximum": 128},
                    "gateway": {"type": "string"}}},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}},
        }],
    },
}


def pool_addresses(spec: dict[str, Any]) -> Iterator[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses a pool hands out, in order: its single IPs, ranges and CIDRs (no network and broadcast address
    of a CIDR), never its gateway."""
    gateway = ipaddress.ip_address(spec["gateway"]) if spec.get("gateway") else None
    for entry in spec.get("addresses") or []:
        if "/" in entry:
            network = ipaddress.ip_network(entry, strict=False)
            candidates: Iterator[Any] = network.hosts() if network.num_addresses > 2 else iter(network)
        elif "-" in entry:
            first, last = (ipaddress.ip_address(part.strip()) for part in entry.split("-", 1))
            candidates = (ipaddress.ip_address(int(first) + step) for step in range(int(last) - int(first) + 1))
        else:
            candidates = iter([ipaddress.ip_address(entry)])
        for candidate in candidates:
            if candidate != gateway:
                yield candidate


def _condition(status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": "Ready", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


class StandIn:
    """One pass over every claim (`reconcile_once`); `run` repeats it until cancelled."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.objects = client.CustomObjectsApi(api_client)
        self.allocations = 0  # addresses handed out, for the tests' figures
        self.releases = 0

    async def run(self) -> None:
        while True:
            try:
                await self.reconcile_once()
            except ApiException as error:  # a conflict or a racing delete: the next pass sees the new state
                log.info("IPAM stand-in pass: %s %s", error.status, error.reason)
            await asyncio.sleep(POLL_S)

    async def reconcile_once(self) -> None:
        claims = (await self.objects.list_cluster_custom_object(GROUP, IPAM_VERSION, "ipaddressclaims"))["items"]
        for claim in claims:
            pool_ref = claim["spec"].get("poolRef") or {}
            if pool_ref.get("apiGroup") == GROUP and pool_ref.get("kind") == POOL_KIND:
                await self.reconcile_claim(claim)

    async def _paused(self, claim: dict[str, Any]) -> bool:
        name = claim["spec"].get("clusterName") or (claim["metadata"].get("labels") or {}).get(CLUSTER_NAME_LABEL)
        if not name:
            return False
        try:
            cluster = await self.objects.get_namespaced_custom_object(
                "cluster.x-k8s.io", "v1beta2", claim["metadata"]["namespace"], "clusters", name)
        except ApiException as error:
            if error.status == 404:
                return not claim["metadata"].get("deletionTimestamp")  # as the provider: skip, unless deleting
            raise
        return bool(cluster.get("spec", {}).get("paused")) or \
            "cluster.x-k8s.io/paused" in (cluster["metadata"].get("annotations") or {})

    async def reconcile_claim(self, claim: dict[str, Any]) -> None:
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        finalizers = claim["metadata"].get("finalizers") or []
        if await self._paused(claim):
            return
        if claim["metadata"].get("deletionTimestamp"):
            if RELEASE_FINALIZER in finalizers:
                await self._release(namespace, name)
                await self.objects.patch_namespaced_custom_object(
                    GROUP, IPAM_VERSION, namespace, "ipaddressclaims", name,
                    {"metadata": {"finalizers": [f for f in finalizers if f != RELEASE_FINALIZER] or None,
                                  "resourceVersion": claim["metadata"]["resourceVersion"]}}, **MERGE)
            return
        if RELEASE_FINALIZER not in finalizers:
            await self.objects.patch_namespaced_custom_object(
                GROUP, IPAM_VERSION, namespace, "ipaddressclaims", name,
                {"metadata": {"finalizers": [*finalizers, RELEASE_FINALIZER],
                              "resourceVersion": claim["metadata"]["resourceVersion"]}}, **MERGE)
            return  # as the provider: the finalizer first, the address on the next pass
        pool_name = claim["spec"]["poolRef"]["name"]
        try:
            pool = await self.objects.get_namespaced_custom_object(GROUP, POOL_VERSION, namespace, POOLS, pool_name)
        except ApiException as error:
            if error.status != 404:
                raise
            await self._status(namespace, name, None, _condition("False", POOL_NOT_READY,
                                                                 f"{POOL_KIND} {pool_name} not found"))
            return
        address = await self._address(namespace, name)
        if address is None:
            address = await self._allocate(claim, pool)
            if address is None:
                await self._status(namespace, name, None, _condition(
                    "False", POOL_EXHAUSTED, f"{POOL_KIND} {pool_name} has no free address"))
                return
        if (claim.get("status") or {}).get("addressRef", {}).get("name") != name:
            await self._status(namespace, name, {"name": name}, _condition("True", "Ready", ""))

    async def _status(self, namespace: str, name: str, address_ref: dict[str, str] | None,
                      condition: dict[str, Any]) -> None:
        claim = await self.objects.get_namespaced_custom_object(GROUP, IPAM_VERSION, namespace, "ipaddressclaims", name)
        current = [c for c in (claim.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
        if current and all(current[0].get(k) == condition[k] for k in ("status", "reason", "message")) and \
                (claim.get("status") or {}).get("addressRef") == address_ref:
            return
        status: dict[str, Any] = {"conditions": [condition]}
        if address_ref is not None:
            status["addressRef"] = address_ref
        await self.objects.patch_namespaced_custom_object_status(
            GROUP, IPAM_VERSION, namespace, "ipaddressclaims", name, {"status": status}, **MERGE)

    async def _address(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.objects.get_namespaced_custom_object(GROUP, IPAM_VERSION, namespace, "ipaddresses", name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def _allocate(self, claim: dict[str, Any], pool: dict[str, Any]) -> dict[str, Any] | None:
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        listed = await self.objects.list_namespaced_custom_object(GROUP, IPAM_VERSION, namespace, "ipaddresses")
        in_use = {ipaddress.ip_address(a["spec"]["address"]) for a in listed["items"]
                  if a["spec"].get("poolRef", {}).get("name") == pool["metadata"]["name"]
                  and a["spec"].get("poolRef", {}).get("kind") == POOL_KIND}
        free = next((candidate for candidate in pool_addresses(pool["spec"]) if candidate not in in_use), None)
        if free is None:
            return None
        labels = {CLUSTER_NAME_LABEL: claim["metadata"]["labels"][CLUSTER_NAME_LABEL]} \
            if CLUSTER_NAME_LABEL in (claim["metadata"].get("labels") or {}) else {}
        spec: dict[str, Any] = {"address": str(free), "prefix": pool["spec"]["prefix"], "claimRef": {"name": name},
                                "poolRef": {"apiGroup": GROUP, "kind": POOL_KIND, "name": pool["metadata"]["name"]}}
        if pool["spec"].get("gateway"):
            spec["gateway"] = pool["spec"]["gateway"]
        body = {"apiVersion": f"{GROUP}/{IPAM_VERSION}", "kind": "IPAddress",
                "metadata": {"name": name, "namespace": namespace, "labels": labels, "finalizers": [PROTECT_FINALIZER],
                             "ownerReferences": [
                                 {"apiVersion": f"{GROUP}/{IPAM_VERSION}", "kind": "IPAddressClaim", "name": name,
                                  "uid": claim["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True},
                                 {"apiVersion": f"{GROUP}/{POOL_VERSION}", "kind": POOL_KIND,
                                  "name": pool["metadata"]["name"], "uid": pool["metadata"]["uid"],
                                  "blockOwnerDeletion": True}]},
                "spec": spec}
        created = await self.objects.create_namespaced_custom_object(GROUP, IPAM_VERSION, namespace, "ipaddresses",
                                                                     body)
        self.allocations += 1
        log.info("IPAM stand-in: %s/%s gets %s from %s", namespace, name, free, pool["metadata"]["name"])
        return created

    async def _release(self, namespace: str, name: str) -> None:
        address = await self._address(namespace, name)
        if address is None:
            return
        finalizers = [f for f in address["metadata"].get("finalizers") or [] if f != PROTECT_FINALIZER]
        await self.objects.patch_namespaced_custom_object(GROUP, IPAM_VERSION, namespace, "ipaddresses", name,
                                                          {"metadata": {"finalizers": finalizers or None}}, **MERGE)
        with contextlib.suppress(ApiException):
            await self.objects.delete_namespaced_custom_object(GROUP, IPAM_VERSION, namespace, "ipaddresses", name)
        self.releases += 1
        log.info("IPAM stand-in: released %s/%s (%s)", namespace, name, address["spec"].get("address"))


@contextlib.asynccontextmanager
async def running(api_client: client.ApiClient) -> AsyncIterator[StandIn]:
    """The stand-in, polling in the caller's event loop until the block ends."""
    stand_in = StandIn(api_client)
    task = asyncio.create_task(stand_in.run())
    try:
        yield stand_in
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pool(name: str, namespace: str, addresses: list[str], prefix: int, gateway: str | None = None) -> dict[str, Any]:
    """An InClusterIPPool object."""
    spec: dict[str, Any] = {"addresses": addresses, "prefix": prefix}
    if gateway:
        spec["gateway"] = gateway
    return {"apiVersion": f"{GROUP}/{POOL_VERSION}", "kind": POOL_KIND,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
