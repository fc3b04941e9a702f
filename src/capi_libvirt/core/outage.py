"""What a placed machine does while its host is unreachable or decommissioned. Pure: the record of where its domain
may have been defined, what the prober saw of the host and the re-placement timeout in; a decision out.

The rule that makes moving a machine safe: it goes to another host only when no domain of it can exist on its current
one, so there are never two. Placement writes the record (an annotation) empty: no define yet. Before the first
define the host's name is written into it, and only then is the define sent, so a define that reached the host
without an answer, or an operator that died right after sending it, still leaves the record set. A machine without
the record (placed by an earlier release) counts as one that may have a domain. A pinned machine (spec.host) stays.

- Host reachable (or not probed yet): go on.
- Unreachable, record empty, not pinned: wait `replace_after_s` from the prober's first failure, then re-place.
- Unreachable otherwise: go on (the host calls fail with the transport's reason; the prober wakes the machine when
  the host is back).
- Decommissioned, record empty, not pinned: re-place at once. Otherwise: hold with HostDecommissioned, the domain may
  be there; deleting the machine (a MachineHealthCheck does) releases it with a Warning naming what may remain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from capi_libvirt.api import reasons

NEVER_DEFINED = ""  # the record's value from placement until the first define
DEFAULT_REPLACE_AFTER_S = 300.0
RECHECK_DECOMMISSIONED_S = 300.0  # a change of the LibvirtHost wakes its machines sooner


@dataclasses.dataclass(frozen=True)
class HostState:
    """A host as the prober last saw it."""

    decommissioned: bool = False
    unreachable_for: float | None = None  # seconds since the first failed probe of this outage; None: reachable


@dataclasses.dataclass(frozen=True)
class Proceed:
    """Nothing to decide: the pass goes on with the host."""


@dataclasses.dataclass(frozen=True)
class Hold:
    """Wait: `reason` and `message` become the Provisioned condition's; look again after `retry_after` seconds."""

    reason: str
    message: str
    retry_after: float


@dataclasses.dataclass(frozen=True)
class Replace:
    """Place the machine on another host; `message` says why (the event's)."""

    message: str


def may_have_domain(record: str | None) -> bool:
    """Whether a domain of the machine can exist on its host: anything but an explicit "never defined"."""
    return record != NEVER_DEFINED


def decide(host: str, record: str | None, state: HostState, replace_after_s: float, *,
           pinned: bool) -> Proceed | Hold | Replace:
    """What a placed machine does about its host (see the module doc)."""
    movable = not may_have_domain(record) and not pinned
    if state.decommissioned:
        if movable:
            return Replace(f"host {host} is decommissioned and no domain of this machine was ever defined there")
        if pinned and not may_have_domain(record):
            return Hold(reasons.HOST_DECOMMISSIONED, f"pinned host {host} is decommissioned",
                        RECHECK_DECOMMISSIONED_S)
        return Hold(reasons.HOST_DECOMMISSIONED,
                    f"host {host} is decommissioned and this machine's domain may be on it, so it is not placed "
                    "elsewhere: delete the machine (Cluster API replaces it; a MachineHealthCheck does so by itself)",
                    RECHECK_DECOMMISSIONED_S)
    if state.unreachable_for is None or not movable:
        return Proceed()
    if state.unreachable_for >= replace_after_s:
        return Replace(f"host {host} unreachable for {state.unreachable_for:.0f}s and no domain of this machine was "
                       "ever defined there")
    remaining = replace_after_s - state.unreachable_for
    return Hold(reasons.HOST_UNREACHABLE,
                f"host {host} unreachable for {state.unreachable_for:.0f}s; no domain of this machine was defined "
                f"there, so it is placed on another host if this lasts {remaining:.0f}s more", max(remaining, 1.0))


def what_may_remain(host: str, domain: str | None, volumes: Sequence[str]) -> str:
    """The Warning event's text for a machine released from a decommissioned host."""
    parts = ([f"domain {domain}"] if domain else []) + [f"volume {volume}" for volume in volumes]
    return f"host {host} is decommissioned; released without touching it. What may remain there: {', '.join(parts)}"
