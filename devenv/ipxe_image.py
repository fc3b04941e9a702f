"""A guest that costs almost nothing: Debian's iPXE image (package `ipxe`) as a qcow2 base volume.

It boots in a second or two under software emulation and takes a DHCP lease, so "provisioned" means a real address
found the way the provider finds one, while dozens of them fit in a few GiB. The bench (bench/testbed.py), the
chaos test (tests/e2e/test_chaos.py) and the host-outage tests (tests/e2e/test_host_outage.py) run it where a guest
need not run an operating system.

Debian's ISO boots iPXE's autoboot, which tries DHCP for about 15 s and then gives up for good ("No bootable
device"): on 2 busy cores a guest now and then missed its lease that way and a test waited in vain. The ISO is
therefore remastered (pycdlib, as the NoCloud ISO is built) so that ISOLINUX hands iPXE a script as its initrd,
which asks for a lease until it has one and then idles, as a real OS would keep its address. The El Torito EFI
image goes (only BIOS guests boot it), and the hybrid MBR is written again so the ISO still boots as a disk.
"""

from __future__ import annotations

import io
import pathlib
import subprocess

import libvirt
import pycdlib

from capi_libvirt.core import volume_xml
from devenv import base_image

IPXE_ISO = pathlib.Path("/usr/lib/ipxe/ipxe.iso")
BASE_VOLUME = "bench-ipxe.qcow2"
RETRYING_SCRIPT = b"""#!ipxe
:lease
dhcp || goto lease
echo leased ${ip}
:idle
sleep 3600 || goto idle
goto idle
"""
ISOLINUX_CFG = b"""SAY capi-libvirt test guest: iPXE asks for a DHCP lease until it has one
TIMEOUT 0
DEFAULT ipxe
LABEL ipxe
 KERNEL ipxe.krn
 INITRD retry.ipxe
"""


def machine_spec(pool: str, network: str, volume: str = BASE_VOLUME) -> dict:
    """A LibvirtMachine spec booting the iPXE volume: one vCPU, 128 MiB, a 1 GiB overlay, one NIC on `network`."""
    return {"image": {"volume": volume}, "storagePool": pool, "domainType": "qemu", "machineType": "pc",
            "cpus": 1, "memoryMiB": 128, "diskGiB": 1, "interfaces": [{"network": network}]}


def ipxe_qcow2(folder: pathlib.Path, name: str = BASE_VOLUME) -> pathlib.Path:
    """Debian's iPXE ISO, remastered to retry DHCP (see the module's docstring), as the qcow2 image `folder/name`."""
    if not IPXE_ISO.exists():
        raise SystemExit(f"{IPXE_ISO} is missing: install Debian's ipxe package (make system-deps does)")
    target, remastered = folder / name, folder / f"{name}.iso"
    iso = pycdlib.PyCdlib()
    iso.open(str(IPXE_ISO))
    try:
        iso.rm_isohybrid()
        iso.rm_eltorito()
        iso.rm_file(iso_path="/EFI.IMG;1", joliet_path="/efi.img", rr_name="efi.img")
        iso.rm_file(iso_path="/ISOLINUX.CFG;1", joliet_path="/isolinux.cfg", rr_name="isolinux.cfg")
        for iso_path, joliet_name, data in (("/ISOLINUX.CFG;1", "isolinux.cfg", ISOLINUX_CFG),
                                            ("/RETRY.IPX;1", "retry.ipxe", RETRYING_SCRIPT)):
            iso.add_fp(io.BytesIO(data), len(data), iso_path, joliet_path=f"/{joliet_name}", rr_name=joliet_name)
        iso.add_eltorito("/ISOLINUX.BIN;1", "/BOOT.CAT;1", boot_load_size=4, boot_info_table=True)
        iso.add_isohybrid()
        iso.write(str(remastered))
    finally:
        iso.close()
    try:
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(remastered), str(target)], check=True)
    finally:
        remastered.unlink()
    return target


def upload_base(conn: libvirt.virConnect, pool_name: str, image: pathlib.Path, volume_name: str = BASE_VOLUME) -> str:
    """The qcow2 image as the volume `volume_name` of the pool; returns that name."""
    pool = conn.storagePoolLookupByName(pool_name)
    created = pool.createXML(volume_xml.image_volume_xml(volume_name, base_image.qcow2_virtual_size(image), "qcow2"), 0)
    with image.open("rb") as source:
        base_image.upload(conn, created, source, image.stat().st_size)
    return volume_name
