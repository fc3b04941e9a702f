"""A work queue of object keys with timers, drained by a fixed number of workers (as controller-runtime's).

`add(key)` asks for a reconcile now, `add(key, after=s)` in s seconds; an earlier request wins over a later one, and
a key asked for again while queued is queued once. A key is never processed by two workers at once: asked for while
in progress, it runs again once the current pass ends. So one LibvirtMachine costs nothing between its passes (no
task, no polling), and a burst of N is worked on by as many workers as there are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)
Process = Callable[[K], Awaitable[float | None]]  # returns seconds until the key's next pass, or None


class Retry(float):
    """What a pass returns when it failed: its backoff, in seconds; the queue counts it as a retry."""


class QueueObserver(Protocol):
    """What the queue reports, as controller-runtime's work queues do (operator.metrics.QueueMetrics)."""

    def added(self) -> None: ...  # a key entered the ready queue

    def started(self, waited_s: float) -> None: ...  # a worker took a key that waited this long

    def finished(self, worked_s: float, retry: bool) -> None: ...  # a pass ended; `retry`: it failed


class WorkQueue(Generic[K]):
    def __init__(self, process: Process, workers: int, observer: QueueObserver | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.process = process
        self.workers = workers
        self.observer = observer
        self._clock = clock
        self._added_at: dict[K, float] = {}
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()  # in _ready
        self._running: set[K] = set()
        self._again: set[K] = set()  # asked for while running
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task] = []

    def add(self, key: K, after: float | None = 0) -> None:
        """Reconcile `key` now (after=0) or in `after` seconds; None: only when asked again."""
        if after is None:
            return
        if after > 0:
            self._schedule(key, after)
            return
        self._cancel_timer(key)
        if key in self._running:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._added_at[key] = self._clock()
            self._ready.put_nowait(key)
            if self.observer is not None:
                self.observer.added()

    def forget(self, key: K) -> None:
        """No more passes of `key` (its object is gone), unless asked for again."""
        self._cancel_timer(key)

    def _schedule(self, key: K, after: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + after
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= when:
                return  # an earlier pass is already due
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _cancel_timer(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    @property
    def pending(self) -> int:
        """Keys waiting for a worker or a timer, for the metrics and tests."""
        return len(self._queued) + len(self._timers)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._work(), name=f"reconcile-worker-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for key in list(self._timers):
            self._cancel_timer(key)

    async def _work(self) -> None:
        while True:
            key = await self._ready.get()
            self._queued.discard(key)
            self._running.add(key)
            started = self._clock()
            if self.observer is not None:
                self.observer.started(started - self._added_at.pop(key, started))
            after: float | None = None
            try:
                after = await self.process(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001  the reconcile reports its own failures; this is a last resort
                log.exception("reconcile of %s failed", key)
                after = Retry(30.0)
            finally:
                self._running.discard(key)
                if self.observer is not None:
                    self.observer.finished(self._clock() - started, isinstance(after, Retry))
            if key in self._again:
                self._again.discard(key)
                self.add(key)
            else:
                self.add(key, after)
