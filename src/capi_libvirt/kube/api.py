"""Kubernetes API calls of the reconciles: owners, clusters, bootstrap Secrets, and our objects' spec and status.

asyncio-native (kubernetes_asyncio on aiohttp, like kopf), so no call blocks the event loop. "Not found" is
recognised by HTTP status 404 and returned as None; every other error propagates. Every request has a deadline
(REQUEST_TIMEOUT_S): one that never gets an answer ends in asyncio.TimeoutError, and the reconcile retries.

LibvirtMachines, Machines and Clusters are read from the watch-fed cache (kube.cache): `prime()` fills it with one
LIST of each when the operator starts working, the watches keep it current, and every write's response goes into
it. Only a Machine or Cluster the cache does not hold (yet) is fetched, and then kept. Secrets are never cached: they are read
once, when a machine's NoCloud ISO is built.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from capi_libvirt.api import meta
from capi_libvirt.kube.cache import Key, ObjectCache

CAPI_GROUP, CAPI_VERSION = meta.CAPI_GROUP, meta.CAPI_VERSION
IPAM_GROUP, IPAM_VERSION = "ipam.cluster.x-k8s.io", "v1beta2"  # Cluster API's IPAddressClaim and IPAddress

# The client logs whole response bodies at DEBUG, Secrets (bootstrap data, host keys) included: never below INFO,
# whatever level the operator runs at.
logging.getLogger("kubernetes_asyncio.client.rest").setLevel(logging.INFO)
MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
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


# How long one API request may take (never a watch: kopf runs those on its own client). aiohttp waits forever by
# default, and a request on a connection that died without a word (an API server gone without closing it, a load
# balancer's dropped flow) would hold a reconcile worker, and any creation slot it holds, for the operator's life.
REQUEST_TIMEOUT_S = 60.0


RequestObserver = Callable[[str, str], None]  # (HTTP method, status code or "<error>"), once per request


class RateLimit:
    """client-go's token bucket (--kube-api-qps, --kube-api-burst): `burst` requests at once, then `qps` a second."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"rate limit: qps {qps:g} must be above 0 and burst {burst} at least 1")
        self.qps, self.burst, self.clock = qps, burst, clock
        self.tokens, self.updated = float(burst), clock()
        self._lock = asyncio.Lock()

    def delay(self) -> float:
        """Take a token; the seconds to wait before the request it stands for may go (0: at once)."""
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.qps)
        self.updated = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.qps

    async def wait(self) -> None:
        async with self._lock:  # one request's turn at a time, in the order they came
            delay = self.delay()
            if delay > 0:
                await asyncio.sleep(delay)


class TimedApiClient(client.ApiClient):
    """kubernetes_asyncio's ApiClient whose requests end after REQUEST_TIMEOUT_S (asyncio.TimeoutError) unless the
    call names its own `_request_timeout`; each request's method and status go to `observe` (the metrics)."""

    def __init__(self, configuration: client.Configuration, observe: RequestObserver | None = None,
                 rate_limit: RateLimit | None = None) -> None:
        super().__init__(configuration)
        self.observe, self.rate_limit = observe, rate_limit

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = REQUEST_TIMEOUT_S
        return super().call_api(*args, **kwargs)

    async def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if self.rate_limit is not None:
            await self.rate_limit.wait()
        if self.observe is None:
            return await super().request(method, url, *args, **kwargs)
        try:
            response = await super().request(method, url, *args, **kwargs)
        except ApiException as error:
            self.observe(method, str(error.status))
            raise
        except BaseException:
            self.observe(method, "<error>")
            raise
        self.observe(method, str(response.status))
        return response


def in_a_pod() -> bool:
    """Kubernetes sets KUBERNETES_SERVICE_HOST in every pod's environment."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def in_cluster(context: str | None = None) -> bool:
    """The ServiceAccount is the way in: in a pod, with no KUBECONFIG given and no kubeconfig context asked for.
    The one answer to it, for the operator's own client, kopf's login and the CLI."""
    return in_a_pod() and not os.environ.get("KUBECONFIG") and context is None


async def new_api_client(context: str | None = None, observe: RequestObserver | None = None,
                         rate_limit: RateLimit | None = None) -> client.ApiClient:
    """A client from $KUBECONFIG / ~/.kube/config (its current context, or `context`), or the in-cluster service
    account; `observe` sees every request's method and status."""
    configuration = client.Configuration()
    if in_cluster(context):
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=context,
                                      client_configuration=configuration)
    return TimedApiClient(configuration, observe, rate_limit)


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def default_namespace(context: str | None = None) -> str:
    """The namespace kubectl would use: the kubeconfig context's (the current one, or `context`), in a pod the
    ServiceAccount's, else `default`."""
    if in_cluster(context):
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as file:
                return file.read().strip() or "default"
        except OSError:
            return "default"
    contexts, current = config.list_kube_config_contexts(os.environ.get("KUBECONFIG"))
    chosen = current if context is None else next((c for c in contexts if c.get("name") == context), None)
    if chosen is None:
        raise config.ConfigException(f"context {context!r} not found in the kubeconfig")
    return str((chosen.get("context") or {}).get("namespace") or "default")


async def _or_none(coroutine: Any) -> Any:
    try:
        return await coroutine
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def describe_error(error: BaseException) -> str:
    """A request's failure in a few words for a log line or a probe: the HTTP status and reason, else the error's
    class (never the response body, which may quote the request)."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason or ''}".strip()
    return type(error).__name__


class KubeAPI:
    def __init__(self, api_client: client.ApiClient, cache: ObjectCache | None = None) -> None:
        self.client = api_client
        self.objects = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.cache = cache if cache is not None else ObjectCache()
        self.primed = False  # the cache holds every LibvirtMachine: placement may count from it
        self.calls = 0  # API calls made, for the numbers (docs/book/src/development/numbers.md)

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
            self.calls += 1
            if namespace is None:
                listed = await self.objects.list_cluster_custom_object(group, version, plural)
            else:
                listed = await self.objects.list_namespaced_custom_object(group, version, namespace, plural)
            items += listed.get("items", [])
            list_version = listed.get("metadata", {}).get("resourceVersion") if len(namespaces) <= 1 else None
        return self.cache.replace_all(plural, items, list_version)

    async def _cached(self, group: str, version: str, plural: str, namespace: str, name: str,
                      fetch_missing: bool = True) -> dict[str, Any] | None:
        body = self.cache.get(plural, namespace, name)
        if body is None and fetch_missing:
            self.calls += 1
            body = await _or_none(self.objects.get_namespaced_custom_object(group, version, namespace, plural, name))
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
        self.calls += 1
        body = await _or_none(self.objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                        LIBVIRT_MACHINES, name))
        if body is not None:
            self.cache.put(LIBVIRT_MACHINES, body)
        return body

    async def get_libvirt_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        return await _or_none(self.objects.get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name))

    async def patch_libvirt_cluster(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return await self.objects.patch_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name, patch, **MERGE_PATCH)

    async def patch_libvirt_cluster_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return await self.objects.patch_namespaced_custom_object_status(
            meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name, {"status": status}, **MERGE_PATCH)

    async def list_libvirt_machines(self) -> list[dict[str, Any]]:
        """Every LibvirtMachine (of the watched namespaces): what is allocated on each host, and each group's spread."""
        if self.primed:
            return list(self.cache.items(LIBVIRT_MACHINES))
        self.calls += 1
        listed = await self.objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, LIBVIRT_MACHINES)
        return listed.get("items", [])

    def cached_clusters(self) -> list[dict[str, Any]]:
        """The Clusters the watch has delivered (the orphan collector's view of which are paused)."""
        return list(self.cache.items(CLUSTERS))

    async def list_libvirt_machines_fresh(self, namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every LibvirtMachine (of the watched namespaces) as the API server has them now, not the cache: the last
        word before the orphan collector removes anything."""
        items: list[dict[str, Any]] = []
        scopes: list[str | None] = [*namespaces] or [None]  # None: all namespaces
        for namespace in scopes:
            self.calls += 1
            if namespace is None:
                listed = await self.objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, LIBVIRT_MACHINES)
            else:
                listed = await self.objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                          LIBVIRT_MACHINES)
            items += listed.get("items", [])
        return items

    async def namespace_uid(self, name: str) -> str | None:
        """The UID of a Namespace (kube-system's identifies the management cluster), None when it is absent."""
        self.calls += 1
        namespace = await _or_none(self.core.read_namespace(name))
        return namespace.metadata.uid if namespace is not None else None

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """The Secret's data, None when it does not exist, Forbidden when the provider may not read it there."""
        self.calls += 1
        try:
            secret = await _or_none(self.core.read_namespaced_secret(name, namespace))
        except ApiException as error:
            if error.status == 403:
                raise Forbidden(f"reading Secrets in namespace {namespace} is forbidden") from None
            raise
        if secret is None:
            return None
        return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}

    async def get_libvirt_host(self, name: str) -> dict[str, Any] | None:
        self.calls += 1
        return await _or_none(self.objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name))

    async def list_libvirt_hosts(self) -> list[dict[str, Any]]:
        self.calls += 1
        listed = await self.objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
        return listed.get("items", [])

    async def patch_libvirt_host_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return await self.objects.patch_cluster_custom_object_status(
            meta.GROUP, meta.VERSION, "libvirthosts", name, {"status": status}, **MERGE_PATCH)

    async def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        self.calls += 1
        namespace = involved["metadata"].get("namespace") or "default"
        body = event_body(involved, type_, reason, message, now)
        # The client sends a dict body as it is; the annotation names only the CoreV1Event model.
        await self.core.create_namespaced_event(namespace, body)  # type: ignore[arg-type]

    async def get_bootstrap_data(self, namespace: str, name: str) -> BootstrapData | None:
        data = await self.get_secret_data(namespace, name)
        if data is None:
            return None
        # A format of any bytes (not UTF-8) is read with replacement characters: the reconcile refuses it by name.
        return BootstrapData(value=data.get("value"),
                             format=data.get("format", b"cloud-config").decode("utf-8", errors="replace"))

    async def patch_libvirt_machine(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch; with `metadata.resourceVersion` in it, only of that version (else Conflict)."""
        self.calls += 1
        try:
            body = await self.objects.patch_namespaced_custom_object(
                meta.GROUP, meta.VERSION, namespace, LIBVIRT_MACHINES, name, patch, **MERGE_PATCH)
        except ApiException as error:
            if error.status == 409:
                raise Conflict(f"LibvirtMachine {namespace}/{name} changed meanwhile") from None
            raise
        self.cache.put(LIBVIRT_MACHINES, body)
        return body

    async def patch_libvirt_machine_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        body = await self.objects.patch_namespaced_custom_object_status(
            meta.GROUP, meta.VERSION, namespace, LIBVIRT_MACHINES, name, {"status": status}, **MERGE_PATCH)
        self.cache.put(LIBVIRT_MACHINES, body)
        return body

    # -- Cluster API IPAM (core.ipam): the machine's IPAddressClaims and the IPAddresses that answer them --------------

    async def get_ip_address_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        return await _or_none(self.objects.get_namespaced_custom_object(
            IPAM_GROUP, IPAM_VERSION, namespace, "ipaddressclaims", name))

    async def create_ip_address_claim(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create the claim; one that exists already (a pass that raced another, or a restart) is read instead."""
        self.calls += 1
        namespace = body["metadata"]["namespace"]
        try:
            created: dict[str, Any] = await self.objects.create_namespaced_custom_object(
                IPAM_GROUP, IPAM_VERSION, namespace, "ipaddressclaims", body)
            return created
        except ApiException as error:
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
        self.calls += 1
        try:
            deleted = await _or_none(self.objects.delete_namespaced_custom_object(
                IPAM_GROUP, IPAM_VERSION, namespace, "ipaddressclaims", name))
        except ApiException as error:
            if error.status == 403:
                raise Forbidden(f"deleting IPAddressClaims in namespace {namespace} is forbidden") from None
            raise
        return deleted is not None

    # Leases (operator/election.py), read and written as plain JSON: the client's model would turn their MicroTimes
    # into datetimes and back into text the API server may not read.
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._raw(self.coordination.read_namespaced_lease(name, namespace, _preload_content=False))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        """False when another writer created it first (409)."""
        try:
            await self._raw(self.coordination.create_namespaced_lease(
                namespace, body, _preload_content=False))  # type: ignore[arg-type]
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        """False when the Lease changed since `body` was read (409: its resourceVersion is not the current one)."""
        try:
            await self._raw(self.coordination.replace_namespaced_lease(
                name, namespace, body, _preload_content=False))  # type: ignore[arg-type]
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    async def _raw(self, request: Any) -> dict[str, Any]:
        """The JSON body of a request made with _preload_content=False, whose failures the client does not raise:
        an ApiException for any status but 2xx, as with the client's own models."""
        self.calls += 1
        response = await request
        text = await response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason)
        body: dict[str, Any] = json.loads(text)
        return body

    async def get_ip_address(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        return await _or_none(self.objects.get_namespaced_custom_object(
            IPAM_GROUP, IPAM_VERSION, namespace, "ipaddresses", name))


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

    async def kubeconfig(self, namespace: str, cluster: str) -> dict[str, Any] | None:
        self.kube.calls += 1
        secret = await _or_none(self.kube.core.read_namespaced_secret(f"{cluster}-kubeconfig", namespace))
        if secret is None or not (secret.data or {}).get("value"):
            return None
        return yaml.safe_load(base64.b64decode(secret.data["value"]))

    async def set_provider_id(self, kubeconfig: dict[str, Any], node_name: str, provider_id: str) -> str:
        """Set the Node's providerID when it has none; returns what happened: patched, absent, already-set or other."""
        configuration = client.Configuration()
        await config.load_kube_config_from_dict(kubeconfig, client_configuration=configuration)
        async with TimedApiClient(configuration) as workload:
            nodes = client.CoreV1Api(workload)
            node = await _or_none(nodes.read_node(node_name))
            if node is None:
                return "absent"
            current = node.spec.provider_id if node.spec else None
            if current:
                return "already-set" if current == provider_id else "other"
            await nodes.patch_node(node_name, {"spec": {"providerID": provider_id}})
            return "patched"
