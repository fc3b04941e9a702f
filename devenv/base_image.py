"""Put the cached guest image into a host's storage pool as the base image volume machines are overlays of."""

from __future__ import annotations

import json
import subprocess
from typing import BinaryIO

import libvirt

from capi_libvirt.core import volume_xml
from devenv.guest_image import GuestImage

BASE_PREFIX = "base-"

def upload(conn: libvirt.virConnect, volume: libvirt.virStorageVol, source: BinaryIO, size: int) -> None:
    """Stream `size` bytes into the volume through libvirt, as a remote host would get them."""
    stream = conn.newStream(0)
    volume.upload(stream, 0, size, 0)
    stream.sendAll(lambda _stream, nbytes, src: src.read(nbytes), source)
    stream.finish()


def qcow2_virtual_size(path) -> int:
    info = subprocess.run(["qemu-img", "info", "--output=json", str(path)], capture_output=True, text=True, check=True)
    return int(json.loads(info.stdout)["virtual-size"])


def base_volume_name(image: GuestImage) -> str:
    return f"{BASE_PREFIX}{image.folder.name}.qcow2"


def is_base_volume(name: str) -> bool:
    """A base image this module uploaded (of any image or flavor), not something a machine made."""
    return name.startswith(BASE_PREFIX) and name.endswith(".qcow2")


def upload_base_image(conn: libvirt.virConnect, pool_name: str, image: GuestImage) -> str:
    """The image as volume `base-<image folder name>.qcow2` in the pool, so each image and flavor has its own
    (`base-<recipe-hash>.qcow2`, `base-node-<recipe-hash>.qcow2`); uploaded once, reused when complete. Made as an
    admin makes a base image every tenant shares: root's, readable by all (core.volume_xml.BASE_IMAGE_MODE)."""
    name = base_volume_name(image)
    pool = conn.storagePoolLookupByName(pool_name)
    pool.refresh(0)
    if name in pool.listVolumes():
        existing = pool.storageVolLookupByName(name)
        if existing.info()[2] >= image.disk.stat().st_size:  # allocation: a cut-short upload has less
            return name
        existing.delete(0)
    created = pool.createXML(volume_xml.image_volume_xml(name, qcow2_virtual_size(image.disk), "qcow2"), 0)
    with image.disk.open("rb") as disk:
        upload(conn, created, disk, image.disk.stat().st_size)
    return name
