"""Leader election between replicas over a coordination.k8s.io Lease, as Cluster API's managers elect theirs, and the
operator's role as probes and metrics report it.

A replica that wants to lead tries every retry period to take the Lease (`--leader-election-id`, in the provider's
namespace): it takes it when the Lease has no holder, or when the holder's record has not changed for the lease
duration by this replica's own clock (so clocks that disagree between nodes do not matter). Only then does kopf start
and the reconciles run. The leader renews every retry period; if no renewal succeeded for the renew deadline, it has
lost the Lease: kopf stops and the process exits with an error, so that the pod restarts and stands by, as
controller-runtime's managers do. A leader that stops cleanly (SIGTERM) releases the Lease, and a standby takes over
within one retry period instead of a lease duration.

Writes are optimistic: each carries the resourceVersion read, so two replicas that both see a free Lease cannot both
take it (one gets a conflict and stands by).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from capi_libvirt.kube import api

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "capi-libvirt-leader-election"
# Cluster API's managers' defaults (controller-runtime's): a lease lasts 15 s, the leader must have renewed within
# 10 s, and everyone tries every 2 s.
DEFAULT_LEASE_DURATION_S = 15.0
DEFAULT_RENEW_DEADLINE_S = 10.0
DEFAULT_RETRY_PERIOD_S = 2.0
LEADER, STANDBY, STANDALONE = "leader", "standby", "standalone"


@dataclasses.dataclass(frozen=True)
class Lease:
    """This replica in the election: which Lease, who it is, and the timings."""

    name: str
    namespace: str
    identity: str
    duration_s: float = DEFAULT_LEASE_DURATION_S
    renew_deadline_s: float = DEFAULT_RENEW_DEADLINE_S
    retry_period_s: float = DEFAULT_RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if not self.duration_s > self.renew_deadline_s > self.retry_period_s > 0:
            raise ValueError(f"leader election: the lease duration ({self.duration_s:g} s) must exceed the renew "
                             f"deadline ({self.renew_deadline_s:g} s), which must exceed the retry period "
                             f"({self.retry_period_s:g} s)")


def new_identity() -> str:
    """The holder identity: the pod's name (its hostname), and a random suffix so two processes never share one."""
    return f"{socket.gethostname()}_{os.getpid()}_{secrets.token_hex(4)}"


def micro_time(now: datetime.datetime) -> str:
    """A metav1.MicroTime as the API server reads it: RFC 3339 with exactly six fractional digits."""
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def may_take(holder: str, me: str, observed_at: float, duration_s: float, now: float) -> bool:
    """Whether this replica may write itself into the Lease: nobody holds it, we do, or the holder's record has not
    changed for `duration_s` since we first saw it as it is (`observed_at`, our monotonic clock)."""
    return not holder or holder == me or now >= observed_at + duration_s


def taken(body: dict[str, Any] | None, me: Lease, now: datetime.datetime) -> dict[str, Any]:
    """The Lease body that records `me` as the holder, renewed `now`; a new holder's transition is counted."""
    body = body or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": me.name, "namespace": me.namespace}}
    spec = dict(body.get("spec") or {})
    if spec.get("holderIdentity") != me.identity:
        spec["acquireTime"] = micro_time(now)
        if spec.get("holderIdentity"):
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        else:
            spec.setdefault("leaseTransitions", 0)
    spec.update(holderIdentity=me.identity, leaseDurationSeconds=max(1, round(me.duration_s)),
                renewTime=micro_time(now))
    return {**body, "spec": spec}


def released(body: dict[str, Any], now: datetime.datetime) -> dict[str, Any]:
    """The Lease body with no holder (client-go's release): the next replica need not wait out the duration."""
    spec = {**(body.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time(now)}
    spec.pop("acquireTime", None)
    return {**body, "spec": spec}


class LeadershipLost(Exception):
    """The leader could not renew its Lease within the renew deadline: the process must stop."""


class Elector:
    """Takes, keeps and releases the Lease through the Kubernetes API (kube.api.KubeAPI)."""

    def __init__(self, lease: Lease, kube: api.KubeAPI, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease, self.kube, self.clock = lease, kube, clock
        self._record: tuple[Any, ...] | None = None  # the holder's record as last seen, and when it changed
        self._record_seen_at = 0.0

    async def try_take(self) -> tuple[bool, str]:
        """One attempt to take or renew: (holding it now, what stands in the way)."""
        me = self.lease
        body = await self.kube.get_lease(me.namespace, me.name)
        if body is None:
            return await self.kube.create_lease(me.namespace, taken(None, me, _now())), "created by another replica"
        spec = body.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._record:
            self._record, self._record_seen_at = record, self.clock()
        duration = float(spec.get("leaseDurationSeconds") or me.duration_s)
        if not may_take(holder, me.identity, self._record_seen_at, duration, self.clock()):
            return False, f"held by {holder}"
        if await self.kube.replace_lease(me.namespace, me.name, taken(body, me, _now())):
            return True, ""
        return False, "changed by another replica meanwhile"

    async def acquire(self, state: State, stop: asyncio.Event) -> bool:
        """Try every retry period until this replica holds the Lease (True) or `stop` is set (False); standing by
        meanwhile."""
        me = self.lease
        while not stop.is_set():
            try:
                holding, why = await self.try_take()
            except Exception as error:  # noqa: BLE001  the API unreachable or forbidden: not ready, try again
                holding, why = False, f"Lease {me.namespace}/{me.name}: {api.describe_error(error)}"
                state.set_role(None, why)
            else:
                if holding:
                    state.set_role(LEADER)
                    return True
                state.set_role(STANDBY, why)
            await _wait(stop, me.retry_period_s)
        return False

    async def keep(self, state: State) -> None:
        """Renew every retry period; raise LeadershipLost once no renewal succeeded for the renew deadline."""
        me = self.lease
        renewed = self.clock()
        while True:
            await asyncio.sleep(me.retry_period_s)
            try:
                holding, why = await asyncio.wait_for(self.try_take(), timeout=me.renew_deadline_s)
            except Exception as error:  # noqa: BLE001  retried until the deadline
                holding, why = False, api.describe_error(error)
            if holding:
                renewed = self.clock()
            elif self.clock() - renewed >= me.renew_deadline_s:
                state.set_role(None, f"leadership lost: {why}")
                raise LeadershipLost(f"Lease {me.namespace}/{me.name} not renewed for {me.renew_deadline_s:g} s: "
                                     f"{why}")
            else:
                log.warning("renewing Lease %s/%s failed: %s", me.namespace, me.name, why)

    async def release(self) -> None:
        """Give the Lease up if this replica still holds it; a failure only delays the next leader."""
        me = self.lease
        try:
            body = await self.kube.get_lease(me.namespace, me.name)
            if body is not None and (body.get("spec") or {}).get("holderIdentity") == me.identity:
                await self.kube.replace_lease(me.namespace, me.name, released(body, _now()))
                log.info("released Lease %s/%s", me.namespace, me.name)
        except Exception as error:  # noqa: BLE001  the next leader waits out the lease instead
            log.warning("releasing Lease %s/%s failed: %s", me.namespace, me.name, api.describe_error(error))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout=seconds)
    except TimeoutError:
        pass


class State:
    """What the probes and metrics report: started (kopf's startup done) and the role, or why there is none."""

    def __init__(self, lease: Lease | None) -> None:
        self.lease = lease
        self.started = asyncio.Event()  # kopf's ready flag: raised once the startup handlers are done
        self.role: str | None = STANDALONE if lease is None else None
        self.problem = "" if lease is None else "not in the election yet"
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
        """Ready: standing by in the election, or leading (or standalone) with kopf started."""
        ready = self.role == STANDBY or (self.active and self.started.is_set())
        report: dict[str, Any] = {"ready": ready, "role": self.role}
        if self.active and not self.started.is_set():
            report["problem"] = "starting"
        elif self.problem:
            report["problem"] = self.problem
        if self.lease is not None:
            report |= {"lease": f"{self.lease.namespace}/{self.lease.name}", "identity": self.lease.identity}
        return ready, report
