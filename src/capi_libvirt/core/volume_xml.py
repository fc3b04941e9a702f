"""Storage volume XML for a machine's volumes (the qcow2 overlay on its base image, data disks, uploaded files) and an
imported image's container, built with an element tree."""

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


def qcow2_volume_xml(name: str, capacity_bytes: int) -> str:
    """An empty qcow2 volume of `capacity_bytes` (virtual size), the container an imported qcow2 image is streamed
    into (the upload replaces its contents from the first byte)."""
    return _empty_volume_xml(name, capacity_bytes, "qcow2")


def _empty_volume_xml(name: str, capacity_bytes: int, fmt: str, allocation: int | None = None) -> str:
    volume = ET.Element("volume", type="file")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(capacity_bytes)
    if allocation is not None:
        ET.SubElement(volume, "allocation", unit="bytes").text = str(allocation)
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type=fmt)
    return ET.tostring(volume, encoding="unicode")


def backing_format_of(volume_xml_text: str) -> str:
    """The format (qcow2, raw) of an existing volume, read from its XML; raw when libvirt does not say."""
    fmt = ET.fromstring(volume_xml_text).find("./target/format")
    return fmt.get("type", "raw") if fmt is not None else "raw"
