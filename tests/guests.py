"""What the e2e tests share about guests: the spec of a small TCG guest from the cached image, what of the
provider's machines is still on a libvirt host, and a host's state as tests compare it (host_state, owner_of).
Commands run inside a guest through its QEMU guest agent are in guest_agent.py."""

from __future__ import annotations

import pathlib
import time

import libvirt

from capi_libvirt.core import domain_owner
from devenv import base_image

REFRESH_ATTEMPTS = 50


def machine_spec(libvirt_host, guest_image, base_image_volume) -> dict:
    """A LibvirtMachine spec that boots the cached guest image as the provider's default domain (a q35 `kvm` domain,
    its NoCloud CD-ROM on virtio-scsi; the test host's QEMU wrapper runs it under TCG, as there is no hardware
    virtualization here: devenv/kvm_as_tcg.py), with a direct kernel boot (its kernel and initrd where the host's QEMU
    user reads them): 1 CPU, 256 MiB."""
    kernel, initrd = libvirt_host.boot_files(guest_image)
    return {
        "image": {"volume": base_image_volume},
        "storagePool": libvirt_host.pool_name,
        "cpus": 1,
        "memoryMiB": 256,
        "diskGiB": 2,
        "interfaces": [{"network": libvirt_host.network_name}],
        "kernelBoot": {"kernel": kernel, "initrd": initrd,
                       "cmdline": "root=/dev/vda rw console=ttyS0"},
    }


def host_access(spec: dict) -> dict:
    """A LibvirtHost's spec.access that allows exactly what `spec` (a machine_spec, or devenv.ipxe_image's) uses: its
    base image, networks, bridges and the folders of its kernel and initrd if it boots one (tenants may use nothing of
    a host that is not listed)."""
    boot = spec.get("kernelBoot") or {}
    folders = {str(pathlib.PurePosixPath(boot[key]).parent) + "/" for key in ("kernel", "initrd") if key in boot}
    return {"images": [spec["image"]["volume"]],
            "networks": [nic["network"] for nic in spec["interfaces"] if nic.get("network")],
            "bridges": [nic["bridge"] for nic in spec["interfaces"] if nic.get("bridge")],
            "hostPaths": sorted(folders)}


def host_objects(host, uuid_: str, names: list[str]) -> list[str]:
    """What of one machine is still on the host: its domain and any of the named volumes."""
    left = []
    with host.connect() as conn:
        try:
            conn.lookupByUUIDString(uuid_)
            left.append(f"domain {uuid_}")
        except libvirt.libvirtError:
            pass
        pool = refreshed_pool(conn, host.pool_name)
        left += [f"volume {v}" for v in pool.listVolumes() if v in names]
    return left


def read_volume(conn: libvirt.virConnect, volume: libvirt.virStorageVol) -> bytes:
    """Every byte of a volume, downloaded through libvirt."""
    stream = conn.newStream(0)
    volume.download(stream, 0, 0, 0)
    chunks = []
    while chunk := stream.recv(256 * 1024):
        chunks.append(chunk)
    stream.finish()
    return b"".join(chunks)


def provider_objects(host, base_volume: str) -> list[str]:
    """Every domain and every file of the pool but the base images (the one given, and those of other images the
    session uploaded): what machines leave behind (overlays, NoCloud ISOs, serial logs)."""
    with host.connect() as conn:
        domains = [f"domain {d.name()}" for d in conn.listAllDomains()]
        pool = refreshed_pool(conn, host.pool_name)
        return domains + [f"volume {v}" for v in pool.listVolumes()
                          if v != base_volume and not base_image.is_base_volume(v)]


def refreshed_pool(conn: libvirt.virConnect, name: str) -> libvirt.virStoragePool:
    """The pool, refreshed so files libvirt did not make (serial logs) are listed. libvirt refuses a refresh while a
    volume upload of the operator runs ("has asynchronous jobs running"): wait for it."""
    pool = conn.storagePoolLookupByName(name)
    for attempt in range(REFRESH_ATTEMPTS):
        try:
            pool.refresh(0)
            return pool
        except libvirt.libvirtError as error:
            if "asynchronous jobs" not in str(error) or attempt == REFRESH_ATTEMPTS - 1:
                raise
            time.sleep(0.1)
    return pool


def host_state(host) -> dict:
    """{"domains": {UUID: (name, libvirt ID, state)} of the provider's domains, "volumes": the pool's volumes but base
    images}: a domain restarted gets another ID, a redefined one another UUID or name."""
    with host.connect() as conn:
        domains = {d.UUIDString(): (d.name(), d.ID(), d.state()[0]) for d in conn.listAllDomains()
                   if domain_owner.parse_owner(d.XMLDesc(0)) is not None}
        volumes = sorted(v for v in refreshed_pool(conn, host.pool_name).listVolumes()
                         if not base_image.is_base_volume(v))
    return {"domains": domains, "volumes": volumes}


def owner_of(host, uuid_: str) -> domain_owner.Owner | None:
    """The provider's owner metadata of the domain `uuid_` (namespace, name, UID, management cluster)."""
    with host.connect() as conn:
        return domain_owner.parse_owner(conn.lookupByUUIDString(uuid_).XMLDesc(0))

