"""Imported base images in a host's storage pool: found by their sha256, streamed in through libvirt's upload stream.

`import_image` reads its source (any object with `length` and `read`, reconcile passes an HTTP download) chunk by
chunk, hashes each chunk and sends it into a new volume's upload stream, so the image is never whole in memory and
works over qemu+ssh and qemu+tls like any other libvirt call. It runs in a worker thread (HostConnection's transfer
thread), never on the event loop. The volume is named from the sha256 (core.images); it counts as an image only once
its `.verified` marker exists, made after the last byte was written, the streamed bytes' checksum matched and the
volume, read back, hashed the same. Every failure (a
mismatch, a download cut short, a full pool, the host going away) aborts the stream and deletes the volume: nothing
half-written stays in the pool, and a marker-less volume left by a crash is removed before the next import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Callable
from typing import Protocol

import libvirt

from capi_libvirt.core import images, volume_xml
from capi_libvirt.hypervisor import errors, machines

CHUNK = 1024 * 1024


class Source(Protocol):
    """Where the image's bytes come from: `length` when known in advance, `read` until b""."""

    length: int | None

    def read(self, size: int = ...) -> bytes: ...


class ChecksumMismatch(errors.HypervisorError):
    """The streamed bytes do not hash to the sha256 the spec names; nothing was kept."""

    def __init__(self, expected: str, actual: str, size: int) -> None:
        super().__init__(f"the downloaded image ({size} bytes) has sha256 {actual}, not {expected} as spec.image.sha256 "
                         "says; nothing was kept")
        self.expected, self.actual = expected, actual


class InsufficientStorage(errors.HypervisorError):
    """The pool has no room for the image (checked against Content-Length first, or it filled up while streaming)."""


class ImageRefused(errors.HypervisorError):
    """The image is not one a base image may be (core.images.inspect_header says why)."""


@dataclasses.dataclass(frozen=True)
class ImageVolume:
    """An imported image, complete and verified: its volume, path and format."""

    name: str
    path: str
    format: str
    size: int = 0  # bytes streamed, when this call imported it (0: found in the pool)


def find_image(conn: libvirt.virConnect, pool_name: str, sha256: str) -> ImageVolume | None:
    """The verified image with this sha256 in the pool, or None (absent, or an import that never finished)."""
    pool = machines.active_pool(conn, pool_name)
    if machines.volume_or_none(pool, images.verified_marker_name(sha256)) is None:
        return None
    volume = machines.volume_or_none(pool, images.image_volume_name(sha256))
    if volume is None:
        return None
    return ImageVolume(volume.name(), volume.path(), volume_xml.backing_format_of(volume.XMLDesc(0)))


def import_image(conn: libvirt.virConnect, pool_name: str, sha256: str,
                 open_source: Callable[[], contextlib.AbstractContextManager[Source]],
                 room_bytes: int | None = None) -> ImageVolume:
    """The verified image with this sha256 in the pool, imported from `open_source()` unless it is there already.

    The caller makes sure no other import of the same image into the same pool runs (one per host, pool and sha256),
    so an unmarked volume here is an import of the past that never got its marker: cut short (the operator or the
    host died while streaming), or complete but stopped just before the marker (or the marker removed by hand). It is
    read back and hashed: only when it is the image, every byte, is it marked and used (no second download); else
    it is removed and the image imported again. A marker without its image is removed. An image larger than the
    pool's free space, or than `room_bytes` (what placement may still promise there), is refused before a byte is
    written (InsufficientStorage).
    """
    found = find_image(conn, pool_name, sha256)
    if found is not None:
        return found
    name, marker = images.image_volume_name(sha256), images.verified_marker_name(sha256)
    pool = machines.active_pool(conn, pool_name)
    stale = machines.volume_or_none(pool, marker)
    if stale is not None:
        stale.delete(0)
    unmarked = machines.volume_or_none(pool, name)
    if unmarked is not None:
        if _hashes_to(conn, unmarked, sha256):
            pool.createXML(volume_xml.raw_volume_xml(marker, 0), 0)
            return ImageVolume(name, unmarked.path(), volume_xml.backing_format_of(unmarked.XMLDesc(0)))
        unmarked.delete(0)
    with open_source() as source:
        head = _read_head(source)
        try:
            shape = images.inspect_header(head)
        except images.ImageRefused as error:
            raise ImageRefused(str(error)) from None
        if source.length is not None and room_bytes is not None and source.length > room_bytes:
            raise InsufficientStorage(images.storage_message(source.length, room_bytes, pool_name, promised=True))
        available = _available(conn, pool_name)
        if source.length is not None and source.length > available:
            raise InsufficientStorage(images.storage_message(source.length, available, pool_name))
        capacity = shape.virtual_size or source.length or 0
        volume = pool.createXML(volume_xml.image_volume_xml(name, capacity, shape.format), 0)
        size = _stream_verified(conn, pool_name, volume, source, head, sha256)
    pool.createXML(volume_xml.raw_volume_xml(marker, 0), 0)
    return ImageVolume(name, volume.path(), shape.format, size)


def _hashes_to(conn: libvirt.virConnect, volume: libvirt.virStorageVol, sha256: str, length: int = 0) -> bool:
    """Whether the volume's bytes (its first `length`; 0: all), read back through a download stream in chunks, hash to
    `sha256`."""
    stream = conn.newStream(0)
    digest = hashlib.sha256()
    try:
        volume.download(stream, 0, length, 0)
        while chunk := stream.recv(CHUNK):
            digest.update(chunk)
        stream.finish()
    except BaseException:
        machines.abort_quietly(stream)
        raise
    return digest.hexdigest() == sha256


def _read_head(source: Source) -> bytes:
    """The first bytes of the image, enough for its header (less only when the image is smaller)."""
    head = b""
    while len(head) < images.HEADER_BYTES:
        data = source.read(CHUNK)
        if not data:
            break
        head += data
    return head


def _available(conn: libvirt.virConnect, pool_name: str) -> int:
    _state, _capacity, _allocation, available = machines.refreshed_pool(conn, pool_name).info()
    return int(available)


class _StoredBytesDiffer(Exception):
    """The volume does not hold the bytes that were sent (libvirt reported the upload done all the same)."""


def _stream_verified(conn: libvirt.virConnect, pool_name: str, volume: libvirt.virStorageVol, source: Source,
                     head: bytes, sha256: str) -> int:
    """Send the image into the volume, hashing as it goes; the stream is finished only when the sha256 matched, and
    then the volume is read back and hashed: the marker certifies what is stored, not what was sent (an upload into a
    pool that filled up was seen to finish without an error, its tail lost). On any failure the stream is aborted and
    the volume deleted (InsufficientStorage when the pool filled up)."""
    stream = conn.newStream(0)
    digest = hashlib.sha256()
    sent = 0
    try:
        volume.upload(stream, 0, source.length or 0, 0)
        data = head
        while data:
            digest.update(data)
            _send_all(stream, data)
            sent += len(data)
            data = source.read(CHUNK)
        actual = digest.hexdigest()
        if actual != sha256:
            raise ChecksumMismatch(sha256, actual, sent)
        stream.finish()
        if not _hashes_to(conn, volume, sha256, sent):
            raise _StoredBytesDiffer()
    except BaseException as error:
        machines.abort_quietly(stream)
        full = None
        if isinstance(error, (libvirt.libvirtError, _StoredBytesDiffer)):
            full = _full_pool(conn, pool_name, source, sent)
        _delete_quietly(volume)
        if full is not None:
            raise InsufficientStorage(full) from None
        if isinstance(error, _StoredBytesDiffer):
            raise errors.HypervisorError(f"the image read back from pool {pool_name} does not hash to its sha256 "
                                         f"({sent} bytes were sent); the volume was removed") from None
        raise
    return sent


def _send_all(stream: libvirt.virStream, data: bytes) -> None:
    view = memoryview(data)
    while view:
        count = stream.send(bytes(view[:machines.STREAM_CHUNK]))
        if count < 0:
            raise errors.HypervisorError("upload stream refused data")
        view = view[count:]


def _full_pool(conn: libvirt.virConnect, pool_name: str, source: Source, sent: int) -> str | None:
    """Whether a libvirt error while streaming was the pool filling up: judged by the pool's free space (never by the
    error's text), with the partial volume still there. Returns the message, or None (another failure)."""
    try:
        available = _available(conn, pool_name)
    except (libvirt.libvirtError, errors.HypervisorError):
        return None
    remaining = source.length - sent if source.length is not None else 0
    if available >= max(remaining, CHUNK):  # room left for what was still to come: another failure
        return None
    needed = source.length if source.length is not None else sent
    return (f"pool {pool_name} filled up while the image was streamed in ({sent} bytes written, "
            f"{available} bytes left; the image needs {needed} bytes or more); the partial volume was removed")


def _delete_quietly(volume: libvirt.virStorageVol) -> None:
    """Remove a partial image; a failure here (the host went away) leaves an unmarked volume that the next import
    removes, and that is never used meanwhile."""
    try:
        volume.delete(0)
    except libvirt.libvirtError:
        pass
