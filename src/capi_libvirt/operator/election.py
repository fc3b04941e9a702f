"""Leader election between replicas, on kopf's peering, and the operator's role as probes and metrics report it.

kopf's peering: every replica patches a keep-alive record (priority, lifetime, lastseen) into the status of one
ClusterKopfPeering object (config/peering) and watches it; a replica that sees a live record of a higher (or equal)
priority pauses: its watches stop and its daemons end. Each replica takes a random priority at start, so exactly
one runs: the highest. A replica that exits removes its record (kopf does, on SIGTERM), and the next highest resumes
at once; a replica that dies without exiting is taken for dead once its record is `lifetime` seconds old.

kopf does not tell its own handlers whether it is paused, so `observe` reads the peering object back every few
seconds and applies kopf's rule to it: that is the role /readyz reports ("leader", "standby" or "standalone") and
what gates the host prober, which is ours and not paused by kopf.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
import secrets
import socket
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "zalando.org", "v1", "clusterkopfpeerings"
DEFAULT_PEERING = "capi-libvirt"
DEFAULT_LIFETIME_S = 60  # kopf's default: a silent replica counts as dead this long after its last keep-alive
OBSERVE_INTERVAL_S = 3.0
MAX_PRIORITY = 2**31 - 1
LEADER, STANDBY, STANDALONE = "leader", "standby", "standalone"


@dataclasses.dataclass(frozen=True)
class Peering:
    """This replica in the election: the peering object's name, its record's key and its priority."""

    name: str
    identity: str
    priority: int

    @classmethod
    def new(cls, name: str) -> Peering:
        return cls(name=name, identity=new_identity(), priority=random_priority())


def random_priority() -> int:
    """1..2**31-1: two replicas draw the same one with a chance of about one in two billion."""
    return secrets.randbelow(MAX_PRIORITY) + 1


def new_identity() -> str:
    """The key of this replica's record: the pod's name (its hostname), the process and a random suffix."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def _alive(record: object, now: datetime.datetime) -> bool:
    if not isinstance(record, dict) or not record.get("lastseen"):
        return False
    try:
        lastseen = datetime.datetime.fromisoformat(str(record["lastseen"]))
        lifetime = int(record.get("lifetime", DEFAULT_LIFETIME_S))
    except (TypeError, ValueError):
        return False
    if lastseen.tzinfo is None:
        lastseen = lastseen.replace(tzinfo=datetime.UTC)
    return lastseen + datetime.timedelta(seconds=lifetime) > now


def role(records: dict[str, Any], me: Peering, now: datetime.datetime) -> str | None:
    """kopf's rule applied to the peering object's status: None while our own record is missing or expired."""
    if not _alive(records.get(me.identity), now):
        return None
    rivals = [identity for identity, record in records.items()
              if identity != me.identity and _alive(record, now) and _priority(record) >= me.priority]
    return STANDBY if rivals else LEADER


def _priority(record: dict[str, Any]) -> int:
    try:
        return int(record.get("priority", 0))
    except (TypeError, ValueError):
        return 0


class State:
    """What the probes and metrics report: started (kopf's startup done) and the role, or why there is none."""

    def __init__(self, peering: Peering | None) -> None:
        self.peering = peering
        self.started = asyncio.Event()  # kopf's ready flag: raised once the startup handlers are done
        self.role: str | None = STANDALONE if peering is None else None
        self.problem = "" if peering is None else "not seen in the peering object yet"
        self.leading = asyncio.Event()
        self.not_leading = asyncio.Event()
        self._signal()

    def set_role(self, new_role: str | None, problem: str = "") -> None:
        if new_role != self.role:
            log.info("role: %s%s", new_role or "none", f" ({problem})" if problem else "")
        self.role, self.problem = new_role, problem
        self._signal()

    def stopping(self) -> None:
        self.set_role(None, "stopping")

    def _signal(self) -> None:
        leading = self.role in (LEADER, STANDALONE)
        (self.leading if leading else self.not_leading).set()
        (self.not_leading if leading else self.leading).clear()

    @property
    def active(self) -> bool:
        """This replica does the work: it leads, or runs standalone."""
        return self.role in (LEADER, STANDALONE)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready: kopf started, and the role is known (leading, standing by or standalone)."""
        ready = self.started.is_set() and self.role is not None
        report: dict[str, Any] = {"ready": ready, "role": self.role}
        if not self.started.is_set():
            report["problem"] = "starting"
        elif self.problem:
            report["problem"] = self.problem
        if self.peering is not None:
            report |= {"peering": self.peering.name, "identity": self.peering.identity,
                       "priority": self.peering.priority}
        return ready, report


async def observe(state: State, objects: client.CustomObjectsApi, interval: float = OBSERVE_INTERVAL_S) -> None:
    """Read the peering object back every `interval` seconds and set the role from it, for the operator's life."""
    assert state.peering is not None
    while True:
        new_role, problem = await _read_role(state.peering, objects)
        state.set_role(new_role, problem)
        await asyncio.sleep(interval)


async def _read_role(me: Peering, objects: client.CustomObjectsApi) -> tuple[str | None, str]:
    try:
        body = await objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, me.name)
    except ApiException as error:
        if error.status == 404:
            return None, f"ClusterKopfPeering {me.name} not found (apply config/peering)"
        return None, f"reading ClusterKopfPeering {me.name}: HTTP {error.status}"
    except Exception as error:  # noqa: BLE001  the API unreachable for a moment: not ready meanwhile
        return None, f"reading ClusterKopfPeering {me.name}: {type(error).__name__}"
    found = role(body.get("status") or {}, me, datetime.datetime.now(datetime.UTC))
    return found, "" if found else "no live record of this replica in the peering object yet"
