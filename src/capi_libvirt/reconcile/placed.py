"""Where every LibvirtMachine is placed and what it claims there, kept by difference so that what placement and the
address checks read costs as much as what changed, not as the whole fleet.

`refresh` is given every LibvirtMachine the operator holds (the watch-fed cache, kube.cache, which replaces a body
when it changes and never edits one) and a function that reads a body's `Record` (its host, its placement group and
its claim). Only the bodies that are not the very objects seen last time are read again; each host's claims are
counted in and out one machine at a time (core.placement.HostClaims.add). With 2,000 machines, a placement used to
read every body (its providerID parsed, its identity hashed) under the placement lock; now it reads the few that
changed since the last one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from capi_libvirt.core import placement

Key = tuple[str, str]  # (namespace, name)
Group = tuple[str, str, str]  # (namespace, cluster, label=value): the machines placement spreads together


@dataclasses.dataclass(frozen=True)
class Record:
    """What placement needs of one placed machine."""

    host: str
    uid: str
    group: Group | None
    claim: placement.Claim


RecordOf = Callable[[dict[str, Any]], "Record | None"]  # None: not placed


class PlacedMachines:
    def __init__(self) -> None:
        self._held: dict[Key, tuple[dict[str, Any], Record | None]] = {}
        self._claims: dict[str, placement.HostClaims] = {}
        self._on_host: dict[str, dict[Key, dict[str, Any]]] = {}
        self._groups: dict[Group, dict[str, int]] = {}
        self._by_uid: dict[str, Record] = {}
        self.reads = 0  # bodies read into records, for the numbers (bench/scale.py)
        self.since = 0  # the cache's change number these records are up to (ObjectCache.changes)

    def refresh(self, bodies: Iterable[dict[str, Any]], record_of: RecordOf) -> None:
        """Bring the records up to `bodies`, every LibvirtMachine there is now: the new and changed ones read, the
        ones gone counted out."""
        seen: set[Key] = set()
        for body in bodies:
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            seen.add(key)
            self._update(key, body, record_of)
        for key in self._held.keys() - seen:
            self._update(key, None, record_of)

    def apply(self, changes: Iterable[tuple[Key, dict[str, Any] | None]], record_of: RecordOf) -> None:
        """Bring the records up to date with the machines that changed (each body as it is now; None: gone)."""
        for key, body in changes:
            self._update(key, body, record_of)

    def _update(self, key: Key, body: dict[str, Any] | None, record_of: RecordOf) -> None:
        held = self._held.get(key)
        if held is not None and held[0] is body:
            return
        if held is not None:
            self._count(key, held[0], held[1], -1)
            del self._held[key]
        if body is None:
            return
        self.reads += 1
        record = record_of(body)
        self._held[key] = (body, record)
        self._count(key, body, record, 1)

    def _count(self, key: Key, body: dict[str, Any], record: Record | None, sign: int) -> None:
        if record is None:
            return
        self._claims.setdefault(record.host, placement.HostClaims()).add(record.claim, sign)
        on_host = self._on_host.setdefault(record.host, {})
        group = self._groups.setdefault(record.group, {}) if record.group is not None else None
        if sign > 0:
            on_host[key] = body
            self._by_uid[record.uid] = record
            if group is not None:
                group[record.host] = group.get(record.host, 0) + 1
            return
        on_host.pop(key, None)
        if self._by_uid.get(record.uid) == record:
            del self._by_uid[record.uid]
        if group is not None:
            group[record.host] -= 1
            if not group[record.host]:
                del group[record.host]

    def claims(self, excluding_uid: str | None = None) -> Mapping[str, placement.HostClaims]:
        """Each host's claims (read only), with the machine of `excluding_uid` counted out when it is placed."""
        excluded = self._by_uid.get(excluding_uid) if excluding_uid else None
        if excluded is None:
            return self._claims
        return {**self._claims, excluded.host: self._claims[excluded.host].without(excluded.claim)}

    def host_claims(self, host: str) -> placement.HostClaims | None:
        return self._claims.get(host)

    def group_per_host(self, group: Group, excluding_uid: str | None = None) -> dict[str, int]:
        """How many machines of `group` each host holds, the machine of `excluding_uid` not counted."""
        counts = dict(self._groups.get(group, {}))
        excluded = self._by_uid.get(excluding_uid) if excluding_uid else None
        if excluded is not None and excluded.group == group:
            counts[excluded.host] -= 1
            if not counts[excluded.host]:
                del counts[excluded.host]
        return counts

    def on_host(self, host: str) -> list[dict[str, Any]]:
        """The bodies of the machines placed on `host`."""
        return list(self._on_host.get(host, {}).values())
