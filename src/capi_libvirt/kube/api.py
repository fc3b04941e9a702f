"""Kubernetes API calls of the reconciles: owners, clusters, bootstrap Secrets, and our objects' spec and status.

asyncio-native (kube.client, on aiohttp like kopf), so no call blocks the event loop. "Not found" is recognised by
HTTP status 404 and returned as None; every other error propagates. Every request has a deadline
(client.REQUEST_TIMEOUT_S): one that never gets an answer ends in asyncio.TimeoutError, and the reconcile retries.

LibvirtMachines, Machines and Clusters are read from the watch-fed cache (kube.cache): `prime()` fills it with one
LIST of each when the operator starts working, the watches keep it current, and every write's response goes into
it. Only a Machine or Cluster the cache does not hold (yet) is fetched, and then kept. Secrets are never cached: they are read
once, when a machine's NoCloud ISO is built.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Awaitable, Sequence
from typing import Any

import yaml

from capi_libvirt.api import meta
from capi_libvirt.kube import kubeconfig
from capi_libvirt.kube.cache import Change, Key, ObjectCache
from capi_libvirt.kube.client import MERGE_PATCH, ApiError, KubeClient, RateLimit, RequestObserver, object_path

CAPI_GROUP, CAPI_VERSION = meta.CAPI_GROUP, meta.CAPI_VERSION
IPAM_GROUP, IPAM_VERSION = "ipam.cluster.x-k8s.io", "v1beta2"  # Cluster API's IPAddressClaim and IPAddress
COORDINATION_GROUP, COORDINATION_VERSION = "coordination.k8s.io", "v1"
MACHINES, CLUSTERS, LIBVIRT_MACHINES = "machines", "clusters", "libvirtmachines"
# The kinds the cache holds, by plural: (group, version).
CACHED = {MACHINES: (CAPI_GROUP, CAPI_VERSION), CLUSTERS: (CAPI_GROUP, CAPI_VERSION),
          LIBVIRT_MACHINES: (meta.GROUP, meta.VERSION)}


class Conflict(Exception):
    """A write made against an older version of the object: read it again and retry."""


class Forbidden(Exception):
    """The API refused a read (HTTP 403): the provider lacks the RBAC for it (e.g. Secrets of a namespace)."""


@dataclasses.dataclass(frozen=True)
class BootstrapData:
    value: bytes | None  # None: the Secret has no `value` key
    format: str  # cloud-config or ignition (as read: any bytes, decoded with replacement characters)

    def __repr__(self) -> str:  # bootstrap data can hold credentials: never in a log line or a traceback
        size = "missing" if self.value is None else f"<{len(self.value)} bytes>"
        return f"BootstrapData(format={self.format!r}, value={size})"


def new_api_client(context: str | None = None, observe: RequestObserver | None = None,
                   rate_limit: RateLimit | None = None) -> KubeClient:
    """A client of the management cluster: the ServiceAccount in a pod, else the kubeconfig (its current context, or
    `context`); `observe` sees every request's method and status."""
    return KubeClient(kubeconfig.load(context), observe, rate_limit)


async def _or_none(request: Awaitable[Any]) -> Any:
    try:
        return await request
    except ApiError as error:
        if error.status == 404:
            return None
        raise


def describe_error(error: BaseException) -> str:
    """A request's failure in a few words for a log line or a probe: the HTTP status and reason, else the error's
    class (never the response body, which may quote the request)."""
    if isinstance(error, ApiError):
        return str(error)
    return type(error).__name__


def _items(listed: Any) -> list[dict[str, Any]]:
    return list((listed or {}).get("items") or [])


class KubeAPI:
    def __init__(self, api_client: KubeClient, cache: ObjectCache | None = None) -> None:
        self.client = api_client
        self.cache = cache if cache is not None else ObjectCache()
        self.primed = False  # the cache holds every LibvirtMachine: placement may count from it
        self.calls = 0  # API calls made, for the numbers (docs/book/src/development/numbers.md)

    async def _request(self, method: str, path: str, body: Any = None, *, merge: bool = False) -> Any:
        self.calls += 1
        if merge:
            return await self.client.request(method, path, body, content_type=MERGE_PATCH)
        return await self.client.request(method, path, body)

    async def prime(self, namespaces: list[str]) -> None:
        """One LIST of each cached kind (all namespaces, or each watched one) into the cache."""
        for plural in CACHED:
            await self.relist(plural, namespaces)
        self.primed = True

    async def relist(self, plural: str, namespaces: list[str]) -> list[Key]:
        """One LIST of a cached kind into the cache; returns the keys of the objects dropped (held, but gone)."""
        group, version = CACHED[plural]
        scopes: list[str | None] = [*namespaces] or [None]  # None: all namespaces
        items: list[dict[str, Any]] = []
        list_version = None
        for namespace in scopes:
            listed = await self._request("GET", object_path(group, version, plural, namespace))
            items += _items(listed)
            list_version = (listed or {}).get("metadata", {}).get("resourceVersion") if len(namespaces) <= 1 else None
        return self.cache.replace_all(plural, items, list_version)

    async def _cached(self, group: str, version: str, plural: str, namespace: str, name: str,
                      fetch_missing: bool = True) -> dict[str, Any] | None:
        body = self.cache.get(plural, namespace, name)
        if body is None and fetch_missing:
            body = await _or_none(self._request("GET", object_path(group, version, plural, namespace, name)))
            if body is not None:
                self.cache.put(plural, body)
        return body

    async def get_machine(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._cached(CAPI_GROUP, CAPI_VERSION, MACHINES, namespace, name)

    async def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._cached(CAPI_GROUP, CAPI_VERSION, CLUSTERS, namespace, name)

    async def get_libvirt_machine(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Once primed, the cache holds every LibvirtMachine: one it lacks was deleted or its event is on the way
        (and queues it again). A Machine or Cluster the cache lacks is fetched: waiting for its event would write a
        passing WaitingForOwner condition first."""
        return await self._cached(meta.GROUP, meta.VERSION, LIBVIRT_MACHINES, namespace, name,
                                  fetch_missing=not self.primed)

    async def reread_libvirt_machine(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Fetched, not from the cache: after a Conflict."""
        body = await _or_none(self._request("GET", _ours(LIBVIRT_MACHINES, namespace, name)))
        if body is not None:
            self.cache.put(LIBVIRT_MACHINES, body)
        return body

    async def get_libvirt_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await _or_none(self._request("GET", _ours("libvirtclusters", namespace, name)))

    async def patch_libvirt_cluster(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = await self._request("PATCH", _ours("libvirtclusters", namespace, name), patch,
                                                   merge=True)
        return body

    async def patch_libvirt_cluster_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = await self._request("PATCH", _ours("libvirtclusters", namespace, name, "status"),
                                                   {"status": status}, merge=True)
        return body

    async def list_libvirt_machines(self) -> list[dict[str, Any]]:
        """Every LibvirtMachine (of the watched namespaces): what is allocated on each host, and each group's spread."""
        if self.primed:
            return list(self.cache.items(LIBVIRT_MACHINES))
        return _items(await self._request("GET", _ours(LIBVIRT_MACHINES)))

    def libvirt_machine_changes(self, since: int) -> tuple[int, list[Change] | None] | None:
        """The LibvirtMachines changed since change number `since` (kube.cache.ObjectCache.changes); None before the
        cache is primed: list them all instead."""
        return self.cache.changes(LIBVIRT_MACHINES, since) if self.primed else None

    def cached_clusters(self) -> list[dict[str, Any]]:
        """The Clusters the watch has delivered (the orphan collector's view of which are paused)."""
        return list(self.cache.items(CLUSTERS))

    async def list_libvirt_machines_fresh(self, namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every LibvirtMachine (of the watched namespaces) as the API server has them now, not the cache: the last
        word before the orphan collector removes anything."""
        items: list[dict[str, Any]] = []
        scopes: list[str | None] = [*namespaces] or [None]  # None: all namespaces
        for namespace in scopes:
            items += _items(await self._request("GET", _ours(LIBVIRT_MACHINES, namespace)))
        return items

    async def namespace_uid(self, name: str) -> str | None:
        """The UID of a Namespace (kube-system's identifies the management cluster), None when it is absent."""
        namespace = await _or_none(self._request("GET", object_path("", "v1", "namespaces", name=name)))
        return namespace["metadata"]["uid"] if namespace is not None else None

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """The Secret's data, None when it does not exist, Forbidden when the provider may not read it there."""
        try:
            secret = await _or_none(self._request("GET", object_path("", "v1", "secrets", namespace, name)))
        except ApiError as error:
            if error.status == 403:
                raise Forbidden(f"reading Secrets in namespace {namespace} is forbidden") from None
            raise
        if secret is None:
            return None
        return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}

    async def get_libvirt_host(self, name: str) -> dict[str, Any] | None:
        return await _or_none(self._request("GET", _ours("libvirthosts", name=name)))

    async def list_libvirt_hosts(self) -> list[dict[str, Any]]:
        return _items(await self._request("GET", _ours("libvirthosts")))

    async def patch_libvirt_host_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = await self._request("PATCH", _ours("libvirthosts", name=name, subresource="status"),
                                                   {"status": status}, merge=True)
        return body

    async def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        namespace = involved["metadata"].get("namespace") or "default"
        await self._request("POST", object_path("", "v1", "events", namespace),
                            event_body(involved, type_, reason, message, now))

    async def get_bootstrap_data(self, namespace: str, name: str) -> BootstrapData | None:
        data = await self.get_secret_data(namespace, name)
        if data is None:
            return None
        # A format of any bytes (not UTF-8) is read with replacement characters: the reconcile refuses it by name.
        return BootstrapData(value=data.get("value"),
                             format=data.get("format", b"cloud-config").decode("utf-8", errors="replace"))

    async def patch_libvirt_machine(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch; with `metadata.resourceVersion` in it, only of that version (else Conflict)."""
        try:
            body: dict[str, Any] = await self._request("PATCH", _ours(LIBVIRT_MACHINES, namespace, name), patch,
                                                       merge=True)
        except ApiError as error:
            if error.status == 409:
                raise Conflict(f"LibvirtMachine {namespace}/{name} changed meanwhile") from None
            raise
        self.cache.put(LIBVIRT_MACHINES, body)
        return body

    async def patch_libvirt_machine_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = await self._request("PATCH", _ours(LIBVIRT_MACHINES, namespace, name, "status"),
                                                   {"status": status}, merge=True)
        self.cache.put(LIBVIRT_MACHINES, body)
        return body

    # -- Cluster API IPAM (core.ipam): the machine's IPAddressClaims and the IPAddresses that answer them --------------

    async def get_ip_address_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await _or_none(self._request("GET", _ipam("ipaddressclaims", namespace, name)))

    async def create_ip_address_claim(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create the claim; one that exists already (a pass that raced another, or a restart) is read instead."""
        namespace = body["metadata"]["namespace"]
        try:
            created: dict[str, Any] = await self._request("POST", _ipam("ipaddressclaims", namespace), body)
            return created
        except ApiError as error:
            if error.status == 409:
                existing = await self.get_ip_address_claim(namespace, body["metadata"]["name"])
                if existing is not None:
                    return existing
            if error.status == 403:
                raise Forbidden(f"creating IPAddressClaims in namespace {namespace} is forbidden") from None
            raise

    async def delete_ip_address_claim(self, namespace: str, name: str) -> bool:
        """Ask for the claim's deletion (its IPAM provider's finalizer then releases the address); False when it was
        gone already. Does not wait for it to go."""
        try:
            deleted = await _or_none(self._request("DELETE", _ipam("ipaddressclaims", namespace, name)))
        except ApiError as error:
            if error.status == 403:
                raise Forbidden(f"deleting IPAddressClaims in namespace {namespace} is forbidden") from None
            raise
        return deleted is not None

    async def get_ip_address(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await _or_none(self._request("GET", _ipam("ipaddresses", namespace, name)))

    # Leases (operator/election.py), read and written as the JSON they are (MicroTimes stay text).
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await _or_none(self._request("GET", _lease(namespace, name)))

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        """False when another writer created it first (409)."""
        try:
            await self._request("POST", _lease(namespace), body)
        except ApiError as error:
            if error.status == 409:
                return False
            raise
        return True

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        """False when the Lease changed since `body` was read (409: its resourceVersion is not the current one)."""
        try:
            await self._request("PUT", _lease(namespace, name), body)
        except ApiError as error:
            if error.status == 409:
                return False
            raise
        return True


def _ours(plural: str, namespace: str | None = None, name: str | None = None,
          subresource: str | None = None) -> str:
    return object_path(meta.GROUP, meta.VERSION, plural, namespace, name, subresource)


def _ipam(plural: str, namespace: str, name: str | None = None) -> str:
    return object_path(IPAM_GROUP, IPAM_VERSION, plural, namespace, name)


def _lease(namespace: str, name: str | None = None) -> str:
    return object_path(COORDINATION_GROUP, COORDINATION_VERSION, "leases", namespace, name)


EVENT_COMPONENT = "capi-libvirt"
EVENT_MESSAGE_MAX = 1024


def event_body(involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> dict[str, Any]:
    """A core/v1 Event about `involved` (an object's body), as `kubectl describe` shows them."""
    metadata = involved["metadata"]
    return {
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata.get("namespace") or "default"},
        "involvedObject": {"apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                           "name": metadata["name"], "namespace": metadata.get("namespace"), "uid": metadata.get("uid")},
        "type": type_, "reason": reason, "message": message[:EVENT_MESSAGE_MAX],
        "source": {"component": EVENT_COMPONENT}, "reportingComponent": EVENT_COMPONENT,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }


class WorkloadNodes:
    """The workload cluster's Nodes, reached through the `<cluster>-kubeconfig` Secret Cluster API writes."""

    def __init__(self, kube: KubeAPI) -> None:
        self.kube = kube

    async def kubeconfig(self, namespace: str, cluster: str) -> Any:
        """The Secret's kubeconfig as YAML read it (None when the Secret or its value is missing)."""
        data = await self.kube.get_secret_data(namespace, f"{cluster}-kubeconfig")
        if not data or not data.get("value"):
            return None
        return yaml.safe_load(data["value"])

    async def set_provider_id(self, config: Any, node_name: str, provider_id: str) -> str:
        """Set the Node's providerID when it has none; returns what happened: patched, absent, already-set or other.
        The kubeconfig is a tenant's to write: only its inline data is used (kube.kubeconfig.from_kubeconfig_data)."""
        async with KubeClient(kubeconfig.from_kubeconfig_data(config)) as workload:
            path = object_path("", "v1", "nodes", name=node_name)
            node = await _or_none(workload.request("GET", path))
            if node is None:
                return "absent"
            current = (node.get("spec") or {}).get("providerID")
            if current:
                return "already-set" if current == provider_id else "other"
            await workload.request("PATCH", path, {"spec": {"providerID": provider_id}}, content_type=MERGE_PATCH)
            return "patched"
