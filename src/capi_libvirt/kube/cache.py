"""The operator's copy of the objects it reconciles and reads: LibvirtMachines, Cluster API Machines and Clusters.

Fed by the watches kopf already runs (every event's body goes in) and by the responses of the operator's own writes,
so a reconcile reads what it needs without asking the API server, and placement counts every machine without a LIST.
Objects only move forward: a body older than the one held (a lower resourceVersion, as an event that raced a write's
response) is ignored, and so is one of an object already seen deleted. No I/O here: `KubeAPI` fills and reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

Key = tuple[str, str, str]  # (resource plural, namespace ("" when cluster-scoped), name)
MAX_TOMBSTONES = 10_000
CHANGE_LOG_SLACK = 1_000  # deleted objects the change log keeps beyond the live ones before it forgets the oldest

Change = tuple[tuple[str, str], dict[str, Any] | None]  # (namespace, name), the body held now (None: gone)


def _version(body: dict[str, Any]) -> int:
    try:
        return int(body["metadata"].get("resourceVersion") or 0)
    except ValueError:  # not etcd's integers (another storage): treat every body as the newest
        return 1 << 62


def without_managed_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The body without metadata.managedFields (server-side apply's record of who set which field): nothing here reads
    it, and it is often as large as the rest of the object, in every body the cache holds."""
    metadata = body.get("metadata")
    if not metadata or "managedFields" not in metadata:
        return body
    return {**body, "metadata": {key: value for key, value in metadata.items() if key != "managedFields"}}


def key_of(resource: str, body: dict[str, Any]) -> Key:
    return resource, body["metadata"].get("namespace") or "", body["metadata"]["name"]


class ObjectCache:
    """The bodies held, by resource and then by (namespace, name): listing one resource touches only its objects."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self._deleted: dict[Key, int] = {}  # the version an object was deleted at, against late bodies of it
        # Which objects changed, in the order they last did (a number each), so a reader that keeps counts over
        # them (reconcile.placed) reads the changes since it last looked instead of every object.
        self._sequence = 0
        self._changed: dict[str, OrderedDict[tuple[str, str], int]] = {}
        self._forgotten: dict[str, int] = {}  # changes up to this number may have been dropped from the log
        # Watch events taken in, by (resource, "changed" or "unchanged": the echo of a write or an older body).
        self.events: dict[tuple[str, str], int] = {}

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._objects.get(resource, {}).get((namespace, name))

    def put(self, resource: str, body: dict[str, Any]) -> bool:
        """Keep the body unless an equal or newer one is held; True when it was newer (something changed). A body
        held is never edited: a change is always a new body (what reconcile.placed relies on)."""
        key, version = key_of(resource, body), _version(body)
        held_of_resource = self._objects.setdefault(resource, {})
        held = held_of_resource.get(key[1:])
        if (held is not None and _version(held) >= version) or self._deleted.get(key, -1) >= version:
            return False
        held_of_resource[key[1:]] = without_managed_fields(body)
        self._note(resource, key[1:])
        return True

    def delete(self, resource: str, body: dict[str, Any]) -> None:
        key = key_of(resource, body)
        held_of_resource = self._objects.get(resource, {})
        held = held_of_resource.get(key[1:])
        if held is None or held["metadata"].get("uid") == body["metadata"].get("uid"):
            if held_of_resource.pop(key[1:], None) is not None:
                self._note(resource, key[1:])
            self._deleted[key] = max(_version(body), self._deleted.pop(key, -1))
            if len(self._deleted) > MAX_TOMBSTONES:  # the oldest deletions: their late events have long arrived
                for old in list(self._deleted)[:MAX_TOMBSTONES // 2]:
                    del self._deleted[old]

    def apply(self, resource: str, event_type: str | None, body: dict[str, Any]) -> bool:
        """A watch event (ADDED, MODIFIED, DELETED, or None for a listed object); True when the cache changed."""
        if event_type == "DELETED":
            self.delete(resource, body)
            changed = True
        else:
            changed = self.put(resource, body)
        counted = (resource, "changed" if changed else "unchanged")
        self.events[counted] = self.events.get(counted, 0) + 1
        return changed

    def replace_all(self, resource: str, bodies: list[dict[str, Any]], list_version: str | None) -> list[Key]:
        """A fresh LIST of the resource: its objects, and none of those held that it no longer has (older than the
        list: one written after it is kept). Returns the keys dropped: objects deleted without an event seen."""
        listed = {key_of(resource, body) for body in bodies}
        version = int(list_version) if list_version and list_version.isdigit() else 1 << 62
        dropped = []
        held_of_resource = self._objects.get(resource, {})
        for held_key, held in list(held_of_resource.items()):
            key = (resource, *held_key)
            if key not in listed and _version(held) <= version:
                self.delete(resource, held)
                dropped.append(key)
        for body in bodies:
            self.put(resource, body)
        return dropped

    def _note(self, resource: str, name: tuple[str, str]) -> None:
        self._sequence += 1
        log = self._changed.setdefault(resource, OrderedDict())
        log[name] = self._sequence
        log.move_to_end(name)
        held = self._objects.get(resource, {})
        while len(log) > len(held) + CHANGE_LOG_SLACK:  # forget the oldest deletions (live objects stay)
            oldest, number = next(iter(log.items()))
            if oldest in held:
                log.move_to_end(oldest)  # (renumbered: a reader may see it once more, which changes nothing)
                log[oldest] = self._sequence = self._sequence + 1
                continue
            del log[oldest]
            self._forgotten[resource] = number

    def changes(self, resource: str, since: int) -> tuple[int, list[Change] | None]:
        """The number to ask from next time, and the objects of `resource` that changed after change number `since`,
        each with its body now (None: gone); None for them when the log no longer reaches back that far (read every
        object instead)."""
        if since < self._forgotten.get(resource, 0):
            return self._sequence, None
        held, found = self._objects.get(resource, {}), []
        for name, number in reversed(self._changed.get(resource, {}).items()):
            if number <= since:
                break
            found.append((name, held.get(name)))
        return self._sequence, found

    def items(self, resource: str) -> Iterator[dict[str, Any]]:
        return iter(list(self._objects.get(resource, {}).values()))

    def __len__(self) -> int:
        return sum(len(held) for held in self._objects.values())
