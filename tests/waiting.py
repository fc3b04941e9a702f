"""Waiting for the operator to converge: poll a probe until it returns something truthy, or fail saying what."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


async def wait_until(what: str, probe: Callable[[], Awaitable[T]], deadline_s: float, interval: float = 0.5) -> T:
    """A deadline for convergence, not a performance assertion: generous, and the failure shows the last state."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    last: T | None = None
    while loop.time() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {deadline_s:.0f}s waiting for {what}; last seen: {last!r}")
