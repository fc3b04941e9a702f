"""Waiting for the operator to converge: poll a probe until it returns something truthy, or fail saying what; and
a clock of when each phase of a run was first seen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import timing_report

T = TypeVar("T")

# How long an integration test waits for the operator to converge (a domain running, a status or an event written):
# generous, since a module may run beside guests booting under TCG on the other pytest worker, and free when things
# converge (the probe returns at once). A deadline, never a measure of speed.
CONVERGENCE_S = 300.0


class Pending:
    """A probe's "not yet" that says what it saw (falsy, so wait_until goes on polling; its repr is the timeout's
    "last seen")."""

    def __init__(self, **seen: object) -> None:
        self.seen = seen

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "Pending(" + ", ".join(f"{k}={v!r}" for k, v in self.seen.items()) + ")"


async def wait_until(what: str, probe: Callable[[], Awaitable[T]], deadline_s: float, interval: float = 0.5) -> T:
    """A deadline for convergence, not a performance assertion: generous, and the failure shows the last state. A long
    wait says what it waits for every timing_report.PROGRESS_EVERY_S (a progress line at the terminal)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + deadline_s
    said = started
    last: T | None = None
    while loop.time() < deadline:
        last = await probe()
        if last:
            return last
        if loop.time() - said >= timing_report.PROGRESS_EVERY_S:
            said = loop.time()
            timing_report.progress(f"waiting for {what} ({said - started:.0f} s of at most {deadline_s:.0f} s)")
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {deadline_s:.0f}s waiting for {what}; last seen: {last!r}")


# Events are posted in the background (the operator's EventPoster): one may land a moment after what it tells of.
EVENT_POSTED_S = 60.0


async def events_posted(core, namespace: str, reason: str, involved: str) -> list:
    """The Events of `reason` whose involvedObject matches `involved` (a field selector such as
    "involvedObject.name=x"), once at least one is there (CoreV1Event models); fails naming the reasons seen when none
    comes within EVENT_POSTED_S."""
    async def posted() -> list | Pending:
        listed = await core.list_namespaced_event(namespace, field_selector=involved)
        matching = [e for e in listed.items if e.reason == reason]
        return matching or Pending(reasons=[e.reason for e in listed.items])
    return await wait_until(f"a {reason} event ({involved})", posted, EVENT_POSTED_S)


def wait_for(what: str, probe: Callable[[], T], timeout: float = 90.0, interval: float = 0.5) -> T:
    """wait_until's twin for synchronous probes (tests that drive the API server with plain requests)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")


class Clock:
    """When each phase was first seen, from the start of the run."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, time.monotonic() - self.start)

    def report(self) -> str:
        lines, previous = [], 0.0
        for phase, at in self.marks.items():
            lines.append(f"  {phase:<48} at {at:7.1f}s  (+{at - previous:6.1f}s)")
            previous = at
        return "\n".join(lines)
