"""Storage volume XML for a machine's volumes (the qcow2 overlay on its base image, data disks, uploaded files) and an
imported image's container, built with an element tree; and what a base image's XML says about sharing it."""

from __future__ import annotations

import xml.etree.ElementTree as ET


def overlay_volume_xml(name: str, capacity_bytes: int, backing_path: str, backing_format: str) -> str:
    """A qcow2 volume whose `<backingStore>` is the base image: copy-on-write, sized to `capacity_bytes`."""
    volume = ET.Element("volume", type="file")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(capacity_bytes)
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type="qcow2")
    backing = ET.SubElement(volume, "backingStore")
    ET.SubElement(backing, "path").text = backing_path
    ET.SubElement(backing, "format", type=backing_format)
    return ET.tostring(volume, encoding="unicode")


def data_volume_xml(name: str, capacity_bytes: int) -> str:
    """An empty, thin qcow2 volume of `capacity_bytes`: a machine's data disk."""
    return _empty_volume_xml(name, capacity_bytes, "qcow2", allocation=0)


def raw_volume_xml(name: str, capacity_bytes: int) -> str:
    """A raw volume of exactly `capacity_bytes`, the container an uploaded NoCloud ISO goes into."""
    return _empty_volume_xml(name, capacity_bytes, "raw", allocation=0)


# A base image's file mode: readable by every user, written by root only. Machines' overlays name it as their backing
# file with libvirt's relabelling off (core.domain_xml.BackingFile), so each guest's QEMU, running as the host's
# unprivileged QEMU user, reads it as it is, and no guest's QEMU can ever write to it.
BASE_IMAGE_MODE = 0o644


def image_volume_xml(name: str, capacity_bytes: int, fmt: str) -> str:
    """An empty base image volume of `capacity_bytes` (virtual size) and format `fmt` (qcow2, or raw: thin), with
    BASE_IMAGE_MODE: the container an imported or uploaded image is streamed into (from its first byte)."""
    return _empty_volume_xml(name, capacity_bytes, fmt, allocation=0 if fmt == "raw" else None, mode=BASE_IMAGE_MODE)


def _empty_volume_xml(name: str, capacity_bytes: int, fmt: str, allocation: int | None = None,
                      mode: int | None = None) -> str:
    volume = ET.Element("volume", type="file")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(capacity_bytes)
    if allocation is not None:
        ET.SubElement(volume, "allocation", unit="bytes").text = str(allocation)
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type=fmt)
    if mode is not None:
        ET.SubElement(ET.SubElement(target, "permissions"), "mode").text = f"{mode:04o}"
    return ET.tostring(volume, encoding="unicode")


def backing_format_of(volume_xml_text: str) -> str:
    """The format (qcow2, raw) of an existing volume, read from its XML; raw when libvirt does not say."""
    fmt = ET.fromstring(volume_xml_text).find("./target/format")
    return fmt.get("type", "raw") if fmt is not None else "raw"


def shareable_base(volume_xml_text: str) -> bool:
    """Whether a base image can be every overlay's backing file as it is (core.domain_xml.BackingFile): it has no
    backing file of its own, it is root's, every user may read it and only its owner may write it (libvirt's XML of
    the volume gives its owner and file mode). So a base an earlier start gave to the QEMU user, or one that others
    may write, is not: libvirt then finds the chain and labels it as it always did, and the machine is warned about."""
    volume = ET.fromstring(volume_xml_text)
    if volume.findtext("./backingStore/path"):
        return False
    mode, owner = volume.findtext("./target/permissions/mode"), volume.findtext("./target/permissions/owner")
    try:
        return mode is not None and owner is not None and int(owner) == 0 and int(mode, 8) & 0o004 != 0 and \
            int(mode, 8) & 0o022 == 0
    except ValueError:
        return False
