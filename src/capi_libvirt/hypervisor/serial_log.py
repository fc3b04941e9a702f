"""A machine's serial console log, read from its host through libvirt's stream API (so over qemu+ssh and qemu+tls
too): the bytes from an offset, or the last ones, for `capi-libvirt console-log` and its follow mode. Like
hypervisor.machines, each function takes an open `virConnect` first and runs in the host connection's thread pool."""

from __future__ import annotations

import dataclasses

import libvirt

from capi_libvirt.hypervisor import errors
from capi_libvirt.hypervisor.machines import STREAM_CHUNK, abort_quietly, refreshed_pool, volume_or_none


@dataclasses.dataclass(frozen=True)
class LogChunk:
    """Bytes of a log, and the log's size when they were read: where a follower reads on from."""

    data: bytes
    end: int


def log_range(size: int, start: int = 0, tail: int | None = None) -> tuple[int, int]:
    """(offset, length) to read of a log of `size` bytes: from `start`, at most the last `tail` bytes of it.

    A log shorter than `start` was truncated or rotated since it was last read: it is read from its beginning.
    """
    if start > size:
        start = 0
    offset = start if tail is None else max(start, size - tail)
    return offset, size - offset


def read_serial_log(conn: libvirt.virConnect, pool_name: str, log_name: str, start: int = 0,
                    tail: int | None = None) -> LogChunk:
    """The machine's serial console log, downloaded through libvirt's stream API (so over qemu+ssh and qemu+tls
    too), from byte `start`, at most its last `tail` bytes; VolumeNotFound when there is no log (yet)."""
    pool = refreshed_pool(conn, pool_name)
    volume = volume_or_none(pool, log_name)
    if volume is None:
        raise errors.VolumeNotFound(f"no serial log {log_name} in pool {pool_name}: the domain has not started "
                                    "yet, or it was deleted")
    size = volume.info()[1]  # capacity: the file's size (refreshed by libvirt on every info call)
    offset, length = log_range(size, start, tail)
    if length == 0:
        return LogChunk(b"", offset)
    stream = conn.newStream(0)
    chunks: list[bytes] = []
    try:
        volume.download(stream, offset, length, 0)
        while chunk := stream.recv(STREAM_CHUNK):
            chunks.append(chunk)
        stream.finish()
    except BaseException:
        abort_quietly(stream)
        raise
    data = b"".join(chunks)
    return LogChunk(data, offset + len(data))
