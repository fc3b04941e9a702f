"""The machine work queue: one pass per key at a time, keys asked for while running run again, timers bring keys
back, an earlier request wins over a later one, and a burst is worked on by every worker at once."""

from __future__ import annotations

import asyncio

import pytest

from capi_libvirt.operator.workqueue import Retry, WorkQueue

pytestmark = pytest.mark.unit


async def settle(seconds: float = 0.05) -> None:
    await asyncio.sleep(seconds)


async def test_a_key_asked_for_many_times_while_queued_runs_once() -> None:
    passes: list[str] = []

    async def process(key: str) -> None:
        passes.append(key)

    queue = WorkQueue(process, workers=2)
    for _ in range(5):
        queue.add("a")
    queue.start()
    await settle()
    await queue.stop()
    assert passes == ["a"]


async def test_a_key_never_runs_twice_at_once_and_runs_again_when_asked_while_running() -> None:
    running, most, passes = 0, 0, 0
    release = asyncio.Event()

    async def process(key: str) -> None:
        nonlocal running, most, passes
        running += 1
        most = max(most, running)
        passes += 1
        if passes == 1:
            await release.wait()
        running -= 1

    queue = WorkQueue(process, workers=4)
    queue.start()
    queue.add("a")
    await settle()
    queue.add("a")
    queue.add("a")
    await settle()
    assert passes == 1, "not while the first pass runs"
    release.set()
    await settle()
    await queue.stop()
    assert (passes, most) == (2, 1)


async def test_the_returned_delay_brings_the_key_back_and_an_earlier_request_wins() -> None:
    seen: list[float] = []
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def process(key: str) -> float | None:
        seen.append(loop.time() - start)
        return 0.2 if len(seen) == 1 else None

    queue = WorkQueue(process, workers=1)
    queue.start()
    queue.add("a")
    await settle(0.3)
    assert len(seen) == 2 and 0.15 < seen[1] < 0.3
    queue.add("a", after=5)
    queue.add("a", after=0.05)  # earlier: wins
    queue.add("a", after=3)  # later than the one due: ignored
    await settle(0.2)
    assert len(seen) == 3
    assert queue.pending == 0
    await queue.stop()


async def test_forget_cancels_the_timer() -> None:
    passes = 0

    async def process(key: str) -> None:
        nonlocal passes
        passes += 1

    queue = WorkQueue(process, workers=1)
    queue.start()
    queue.add("a", after=0.05)
    queue.forget("a")
    await settle(0.15)
    await queue.stop()
    assert passes == 0


async def test_a_burst_is_worked_on_by_every_worker_and_a_failing_pass_is_retried() -> None:
    running, most = 0, 0
    failed: set[int] = set()

    async def process(key: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.02)
        running -= 1
        if key not in failed:
            failed.add(key)
            raise RuntimeError("boom")

    queue = WorkQueue(process, workers=3)
    queue.start()
    for key in range(9):
        queue.add(key)
    await settle(0.2)
    assert most == 3
    assert queue.pending == 9, "each failed key is due again later (30 s), not lost"
    await queue.stop()


class Recorder:
    """A QueueObserver that keeps what it is told."""

    def __init__(self) -> None:
        self.adds, self.waits, self.works, self.retries = 0, [], [], 0

    def added(self) -> None:
        self.adds += 1

    def started(self, waited_s: float) -> None:
        self.waits.append(waited_s)

    def finished(self, worked_s: float, retry: bool) -> None:
        self.works.append(worked_s)
        self.retries += retry


async def test_the_queue_reports_adds_waits_work_and_retries_as_controller_runtimes_queues_do() -> None:
    now = [100.0]

    async def process(key: str) -> float | None:
        now[0] += 2.0  # each pass "takes" 2 s of the fake clock
        if key == "fails":
            return Retry(60.0)
        if key == "raises":
            raise RuntimeError("a bug")
        return None

    recorder = Recorder()
    queue = WorkQueue(process, workers=1, observer=recorder, clock=lambda: now[0])
    for key in ("ok", "ok", "fails", "raises"):
        queue.add(key)
    now[0] += 5.0  # they wait 5 s before the worker starts
    queue.start()
    await settle()
    assert queue.pending == 2  # the failed ones are back on timers
    await queue.stop()
    assert recorder.adds == 3  # "ok" asked twice while queued is one add
    assert recorder.waits == [5.0, 7.0, 9.0]  # each also waited for the passes before it
    assert recorder.works == [2.0, 2.0, 2.0]
    assert recorder.retries == 2  # the failed pass and the one that raised (requeued after 30 s)


def test_a_retry_is_its_backoff_in_seconds() -> None:
    assert Retry(12.5) == 12.5 and isinstance(Retry(1), float)
