"""An in-memory stand-in for the provider's Kubernetes API client (capi_libvirt.kube.api.KubeAPI), as the reconciles
use it, for the fast tier: the objects by kind, namespace and name, each with a UID, a resourceVersion bumped on
every write and a generation bumped on every spec change; merge patches (RFC 7386) and, with
`metadata.resourceVersion` in the patch, only of that version (else api.Conflict, as the API server's 409); an object
with a deletionTimestamp gone once its last finalizer is; Secrets' data as bytes. Every read and write is counted
(`calls`) and every write recorded (`writes`).

The API server's admission (the CRDs' schemas, RBAC) is not here: the integration tier runs a real kube-apiserver.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from capi_libvirt.kube import api

LIBVIRT_MACHINES, MACHINES, CLUSTERS, SECRETS = "libvirtmachines", "machines", "clusters", "secrets"
LIBVIRT_HOSTS, LIBVIRT_CLUSTERS = "libvirthosts", "libvirtclusters"


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386: `patch` merged into a copy of `target` (None removes a key, a list replaces)."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class MemoryAPI:
    """The objects of one test, by (plural, namespace, name); cluster-scoped ones under namespace ""."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.version = 0
        self.calls = 0
        self.primed = True  # as after the operator's first LIST: every LibvirtMachine is known
        self.writes: list[tuple[str, str, dict[str, Any]]] = []  # (verb and kind, name, what was written)

    # -- the test's hands ------------------------------------------------------------------------------------------

    def add(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create an object as the API server would (UID, resourceVersion, generation 1)."""
        stored = copy.deepcopy(body)
        metadata = stored.setdefault("metadata", {})
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("generation", 1)
        self._bump(stored)
        self.objects[(plural, metadata.get("namespace", ""), metadata["name"])] = stored
        return copy.deepcopy(stored)

    def delete(self, plural: str, namespace: str, name: str) -> None:
        """Delete as the API server does: gone now without finalizers, else marked for deletion."""
        body = self.objects[(plural, namespace, name)]
        if body["metadata"].get("finalizers"):
            body["metadata"].setdefault("deletionTimestamp", "2026-12-05T00:00:00Z")
            self._bump(body)
        else:
            del self.objects[(plural, namespace, name)]

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        body = self.objects.get((plural, namespace, name))
        return copy.deepcopy(body) if body is not None else None

    def _bump(self, body: dict[str, Any]) -> None:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)

    def _read(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        return self.get(plural, namespace, name)

    def _patch(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        key = (plural, namespace, name)
        body = self.objects.get(key)
        if body is None:
            raise LookupError(f"{plural} {namespace}/{name} not found")
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != body["metadata"]["resourceVersion"]:
            raise api.Conflict(f"{plural} {namespace}/{name} changed meanwhile")
        patched = merge(body, patch)
        if patched.get("spec") != body.get("spec"):
            patched["metadata"]["generation"] = body["metadata"].get("generation", 1) + 1
        self._bump(patched)
        self.writes.append((f"PATCH {plural}", name, copy.deepcopy(patch)))
        if patched["metadata"].get("deletionTimestamp") and not patched["metadata"].get("finalizers"):
            del self.objects[key]
        else:
            self.objects[key] = patched
        return copy.deepcopy(patched)

    # -- what the reconciles read ------------------------------------------------------------------------------------

    async def get_libvirt_machine(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(LIBVIRT_MACHINES, namespace, name)

    async def reread_libvirt_machine(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(LIBVIRT_MACHINES, namespace, name)

    async def get_machine(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(MACHINES, namespace, name)

    async def get_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(CLUSTERS, namespace, name)

    async def get_libvirt_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(LIBVIRT_CLUSTERS, namespace, name)

    async def get_libvirt_host(self, name: str) -> dict[str, Any] | None:
        return self._read(LIBVIRT_HOSTS, "", name)

    async def list_libvirt_machines(self) -> list[dict[str, Any]]:
        return self._list(LIBVIRT_MACHINES)

    def libvirt_machine_changes(self, since: int) -> None:
        """No change log here: placement reads every machine (what the operator does before its cache is primed)."""
        return None

    async def list_libvirt_machines_fresh(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        return [body for body in self._list(LIBVIRT_MACHINES)
                if not namespaces or body["metadata"].get("namespace") in namespaces]

    async def list_libvirt_hosts(self) -> list[dict[str, Any]]:
        return self._list(LIBVIRT_HOSTS)

    def cached_clusters(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(body) for (plural, _, _), body in self.objects.items() if plural == CLUSTERS]

    def _list(self, plural: str) -> list[dict[str, Any]]:
        self.calls += 1
        return [copy.deepcopy(body) for (kind, _, _), body in self.objects.items() if kind == plural]

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, bytes] | None:
        secret = self._read(SECRETS, namespace, name)
        return None if secret is None else dict(secret.get("data") or {})

    async def get_bootstrap_data(self, namespace: str, name: str) -> api.BootstrapData | None:
        data = await self.get_secret_data(namespace, name)
        if data is None:
            return None
        return api.BootstrapData(value=data.get("value"),
                                 format=data.get("format", b"cloud-config").decode("utf-8", errors="replace"))

    # -- what the reconciles write -----------------------------------------------------------------------------------

    async def patch_libvirt_machine(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._patch(LIBVIRT_MACHINES, namespace, name, patch)

    async def patch_libvirt_machine_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self._patch(LIBVIRT_MACHINES, namespace, name, {"status": status})

    async def patch_libvirt_host_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self._patch(LIBVIRT_HOSTS, "", name, {"status": status})

    async def patch_libvirt_cluster(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self._patch(LIBVIRT_CLUSTERS, namespace, name, patch)

    async def patch_libvirt_cluster_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self._patch(LIBVIRT_CLUSTERS, namespace, name, {"status": status})
