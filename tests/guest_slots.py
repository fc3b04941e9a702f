"""Linux guest slots: never more Linux guests (node or minimal image, 1 vCPU each) at once than the machine's 2 cores
carry, whichever pytest worker runs the module that boots them.

Each module that boots Linux guests names how many it runs at once at most (conftest.LINUX_GUEST_MODULES) and holds
that many slots for its whole run: one lock file per slot (flock), shared by every pytest process on the machine and
released by the kernel if a process dies. A module takes all its slots or none (never holds one while waiting for
another, so two modules never wait for each other), and says at the terminal while it waits. A module waiting for
more than one slot goes first: it holds the queue lock while it waits, and a module takes a slot only while no one
holds that (else one-guest modules on the other worker, one after the other, would never leave two slots free at
once).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import time
from collections.abc import Iterator

SLOTS = 2  # the machine's cores: each Linux guest is one TCG vCPU, busy while it boots
SLOT_DIR = pathlib.Path(os.environ.get("CAPI_LIBVIRT_GUEST_SLOTS", "/run/capi-libvirt-test-guest-slots"))
POLL_S = 1.0


def _lock(name: str, how: int) -> int | None:
    """The file descriptor of lock file `name` locked (`how`: LOCK_EX or LOCK_SH) now, or None if it is held."""
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(SLOT_DIR / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _try_take(count: int) -> list[int]:
    """File descriptors of `count` slots taken now, or [] (none held) if fewer are free."""
    held: list[int] = []
    for slot in range(SLOTS):
        if len(held) == count:
            break
        fd = _lock(f"slot-{slot}", fcntl.LOCK_EX)
        if fd is not None:
            held.append(fd)
    if len(held) < count:
        _release(held)
        return []
    return held


def _release(held: list[int]) -> None:
    for fd in held:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def linux_guest_slots(count: int, what: str) -> Iterator[None]:
    """Hold `count` (1..SLOTS) slots while the block runs; `what` names the holder in the progress lines."""
    if not 1 <= count <= SLOTS:
        raise ValueError(f"{what}: {count} Linux guests at once; the machine carries 1 to {SLOTS}")
    import timing_report  # (a plugin of conftest's: imported once pytest has loaded it)

    started = said = time.monotonic()
    queue: int | None = None  # the queue lock, held (exclusively) by a module waiting for several slots
    try:
        while True:
            if count > 1 and queue is None:
                queue = _lock("queue", fcntl.LOCK_EX)
            # the queue lock is ours, or (one slot) no one waiting for several holds it
            gate = queue if count > 1 else _lock("queue", fcntl.LOCK_SH)
            if gate is not None:
                held = _try_take(count)
                if gate is not queue:
                    _release([gate])
                if held:
                    break
            if time.monotonic() - said >= timing_report.PROGRESS_EVERY_S:
                said = time.monotonic()
                timing_report.progress(f"waiting for {count} Linux guest slot(s) held by another worker's module "
                                       f"({said - started:.0f} s)")
            time.sleep(POLL_S)
    finally:
        if queue is not None:
            _release([queue])
    try:
        yield
    finally:
        _release(held)
