"""Base images imported from a URL: one import per host, pool and sha256 at a time, shared by the machines waiting.

A machine pass whose spec.image names a URL asks `ImageImports.ensure`: the verified image when the pool has it (found
by its sha256, never fetched twice), else it starts the import as a task of its own (HTTP download streamed into the
pool in the host's transfer thread, hypervisor.images) and raises Wait: the machine waits with ImageImporting and
looks again shortly, without holding a creation slot or a worker; an import that succeeds wakes the host's machines
at once. Every machine wanting the same image on the same host waits for that one task. A failed import wakes
nobody: it is reported to each waiting machine at its next pass (its own backoff follows) and kept for RETRY_AFTER_S,
so machines retrying together start one new import, not one each.

Imported images are never deleted by the provider: machines' overlays are backed by them, and the next machine
wanting the image finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from capi_libvirt import download
from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core import images
from capi_libvirt.hypervisor import errors
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.hypervisor import images as host_images
from capi_libvirt.reconcile.waiting import Wait

log = logging.getLogger(__name__)

RECHECK_IMPORTING_S = 5.0  # a machine waiting for an import looks again this soon; a finished import wakes them at once
RETRY_AFTER_S = 10.0  # a failed import answers the machines waiting for it this long (longer than their recheck, so
# each sees it), then the next pass retries it: as often as the machines' own backoff allows, one import at a time


async def _unknown_room() -> int | None:
    return None


MIB = 1 << 20
# (bytes received, seconds, succeeded), once per import that ran (operator.metrics.image_import).
ImportObserver = Callable[[int, float, bool], None]


@dataclasses.dataclass
class Progress:
    """How far an import's download is: its download is set from the transfer thread, read by the machines' passes."""

    opened: download.Download | None = None

    def track(self, opened: download.Download) -> download.Download:
        self.opened = opened
        return opened

    @property
    def received(self) -> int:
        return self.opened.received if self.opened is not None else 0

    def text(self) -> str:
        """", 120 of 512 MiB received"; "" before the download started."""
        if self.opened is None:
            return ""
        length = self.opened.length
        total = f" of {length / MIB:.0f} MiB" if length else " MiB"
        return f", {self.received / MIB:.0f}{total} received"


@dataclasses.dataclass
class _Import:
    task: asyncio.Task[host_images.ImageVolume]
    url: str
    progress: Progress
    finished_at: float | None = None


class ImageImports:
    """The import this operator runs, or ran last, by (host, pool, sha256)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, observe: ImportObserver | None = None) -> None:
        self._running: dict[tuple[str, str, str], _Import] = {}
        self._clock = clock
        self.observe = observe
        self.started = 0  # imports started since the operator started (a metric's worth, for the tests' numbers)

    async def ensure(self, host: host_api.Host, pool: str, image: v1alpha1.ImageSource,
                     prefixes: Sequence[str], on_imported: Callable[[str], None] = lambda host: None,
                     room: Callable[[], Awaitable[int | None]] = _unknown_room) -> host_images.ImageVolume:
        """The verified image in `pool` on `host`, or Wait (importing, or why the import failed). `on_imported`
        is called with the host's name once an import succeeds (the operator queues the host's machines). `room`
        says what placement may still promise in the pool (None: unknown), asked when an import starts: an image
        larger than that is refused like one larger than the pool's free space."""
        assert image.url is not None and image.sha256 is not None
        key = (host.host, pool, image.sha256)
        current = self._running.get(key)
        if current is not None and not current.task.done():
            raise Wait(reasons.IMAGE_IMPORTING, _importing(current.url, image.sha256, pool, host.host,
                                                               current.progress), RECHECK_IMPORTING_S, failure=False)
        error = None if current is None or current.task.cancelled() else current.task.exception()
        if current is not None and error is not None:
            if self._clock() - (current.finished_at or 0.0) < RETRY_AFTER_S:
                raise _failed(error, current.url, pool, host.host)
            del self._running[key]  # old enough: this pass starts the retry
            current = None
        # No import running, or one that succeeded (or was cancelled): the pool says whether the image is there. A
        # succeeded import's entry stays, so a pass that looked while it finished knows to look again (below). The
        # room is asked first: between the look below and the import's start, nothing may await.
        room_bytes = await room()
        found = await host.find_image(pool, image.sha256)
        if found is not None:
            return found
        now = self._running.get(key)
        if now is not current or (now is not None and now.finished_at is None):
            # while this pass looked, another started an import, or one running finished: ask again
            return await self.ensure(host, pool, image, prefixes, on_imported, room)
        progress = Progress()
        task = asyncio.create_task(self._import(host, pool, image.url, image.sha256, prefixes, room_bytes, progress),
                                   name=f"image-import-{host.host}-{image.sha256[:12]}")
        entry = _Import(task, image.url, progress)
        task.add_done_callback(functools.partial(self._finished, entry, functools.partial(on_imported, host.host)))
        self._running[key] = entry
        self.started += 1
        raise Wait(reasons.IMAGE_IMPORTING, _importing(image.url, image.sha256, pool, host.host),
                       RECHECK_IMPORTING_S, failure=False)

    def _finished(self, entry: _Import, wake: Callable[[], None], task: asyncio.Task[host_images.ImageVolume]) -> None:
        entry.finished_at = self._clock()
        if not task.cancelled() and task.exception() is None:  # (a failure is retrieved here: the machines report it)
            wake()

    async def _import(self, host: host_api.Host, pool: str, url: str, sha256: str,
                      prefixes: Sequence[str], room_bytes: int | None, progress: Progress) -> host_images.ImageVolume:
        started, ok = time.monotonic(), False
        log.info("host %s: importing image %s (sha256 %s) into pool %s", host.host, download.shown(url), sha256, pool)
        allowed = functools.partial(images.url_allowed, prefixes=list(prefixes))

        def opener() -> download.Download:
            return progress.track(download.open_image(url, allowed))
        try:
            volume = await host.import_image(pool, sha256, opener, room_bytes)
            ok = True
        except Exception as error:
            log.warning("host %s: import of image %s into pool %s failed: %s", host.host, download.shown(url), pool,
                        error)
            raise
        finally:
            if self.observe is not None and progress.opened is not None:  # a download was opened
                self.observe(progress.received, time.monotonic() - started, ok)
        log.info("host %s: image %s imported as %s in pool %s (%d bytes, %.1f s)", host.host, download.shown(url),
                 volume.name, pool, volume.size, time.monotonic() - started)
        return volume

    async def close(self) -> None:
        """Cancel the waits on running imports (a transfer already streaming ends on its own: its volume is never
        marked, so the next import removes it)."""
        for entry in self._running.values():
            entry.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*(entry.task for entry in self._running.values()), return_exceptions=True)
        self._running.clear()


def _importing(url: str, sha256: str, pool: str, host: str, progress: Progress | None = None) -> str:
    text = f"importing image {download.shown(url)} (sha256 {sha256}) into pool {pool} on host {host}"
    return text + (progress.text() if progress is not None else "")


def _failed(error: BaseException, url: str, pool: str, host: str) -> BaseException:
    """What a failed import means for a machine waiting for it: a Wait with its reason, or the hypervisor error
    itself (an unreachable host, a missing pool), which the machine reconcile reports as for any other call."""
    shown = download.shown(url)
    if isinstance(error, download.RedirectRefused):
        return Wait(reasons.TENANT_NOT_ALLOWED, str(error), RETRY_AFTER_S, failure=True)
    if isinstance(error, download.DownloadFailed):
        return Wait(reasons.IMAGE_DOWNLOAD_FAILED, str(error), RETRY_AFTER_S, failure=True)
    if isinstance(error, host_images.ChecksumMismatch):
        return Wait(reasons.IMAGE_CHECKSUM_MISMATCH, f"image {shown}: {error.message}", RETRY_AFTER_S, failure=True)
    if isinstance(error, host_images.InsufficientStorage):
        return Wait(reasons.INSUFFICIENT_STORAGE, f"image {shown} into pool {pool} on host {host}: {error.message}",
                        RETRY_AFTER_S, failure=True)
    if isinstance(error, host_images.ImageRefused):
        return Wait(reasons.IMAGE_REFUSED, f"image {shown}: {error.message}", RETRY_AFTER_S, failure=True)
    if isinstance(error, errors.HypervisorError):
        return error
    return Wait(reasons.IMAGE_DOWNLOAD_FAILED, f"importing image {shown} failed: unexpected {type(error).__name__}; "
                    "see the operator log", RETRY_AFTER_S, failure=True)
