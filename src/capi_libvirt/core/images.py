"""Base images imported from a URL: their volume names, which URLs a host allows, and what an image's first bytes
say about it. Pure: no I/O.

An imported image is found again by its checksum: its volume is `capi-image-sha256-<hex>` in the pool, so one sha256
is one image on a host, imported once and shared by every machine that names it. libvirt cannot rename a volume, so an
image is written under its final name and marked finished by a second, empty volume `<image>.verified`, created only
after every byte was written and the sha256 of the streamed bytes matched. An image volume without its marker is a cut
short import (the operator died, the host went away): it is never used, and the next import removes it first.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Sequence

IMAGE_PREFIX = "capi-image-sha256-"
VERIFIED_SUFFIX = ".verified"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_IMAGE_VOLUME = re.compile(r"^capi-image-sha256-[0-9a-f]{64}(\.verified)?$")

QCOW2_MAGIC = b"QFI\xfb"
HEADER_BYTES = 104  # a qcow2 version 3 header's fixed part; version 2 has 72
QCOW2_EXTERNAL_DATA_FILE = 1 << 2  # incompatible feature bit: the guest data lives in another (host) file


class ImageRefused(ValueError):
    """The image's header asks for something a shared base image must never have (a host file behind it)."""


def image_volume_name(sha256: str) -> str:
    """The volume an image with this sha256 lives in."""
    if not _SHA256.match(sha256):
        raise ValueError(f"not a sha256 (64 lowercase hex digits): {sha256[:80]!r}")
    return IMAGE_PREFIX + sha256


def verified_marker_name(sha256: str) -> str:
    """The empty volume whose presence says the image volume is complete and its checksum matched."""
    return image_volume_name(sha256) + VERIFIED_SUFFIX


def is_image_volume(name: str) -> bool:
    """An imported image's volume or its marker: never a machine's, never a stray, never an orphan's."""
    return bool(_IMAGE_VOLUME.match(name))


def url_allowed(url: str, prefixes: Sequence[str]) -> bool:
    """`url` starts with one of `prefixes`, compared as written. A URL whose path has `.` or `..` segments (also
    percent-encoded), a backslash or an empty segment (`//`) is never allowed: a server resolving it would escape the
    prefix. Prefixes come from the API (scheme, host, then a path from its first /), so no prefix can be extended
    into another host name."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None or \
            parts.password is not None or parts.fragment or "\\" in url:
        return False
    path = urllib.parse.unquote(parts.path)
    if "\\" in path or not path.startswith("/"):
        return False
    segments = path.split("/")[1:]
    if any(segment in (".", "..") for segment in segments) or "" in segments[:-1]:
        return False
    return any(url.startswith(prefix) for prefix in prefixes)


def redirect_target(current: str, location: str) -> str:
    """Where a redirect (`Location` header) from `current` leads, as an absolute URL."""
    return urllib.parse.urljoin(current, location)


@dataclasses.dataclass(frozen=True)
class ImageFormat:
    """What an image's first bytes say: its format and (qcow2) the guest disk's size."""

    format: str  # qcow2 or raw
    virtual_size: int | None = None  # qcow2: from its header; raw: the file's size, known once it is all there


def inspect_header(head: bytes) -> ImageFormat:
    """The format of an image from its first bytes (at least HEADER_BYTES, or the whole image when shorter).

    A qcow2 image with a backing file or an external data file is refused: both are paths on the host, so an image
    from a URL could read any host file into the guest. A raw image is a disk as it is (never probed further, so it
    cannot pretend to be anything else)."""
    if not head.startswith(QCOW2_MAGIC):
        return ImageFormat("raw")
    if len(head) < 72:
        raise ImageRefused("the image is a truncated qcow2 header")
    version = int.from_bytes(head[4:8], "big")
    if version not in (2, 3):
        raise ImageRefused(f"qcow2 version {version} is not supported (2 or 3)")
    if int.from_bytes(head[8:16], "big") != 0:
        raise ImageRefused("the qcow2 image names a backing file: a base image must stand alone")
    if version == 3:
        if len(head) < HEADER_BYTES:
            raise ImageRefused("the image is a truncated qcow2 header")
        if int.from_bytes(head[72:80], "big") & QCOW2_EXTERNAL_DATA_FILE:
            raise ImageRefused("the qcow2 image keeps its data in an external file: a base image must stand alone")
    return ImageFormat("qcow2", int.from_bytes(head[24:32], "big"))


def storage_message(needed: int, available: int, pool: str, promised: bool = False) -> str:
    """Why an image does not fit: both numbers, in MiB and bytes. `promised`: `available` is what placement may still
    promise in the pool (its capacity x overcommit, less the machines' disks and the other volumes), not its free
    space."""
    if promised:
        return (f"the image needs {_mib(needed)} but placement may promise only {_mib(max(available, 0))} more in pool "
                f"{pool} (capacity x overcommit, less the machines' disks and the other volumes)")
    return f"the image needs {_mib(needed)} but pool {pool} has {_mib(available)} available"


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB ({size} bytes)"

