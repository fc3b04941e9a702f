"""Linux guest slots: never more Linux guests (node or minimal image, 1 vCPU each) at once than the machine's 2 cores
carry, whichever pytest worker runs the module that boots them.

Each module that boots Linux guests names how many it runs at once at most (conftest.LINUX_GUEST_MODULES) and holds
that many slots for its whole run: one lock file per slot (flock), shared by every pytest process on the machine and
released by the kernel if a process dies. A module takes all its slots or none (never holds one while waiting for
another, so two modules never wait for each other), and says at the terminal while it waits.
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


def _try_take(count: int) -> list[int]:
    """File descriptors of `count` slots taken now, or [] (none held) if fewer are free."""
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    held: list[int] = []
    for slot in range(SLOTS):
        if len(held) == count:
            break
        fd = os.open(SLOT_DIR / f"slot-{slot}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
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
    while not (held := _try_take(count)):
        if time.monotonic() - said >= timing_report.PROGRESS_EVERY_S:
            said = time.monotonic()
            timing_report.progress(f"waiting for {count} Linux guest slot(s) held by another worker's module "
                                   f"({said - started:.0f} s)")
        time.sleep(POLL_S)
    try:
        yield
    finally:
        _release(held)
