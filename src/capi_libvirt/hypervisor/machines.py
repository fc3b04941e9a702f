"""What the provider does to a host for one machine: overlay, data disks, NoCloud ISO or Ignition config, domain,
addresses, serial log (made here, read by hypervisor.serial_log), teardown; and whether the host can run a named CPU
model.

Every function takes an open `virConnect` first and is run by LibvirtHost (hypervisor.host) through its
connection's thread pool (hypervisor.connection), which translates libvirt's errors. Each operation is idempotent: "create" of something present returns it,
"delete" of something absent is a no-op, so a retried or restarted reconcile converges instead of duplicating.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import time
import xml.etree.ElementTree as ET

import libvirt

from capi_libvirt.core import domain_owner, domain_xml, domain_xml_edits, machine_addresses, volume_xml
from capi_libvirt.hypervisor import errors

GIB = 1024**3
REFRESH_WAIT_S, REFRESH_RETRY_S = 10.0, 0.1  # how long a pool refresh waits out a volume being built
STREAM_CHUNK = 256 * 1024  # bytes a stream sends or receives at a time


@dataclasses.dataclass(frozen=True)
class MachineVolumes:
    """The names of a machine's volumes in its storage pool (deterministic, see core.naming)."""

    pool: str
    overlay: str
    nocloud: str
    serial_log: str
    ignition: str | None = None  # the Ignition config handed to the guest through fw_cfg
    data_disks: tuple[str, ...] = ()

    def all_names(self) -> list[str]:
        """Every volume the machine may have, in the order teardown deletes them."""
        return [self.overlay, *self.data_disks, self.nocloud, *([self.ignition] if self.ignition else []),
                self.serial_log]


@dataclasses.dataclass(frozen=True)
class DomainInfo:
    uuid: str
    name: str
    state: str
    xml: str
    pause_reason: str | None = None  # why a paused domain is paused (PAUSE_REASON_NAMES), None unless paused


STATE_NAMES = {
    libvirt.VIR_DOMAIN_NOSTATE: "nostate",
    libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "blocked",
    libvirt.VIR_DOMAIN_PAUSED: "paused",
    libvirt.VIR_DOMAIN_SHUTDOWN: "shutdown",
    libvirt.VIR_DOMAIN_SHUTOFF: "shutoff",
    libvirt.VIR_DOMAIN_CRASHED: "crashed",
    libvirt.VIR_DOMAIN_PMSUSPENDED: "pmsuspended",
}

# Why libvirt says a domain is paused, for the status and the events. A domain of ours paused for one of RESUMED_PAUSES
# was not paused by anyone's intent (a start that a libvirtd restart cut short, a watchdog, an I/O error since fixed or
# not): start_domain resumes it. (libvirt 9.0's headers, which libvirt-python is built against here, have no
# VIR_DOMAIN_PAUSED_API_ERROR: a reason this table does not know is reported by its number and left paused.) A user's pause (an admin's `virsh suspend`) and libvirt's own jobs (migration, save,
# dump, snapshot, shutdown) are left as they are.
PAUSE_REASON_NAMES = {
    libvirt.VIR_DOMAIN_PAUSED_UNKNOWN: "unknown",
    libvirt.VIR_DOMAIN_PAUSED_USER: "user",
    libvirt.VIR_DOMAIN_PAUSED_MIGRATION: "migration",
    libvirt.VIR_DOMAIN_PAUSED_SAVE: "save",
    libvirt.VIR_DOMAIN_PAUSED_DUMP: "dump",
    libvirt.VIR_DOMAIN_PAUSED_IOERROR: "I/O error",
    libvirt.VIR_DOMAIN_PAUSED_WATCHDOG: "watchdog",
    libvirt.VIR_DOMAIN_PAUSED_FROM_SNAPSHOT: "from snapshot",
    libvirt.VIR_DOMAIN_PAUSED_SHUTTING_DOWN: "shutting down",
    libvirt.VIR_DOMAIN_PAUSED_SNAPSHOT: "snapshot",
    libvirt.VIR_DOMAIN_PAUSED_CRASHED: "crashed",
    libvirt.VIR_DOMAIN_PAUSED_STARTING_UP: "starting up",
    libvirt.VIR_DOMAIN_PAUSED_POSTCOPY: "post-copy migration",
    libvirt.VIR_DOMAIN_PAUSED_POSTCOPY_FAILED: "failed post-copy migration",
}
RESUMED_PAUSES = frozenset({libvirt.VIR_DOMAIN_PAUSED_UNKNOWN, libvirt.VIR_DOMAIN_PAUSED_IOERROR,
                            libvirt.VIR_DOMAIN_PAUSED_WATCHDOG, libvirt.VIR_DOMAIN_PAUSED_CRASHED})


def _active_pool(conn: libvirt.virConnect, name: str) -> libvirt.virStoragePool:
    pool = conn.storagePoolLookupByName(name)
    if not pool.isActive():
        raise errors.PoolNotFound(f"storage pool {name} is not active")
    return pool


def _volume_or_none(pool: libvirt.virStoragePool, name: str) -> libvirt.virStorageVol | None:
    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as error:
        if errors.is_missing_volume(error):
            return None
        raise


def _refreshed_pool(conn: libvirt.virConnect, name: str) -> libvirt.virStoragePool:
    """The active pool, refreshed so files libvirt did not make (serial logs) are volumes of it.

    libvirt refuses a refresh while a volume of the pool is being built or cloned, or an upload or download into it
    is being set up ("has asynchronous jobs running", an internal error of the storage driver): the operator making
    another machine's overlay or NoCloud volume. That ends within moments, so it is waited out instead of failing.
    """
    pool = _active_pool(conn, name)
    deadline = time.monotonic() + REFRESH_WAIT_S
    while True:
        try:
            pool.refresh(0)
            return pool
        except libvirt.libvirtError as error:
            busy = errors.is_storage_busy(error)
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(REFRESH_RETRY_S)


def machine_types(conn: libvirt.virConnect, domain_type: str) -> frozenset[str]:
    """The machine types (and their aliases: q35, pc) the host's QEMU has for `domain_type` domains of the host's
    architecture (libvirt's capabilities; a domain type it cannot run has none)."""
    caps = ET.fromstring(conn.getCapabilities())
    arch = caps.findtext("host/cpu/arch")
    found: set[str] = set()
    for guest in caps.findall("guest"):
        element = guest.find(f"arch[@name='{arch}']")
        if guest.findtext("os_type") != "hvm" or element is None or \
                element.find(f"domain[@type='{domain_type}']") is None:
            continue
        for machine in [*element.findall("machine"), *element.findall(f"domain[@type='{domain_type}']/machine")]:
            found |= {name for name in (machine.text, machine.get("canonical")) if name}
    return frozenset(found)


def pool_path(conn: libvirt.virConnect, pool_name: str) -> str:
    """The target folder of a `dir` pool (where the serial log goes, so that teardown can delete it as a volume)."""
    pool = _active_pool(conn, pool_name)
    path = ET.fromstring(pool.XMLDesc()).findtext("./target/path")
    return path or ""


@dataclasses.dataclass(frozen=True)
class Overlay:
    """The machine's root disk: its path, and its base as the domain XML names it (None: libvirt finds the chain)."""

    path: str
    backing: domain_xml.BackingFile | None


def ensure_overlay(conn: libvirt.virConnect, volumes: MachineVolumes, base_pool: str, base_volume: str,
                   disk_gib: int) -> Overlay:
    """The machine's qcow2 overlay on the base image, grown to the requested size (an existing one is kept, on the
    base it was made on)."""
    pool = _active_pool(conn, volumes.pool)
    existing = _volume_or_none(pool, volumes.overlay)
    if existing is not None:
        backing_path = ET.fromstring(existing.XMLDesc(0)).findtext("./backingStore/path")
        base = conn.storageVolLookupByPath(backing_path) if backing_path else None
        return Overlay(_path(existing), _backing_file(base))
    base = _active_pool(conn, base_pool).storageVolLookupByName(base_volume)
    base_capacity = base.info()[1]
    capacity = max(disk_gib * GIB, base_capacity)
    xml = volume_xml.overlay_volume_xml(volumes.overlay, capacity, base.path(),
                                        volume_xml.backing_format_of(base.XMLDesc(0)))
    return Overlay(_path(pool.createXML(xml, 0)), _backing_file(base))


def _backing_file(base: libvirt.virStorageVol | None) -> domain_xml.BackingFile | None:
    """The base as the domain's disk names it, when it can be shared as it is (core.volume_xml.shareable_base)."""
    if base is None:
        return None
    xml = base.XMLDesc(0)
    if not volume_xml.shareable_base(xml):
        return None
    return domain_xml.BackingFile(_path(base), volume_xml.backing_format_of(xml))


def ensure_data_disks(conn: libvirt.virConnect, volumes: MachineVolumes, sizes_gib: list[int]) -> list[str]:
    """The machine's empty qcow2 data disks, one per size, in its pool; an existing one is kept. Returns their paths."""
    if len(sizes_gib) != len(volumes.data_disks):
        raise ValueError(f"{len(sizes_gib)} data disk sizes for {len(volumes.data_disks)} volume names")
    pool = _active_pool(conn, volumes.pool)
    paths = []
    for name, size in zip(volumes.data_disks, sizes_gib, strict=True):
        existing = _volume_or_none(pool, name)
        volume = existing if existing is not None else pool.createXML(volume_xml.data_volume_xml(name, size * GIB), 0)
        paths.append(_path(volume))
    return paths


def replace_nocloud(conn: libvirt.virConnect, volumes: MachineVolumes, iso: bytes) -> str:
    """Upload the NoCloud ISO through libvirt's stream API (works on a remote host too); returns its path."""
    return upload_volume(conn, volumes.pool, volumes.nocloud, iso)


def replace_ignition(conn: libvirt.virConnect, volumes: MachineVolumes, config: bytes) -> str:
    """Upload the Ignition config (the bootstrap data as it is) the guest reads through fw_cfg; returns its path."""
    if not volumes.ignition:
        raise ValueError("no Ignition volume name")
    return upload_volume(conn, volumes.pool, volumes.ignition, config)


def upload_volume(conn: libvirt.virConnect, pool_name: str, name: str, data: bytes) -> str:
    """`data` as raw volume `name` of the pool, through libvirt's stream API; returns its path.

    An earlier upload may have been cut short, so an existing volume is replaced rather than trusted.
    """
    pool = _active_pool(conn, pool_name)
    existing = _volume_or_none(pool, name)
    if existing is not None:
        existing.delete(0)
    volume = pool.createXML(volume_xml.raw_volume_xml(name, len(data)), 0)
    stream = conn.newStream(0)
    try:
        volume.upload(stream, 0, len(data), 0)
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            sent = stream.send(bytes(view[offset:offset + STREAM_CHUNK]))
            if sent < 0:
                raise errors.HypervisorError("upload stream refused data")
            offset += sent
        stream.finish()
    except BaseException:
        abort_quietly(stream)
        volume.delete(0)
        raise
    return _path(volume)


def ensure_serial_log(conn: libvirt.virConnect, volumes: MachineVolumes) -> str:
    """The (empty) file the domain's serial console is logged to, made as a volume of the pool before the domain
    starts: libvirt then knows it, and teardown deletes it without a pool refresh (which reads every volume's header
    under the pool's lock: slow with many machines, and refused while another volume is being built)."""
    pool = _active_pool(conn, volumes.pool)
    existing = _volume_or_none(pool, volumes.serial_log)
    if existing is not None:
        return _path(existing)
    return _path(pool.createXML(volume_xml.raw_volume_xml(volumes.serial_log, 0), 0))


def _path(volume: libvirt.virStorageVol) -> str:
    """The volume's path (libvirt-python is untyped: this names what it returns)."""
    path: str = volume.path()
    return path


def abort_quietly(stream: libvirt.virStream) -> None:
    """End a stream that failed midway; an abort that fails too adds nothing to the error being raised."""
    try:
        stream.abort()
    except libvirt.libvirtError:
        pass


@dataclasses.dataclass(frozen=True)
class CPUModels:
    """What the host says of a CPU model for a domain type and machine type: usable or not, and the usable ones."""

    known: bool  # listed at all
    usable: bool
    usable_models: tuple[str, ...]


def cpu_models(conn: libvirt.virConnect, model: str, domain_type: str, machine_type: str) -> CPUModels:
    """Whether the host can run CPU model `model` for such domains (libvirt's domain capabilities: the custom mode's
    models, each usable or not on this host and hypervisor)."""
    caps = ET.fromstring(conn.getDomainCapabilities(None, None, machine_type, domain_type, 0))  # the host's arch
    listed = {element.text: element.get("usable") for element in caps.findall("cpu/mode[@name='custom']/model")}
    usable = tuple(sorted(name for name, state in listed.items() if name and state == "yes"))
    return CPUModels(known=model in listed, usable=listed.get(model) == "yes", usable_models=usable)


def domain_info(conn: libvirt.virConnect, uuid: str) -> DomainInfo | None:
    try:
        domain = conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as error:
        if errors.is_missing_domain(error):
            return None
        raise
    code, reason = domain.state()
    paused = code == libvirt.VIR_DOMAIN_PAUSED
    return DomainInfo(uuid=uuid, name=domain.name(), state=STATE_NAMES.get(code, "unknown"), xml=domain.XMLDesc(0),
                      pause_reason=PAUSE_REASON_NAMES.get(reason, str(reason)) if paused else None)


def define_domain(conn: libvirt.virConnect, uuid: str, xml: str) -> DomainInfo:
    """Define the domain unless a domain with this UUID already exists (the UUID is fixed before anything is made)."""
    info = domain_info(conn, uuid)
    if info is not None:
        return info
    conn.defineXML(xml)
    info = domain_info(conn, uuid)
    assert info is not None
    return info


def start_domain(conn: libvirt.virConnect, uuid: str) -> bool:
    """Start the domain if it is not running, or resume it if it is paused for one of RESUMED_PAUSES; True when it
    was resumed (the chaos test found domains left paused, reason unknown, after libvirtd was killed mid-start)."""
    domain = conn.lookupByUUIDString(uuid)
    code, reason = domain.state()
    if code == libvirt.VIR_DOMAIN_PAUSED and reason in RESUMED_PAUSES:
        domain.resume()
        return True
    if not domain.isActive():
        domain.create()
    return False


SOURCE_CODES = {machine_addresses.LEASE: libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
                machine_addresses.AGENT: libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
                machine_addresses.ARP: libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP}


def address_sources(xml: str) -> list[str]:
    """The address sources that can answer for this domain (core.machine_addresses' names), in the order they are asked, so no
    call is made that can only fail (each failing call is a warning in libvirtd's log): DHCP leases when an interface
    is on a libvirt network (libvirt's dnsmasq gave them), the guest agent while its channel is connected, the host's
    ARP table when an interface is on a bridge (the LAN's DHCP server, or a static address, left libvirt no lease; it
    is asked after the agent too, which may be connected and still not answer: a guest-side allow-list, a hung agent)."""
    devices = ET.fromstring(xml).find("devices")
    interfaces = devices.findall("interface") if devices is not None else []
    agent = devices is not None and any(
        target.get("name") == domain_xml.GUEST_AGENT_CHANNEL and target.get("state") == "connected"
        for target in devices.findall("channel/target"))
    sources = []
    if any(nic.get("type") == "network" for nic in interfaces):
        sources.append(machine_addresses.LEASE)
    if agent:
        sources.append(machine_addresses.AGENT)
    if any(nic.get("type") == "bridge" for nic in interfaces):
        sources.append(machine_addresses.ARP)
    return sources


@dataclasses.dataclass(frozen=True)
class Discovery:
    """What one look for a domain's addresses found: the addresses, the source that gave them (None: none did), and
    every source asked, in order."""

    addresses: list[str]
    source: str | None
    asked: list[str]


def domain_addresses(conn: libvirt.virConnect, uuid: str) -> Discovery:
    """IPv4/IPv6 addresses of the domain from the first source that has any (see address_sources); link-local and
    loopback left out."""
    domain = conn.lookupByUUIDString(uuid)
    asked = []
    for source in address_sources(domain.XMLDesc(0)):
        asked.append(source)
        try:
            interfaces = domain.interfaceAddresses(SOURCE_CODES[source], 0) or {}
        except libvirt.libvirtError:
            continue  # that source is not available after all (the agent went away): try the next
        found = []
        for name, interface in sorted(interfaces.items()):
            if name == "lo":
                continue
            for entry in interface.get("addrs") or []:
                address = ipaddress.ip_address(entry["addr"])
                if not (address.is_loopback or address.is_link_local):
                    found.append(str(address))
        if found:
            return Discovery(found, source, asked)
    return Discovery([], None, asked)


def eject_nocloud(conn: libvirt.virConnect, uuid: str, iso_volume: str) -> list[str]:
    """Empty the domain's CD-ROM drive that holds the NoCloud ISO (the file named `iso_volume`); returns where it
    was ejected ("live", "persistent"), nothing when it was not in.

    virDomainUpdateDeviceFlags with the CD-ROM's own <disk> minus its source: a media change, so no reboot and no
    hot-unplug, on the running domain (forced) and its persistent definition alike, each only where the ISO is still
    in.
    """
    domain = conn.lookupByUUIDString(uuid)  # VIR_ERR_NO_DOMAIN -> DomainNotFound
    live = domain_xml_edits.ejected_cdrom_xml(domain.XMLDesc(0), iso_volume) if domain.isActive() else None
    config = domain_xml_edits.ejected_cdrom_xml(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE), iso_volume)
    if live is None and config is None:
        return []
    # FORCE on the running domain: QEMU opens the tray even if the guest locked it (Linux locks it while the drive is
    # open), and libvirt does not wait for the guest to answer the eject request, which a busy TCG guest did not
    # within libvirt's 5 s ("timed out waiting to open tray"). The guest has used the seed: the node joined.
    flags = (libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_DEVICE_MODIFY_FORCE if live is not None else 0) | \
        (libvirt.VIR_DOMAIN_AFFECT_CONFIG if config is not None else 0)
    domain.updateDeviceFlags(config if config is not None else live, flags)
    return [where for where, xml in (("live", live), ("persistent", config)) if xml is not None]


def delete_nocloud(conn: libvirt.virConnect, volumes: MachineVolumes) -> bool:
    """Delete the NoCloud ISO volume (after eject_nocloud: a domain never points at a missing file); True when it was
    there."""
    volume = _volume_or_none(_active_pool(conn, volumes.pool), volumes.nocloud)
    if volume is None:
        return False
    volume.delete(0)
    return True


def drop_ignition(conn: libvirt.virConnect, uuid: str, volumes: MachineVolumes) -> list[str]:
    """Take the Ignition config out of the domain's persistent definition (its fw_cfg entry: QEMU read the file when
    it started, and a fw_cfg entry cannot change under a running domain, so the next start comes without it) and
    remove the config from the host; returns what was done ("definition", then "volume" when its volume was deleted
    or "emptied" when it was overwritten with zeros: again on each call while the domain runs, which is harmless),
    nothing when the definition and volume were done before.

    While the domain runs its volume is emptied, not deleted: on a host with dynamic ownership libvirt gives the files
    a guest used back to their owners when it stops, and a file deleted under it ends that early, leaving the
    domain's other files (its NVRAM, a kernel) with the QEMU user. The emptied volume goes with the machine.
    """
    if not volumes.ignition:
        raise ValueError("no Ignition volume name")
    domain = conn.lookupByUUIDString(uuid)  # VIR_ERR_NO_DOMAIN -> DomainNotFound
    done = []
    redefined = domain_xml_edits.without_fw_cfg_file_xml(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
                                                   volumes.ignition)
    if redefined is not None:
        conn.defineXML(redefined)
        done.append("definition")
    volume = _volume_or_none(_active_pool(conn, volumes.pool), volumes.ignition)
    if volume is not None and domain.isActive():
        volume.wipePattern(libvirt.VIR_STORAGE_VOL_WIPE_ALG_ZERO, 0)
        done.append("emptied")
    elif volume is not None:
        volume.delete(0)
        done.append("volume")
    return done


def destroy_and_undefine(domain: libvirt.virDomain) -> None:
    """Stop the domain if it runs, then remove its definition with its managed save, snapshot metadata and NVRAM."""
    if domain.isActive():
        try:
            domain.destroy()
        except libvirt.libvirtError as error:
            if not errors.is_operation_invalid(error):  # it stopped meanwhile
                raise
    domain.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                         | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)


def delete_machine(conn: libvirt.virConnect, uuid: str, machine_uid: str, volumes: MachineVolumes,
                   namespace: str | None = None, name: str | None = None) -> list[str]:
    """Destroy and undefine the domain (its UEFI variable store with it), delete the overlay, data disks, ISO or
    Ignition config and serial log; absent parts count as done.

    The domain is only touched when its `<metadata>` names this machine as its owner: the identity UID and, when given,
    the namespace and name (an identity annotation copied onto another object never reaches this domain). Returns what
    was removed.
    """
    removed: list[str] = []
    try:
        domain = conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as error:
        if not errors.is_missing_domain(error):
            raise
        domain = None
    if domain is not None:
        owner = domain_owner.parse_owner(domain.XMLDesc(0))
        if owner is None or owner.uid != machine_uid or (namespace is not None and owner.namespace != namespace) or \
                (name is not None and owner.name != name):
            raise errors.HypervisorError(f"domain {uuid} is not owned by machine {machine_uid}; left alone")
        destroy_and_undefine(domain)
        removed.append(f"domain {uuid}")
    try:
        pool = conn.storagePoolLookupByName(volumes.pool)
    except libvirt.libvirtError as error:
        if errors.is_missing_pool(error):
            return removed  # no pool, so nothing of ours can be in it
        raise
    if not pool.isActive():
        pool.create(0)  # an inactive pool would hide our volumes: activate it to delete them
    for name in volumes.all_names():
        volume = _volume_or_none(pool, name)
        if volume is None and name == volumes.serial_log:
            # Made by QEMU, not as a volume (a machine of an earlier release): the pool sees it after a refresh.
            volume = _volume_or_none(_refreshed_pool(conn, volumes.pool), name)
        if volume is not None:
            volume.delete(0)
            removed.append(f"volume {name}")
    return removed


# For the image import (hypervisor.images), which works in the same pools.
active_pool, volume_or_none, refreshed_pool = _active_pool, _volume_or_none, _refreshed_pool
