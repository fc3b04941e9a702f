"""The cheapest real guest: Debian's iPXE image (package `ipxe`) as a qcow2 base volume. It boots in a second or two
under software emulation and takes a DHCP lease, so a machine of it is "provisioned" with a real address found the way
the provider finds one, for a few MiB of memory. The bench and the host-outage tests use it where a guest needs no OS.
"""

from __future__ import annotations

import pathlib
import subprocess
import xml.etree.ElementTree as ET

import libvirt

from devenv import base_image

IPXE_ISO = pathlib.Path("/usr/lib/ipxe/ipxe.iso")


def machine_spec(volume: str, pool: str, network: str) -> dict:
    """A LibvirtMachine spec of an iPXE guest: 1 vCPU, 128 MiB, TCG, booting the base volume's copy-on-write overlay."""
    return {"image": {"volume": volume}, "storagePool": pool, "domainType": "qemu", "machineType": "pc",
            "cpus": 1, "memoryMiB": 128, "diskGiB": 1, "interfaces": [{"network": network}]}


def ipxe_qcow2(folder: pathlib.Path, name: str) -> pathlib.Path:
    """The iPXE ISO converted to `folder/name` (qcow2); SystemExit naming the package when it is missing."""
    if not IPXE_ISO.exists():
        raise SystemExit(f"{IPXE_ISO} is missing: install Debian's ipxe package (make system-deps does)")
    target = folder / name
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(IPXE_ISO), str(target)], check=True)
    return target


def upload_base(conn: libvirt.virConnect, pool_name: str, image: pathlib.Path, volume_name: str) -> None:
    """The image as the qcow2 volume `volume_name` of the pool."""
    pool = conn.storagePoolLookupByName(pool_name)
    volume = ET.Element("volume", type="file")
    ET.SubElement(volume, "name").text = volume_name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(base_image.qcow2_virtual_size(image))
    ET.SubElement(ET.SubElement(volume, "target"), "format", type="qcow2")
    created = pool.createXML(ET.tostring(volume, encoding="unicode"), 0)
    with image.open("rb") as source:
        base_image.upload(conn, created, source, image.stat().st_size)
