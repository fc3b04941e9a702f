"""A guest that costs almost nothing: Debian's iPXE image (package `ipxe`) as a qcow2 base volume.

It boots in a second or two under software emulation and takes a DHCP lease, so "provisioned" means a real address
found the way the provider finds one, while dozens of them fit in a few GiB. The bench (bench/testbed.py), the
chaos test (tests/e2e/test_chaos.py) and the host-outage tests (tests/e2e/test_host_outage.py) run it where a guest
need not run an operating system.
"""

from __future__ import annotations

import pathlib
import subprocess

import libvirt

from capi_libvirt.core import volume_xml
from devenv import base_image

IPXE_ISO = pathlib.Path("/usr/lib/ipxe/ipxe.iso")
BASE_VOLUME = "bench-ipxe.qcow2"


def machine_spec(pool: str, network: str, volume: str = BASE_VOLUME) -> dict:
    """A LibvirtMachine spec booting the iPXE volume: one vCPU, 128 MiB, a 1 GiB overlay, one NIC on `network`."""
    return {"image": {"volume": volume}, "storagePool": pool, "domainType": "qemu", "machineType": "pc",
            "cpus": 1, "memoryMiB": 128, "diskGiB": 1, "interfaces": [{"network": network}]}


def ipxe_qcow2(folder: pathlib.Path, name: str = BASE_VOLUME) -> pathlib.Path:
    """Debian's iPXE ISO converted to qcow2 as `folder/name`."""
    if not IPXE_ISO.exists():
        raise SystemExit(f"{IPXE_ISO} is missing: install Debian's ipxe package (make system-deps does)")
    target = folder / name
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(IPXE_ISO), str(target)], check=True)
    return target


def upload_base(conn: libvirt.virConnect, pool_name: str, image: pathlib.Path, volume_name: str = BASE_VOLUME) -> str:
    """The qcow2 image as the volume `volume_name` of the pool; returns that name."""
    pool = conn.storagePoolLookupByName(pool_name)
    created = pool.createXML(volume_xml.image_volume_xml(volume_name, base_image.qcow2_virtual_size(image), "qcow2"), 0)
    with image.open("rb") as source:
        base_image.upload(conn, created, source, image.stat().st_size)
    return volume_name
