"""Smoke test of the whole guest path: the cached image boots as a TCG guest on the test libvirt host, cloud-init runs
the user-data from a NoCloud seed uploaded through libvirt, the guest gets a DHCP lease in the host's network, and its
guest agent reports the same address."""

from __future__ import annotations

import dataclasses
import io
import ipaddress
import pathlib
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from typing import TypeVar

import libvirt
import pytest

import guest_agent
import timing_report
from capi_libvirt.core import domain_xml as provider_domain_xml
from capi_libvirt.core.nocloud import build_nocloud_iso
from devenv import apparmor_check
from devenv.base_image import upload
from devenv.guest_image import GuestImage
from devenv.libvirt_host import LibvirtHost

pytestmark = pytest.mark.e2e

BOOT_DEADLINE_S = 480.0  # TCG boot to cloud-init finished takes 30-40 s on an idle machine; CI may be far busier
LEASE_DEADLINE_S = 120.0
GUEST_MEMORY_MIB = 256
OVERLAY_CAPACITY = 4 << 30

T = TypeVar("T")


# -- volumes ------------------------------------------------------------------------------------------------------

def volume_xml(name: str, capacity: int, fmt: str, backing: libvirt.virStorageVol | None = None) -> str:
    volume = ET.Element("volume", type="file")
    ET.SubElement(volume, "name").text = name
    ET.SubElement(volume, "capacity", unit="bytes").text = str(capacity)
    target = ET.SubElement(volume, "target")
    ET.SubElement(target, "format", type=fmt)
    if backing is not None:
        store = ET.SubElement(volume, "backingStore")
        ET.SubElement(store, "path").text = backing.path()
        ET.SubElement(store, "format", type="qcow2")
    return ET.tostring(volume, encoding="unicode")


# -- the guest ----------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Guest:
    name: str
    token: str
    serial_log: pathlib.Path
    domain: libvirt.virDomain

    @property
    def final_message(self) -> str:
        return self.final_message_for(self.token)

    @staticmethod
    def final_message_for(token: str) -> str:
        return f"capi-libvirt smoke {token} finished"


def user_data(token: str, final_message: str) -> bytes:
    return (
        "#cloud-config\n"
        f"runcmd:\n  - [sh, -c, 'echo runcmd-says-{token}']\n"
        # $DATASOURCE names the data source cloud-init chose: the seed must have been found on the CD-ROM.
        f"final_message: '{final_message} datasource=$DATASOURCE'\n"
    ).encode()


def meta_data(name: str) -> bytes:
    return f"instance-id: {name}\nlocal-hostname: {name}\n".encode()


def domain_xml(name: str, image: GuestImage, boot: tuple[str, str], disk: str, base: str, seed: str, network: str,
               serial_log: pathlib.Path) -> str:
    """A TCG guest booting the image's kernel directly (`boot`: the host's copies of its kernel and initrd); its disk
    an overlay on `base`, named as the provider names it (so libvirt leaves the shared base as it is); the seed
    CD-ROM on IDE (the cloud kernel has no SATA)."""
    domain = ET.Element("domain", type="qemu")
    ET.SubElement(domain, "name").text = name
    ET.SubElement(domain, "memory", unit="MiB").text = str(GUEST_MEMORY_MIB)
    ET.SubElement(domain, "vcpu").text = "1"
    os_ = ET.SubElement(domain, "os")
    ET.SubElement(os_, "type", arch="x86_64", machine="pc").text = "hvm"
    ET.SubElement(os_, "kernel").text, ET.SubElement(os_, "initrd").text = boot
    ET.SubElement(os_, "cmdline").text = image.kernel_cmdline
    features = ET.SubElement(domain, "features")
    ET.SubElement(features, "acpi")
    tcg = ET.SubElement(features, "tcg")
    ET.SubElement(tcg, "tb-cache", unit="MiB").text = str(provider_domain_xml.DEFAULT_TCG_TB_CACHE_MIB)  # the provider's own

    devices = ET.SubElement(domain, "devices")
    devices.append(provider_domain_xml.disk_element(disk, "qcow2", "virtio", "vda", provider_domain_xml.BackingFile(base)))
    cdrom = ET.SubElement(devices, "disk", type="file", device="cdrom")
    ET.SubElement(cdrom, "driver", name="qemu", type="raw")
    ET.SubElement(cdrom, "source", file=seed)
    ET.SubElement(cdrom, "target", dev="hdc", bus="ide")
    ET.SubElement(cdrom, "readonly")
    interface = ET.SubElement(devices, "interface", type="network")
    ET.SubElement(interface, "source", network=network)
    ET.SubElement(interface, "model", type="virtio")
    serial = ET.SubElement(devices, "serial", type="file")
    ET.SubElement(serial, "source", path=str(serial_log))
    ET.SubElement(serial, "target", port="0")
    agent = ET.SubElement(devices, "channel", type="unix")
    ET.SubElement(agent, "target", type="virtio", name="org.qemu.guest_agent.0")
    rng = ET.SubElement(devices, "rng", model="virtio")
    ET.SubElement(rng, "backend", model="random").text = "/dev/urandom"
    ET.SubElement(devices, "memballoon", model="none")
    return ET.tostring(domain, encoding="unicode")


@pytest.fixture
def guest(libvirt_host: LibvirtHost, guest_image: GuestImage, base_image_volume: str) -> Iterator[Guest]:
    """A defined and started guest with an overlay disk and a seed volume; destroyed and deleted afterwards."""
    token = uuid.uuid4().hex[:12]
    name = f"smoke-{token}"
    serial_log = libvirt_host.qemu_log_dir / f"{name}.serial.log"
    with libvirt_host.connect() as conn:
        pool = conn.storagePoolLookupByName(libvirt_host.pool_name)
        base = pool.storageVolLookupByName(base_image_volume)
        overlay = pool.createXML(volume_xml(f"{name}.qcow2", OVERLAY_CAPACITY, "qcow2", backing=base), 0)
        iso = build_nocloud_iso(user_data(token, Guest.final_message_for(token)), meta_data(name))
        seed = pool.createXML(volume_xml(f"{name}-seed.iso", len(iso), "raw"), 0)
        upload(conn, seed, io.BytesIO(iso), len(iso))
        domain = conn.defineXML(
            domain_xml(name, guest_image, libvirt_host.boot_files(guest_image), overlay.path(), base.path(), seed.path(), libvirt_host.network_name, serial_log))
        try:
            domain.create()
            yield Guest(name=name, token=token, serial_log=serial_log, domain=domain)
        finally:
            if domain.isActive():
                domain.destroy()
            domain.undefine()
            overlay.delete(0)
            seed.delete(0)  # the serial log stays with the host's logs, for a post-mortem


def wait_for(what: str, probe: Callable[[], T | None], deadline_s: float, on_timeout: Callable[[], str]) -> T:
    """Poll `probe` until it returns something; fail naming `what` and showing on_timeout()'s clue after the deadline."""
    deadline = time.monotonic() + deadline_s
    while (result := probe()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {deadline_s:.0f} s\n{on_timeout()}", pytrace=False)
        time.sleep(1.0)
    return result


def serial_tail(path: pathlib.Path, lines: int = 40) -> str:
    if not path.exists():
        return f"(no serial log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def ipv4_addresses(domain: libvirt.virDomain, source: int) -> list[str] | None:
    """The domain's IPv4 addresses as `source` (DHCP leases or the guest agent) reports them; None while none."""
    try:
        interfaces = domain.interfaceAddresses(source, 0)
    except libvirt.libvirtError:  # the agent answers only once it runs in the guest
        return None
    addresses = [addr["addr"] for iface in interfaces.values() for addr in (iface.get("addrs") or [])
                 if addr["type"] == libvirt.VIR_IP_ADDR_TYPE_IPV4 and not addr["addr"].startswith("127.")]
    return addresses or None


# -- the test -----------------------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_guest_boots_runs_cloud_init_and_gets_a_lease(guest: Guest, libvirt_host: LibvirtHost) -> None:
    def serial_shows_final_message() -> str | None:
        text = guest.serial_log.read_text(errors="replace") if guest.serial_log.exists() else ""
        return text if guest.final_message in text else None

    console = wait_for("cloud-init final message on the serial console", serial_shows_final_message,
                       BOOT_DEADLINE_S, lambda: serial_tail(guest.serial_log))
    assert f"runcmd-says-{guest.token}" in console, "runcmd output missing from the serial console"
    assert "datasource=DataSourceNoCloud" in console, "cloud-init did not use the NoCloud seed"

    leased = wait_for("DHCP lease", lambda: ipv4_addresses(guest.domain, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE),
                      LEASE_DEADLINE_S, lambda: serial_tail(guest.serial_log))
    assert all(ipaddress.IPv4Address(addr) in libvirt_host.subnet for addr in leased), leased
    # The guest agent (started by udev when its virtio port appears) sees the same address from inside.
    seen = wait_for("address from the guest agent",
                    lambda: ipv4_addresses(guest.domain, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT),
                    LEASE_DEADLINE_S, lambda: serial_tail(guest.serial_log))
    assert set(leased) <= set(seen), (leased, seen)
    # Its AppArmor profile was made and compiled as Ubuntu's libvirtd would at its start, and QEMU's files were
    # recorded once it ran (devenv.apparmor_check; the conftest checks every domain's after each test): the overlay
    # read-write, the shared base read-only.
    record = libvirt_host.apparmor_records / guest.domain.UUIDString()
    assert (record / "profile.bin").stat().st_size > 0
    held = dict((path, access) for access, path in apparmor_check.held_files((record / "held").read_text()))
    overlay = ET.fromstring(guest.domain.XMLDesc(0)).find("devices/disk/source").get("file")
    base = ET.fromstring(guest.domain.XMLDesc(0)).find("devices/disk/backingStore/source").get("file")
    assert (held.get(overlay), held.get(base)) == ("rw", "r"), held
    # What the boot spent, from inside, for the timing report (out/timing/boot-minimal.txt).
    timing_report.record_boot_profile("minimal", guest_agent.boot_profile(libvirt_host, guest.domain.UUIDString()))
