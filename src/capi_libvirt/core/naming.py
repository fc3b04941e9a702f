"""Deterministic identity of a machine's libvirt objects: domain UUID and name, volume names, MAC addresses, hostname.

Everything is derived from the LibvirtMachine's identity (plus its namespace and name for a readable prefix): the
Kubernetes UID it had when it was placed, kept in the IDENTITY_ANNOTATION so that a copy (clusterctl move gives every
copy a new UID) still names the same domain; see `identity_uid`. So a retried or restarted reconcile finds the objects it made before instead of creating a second domain, and two
machines of different clusters or namespaces sharing one host never collide. Names contain only [a-z0-9-] (plus '.'
in volume names), so they are safe as libvirt names, as file names in a directory pool and on a command line.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid
from typing import Any

from capi_libvirt.core import provider_id

# Fixed forever: changing it would give every existing machine a new domain UUID, i.e. a second domain.
# (It is uuid5(NAMESPACE_URL, "https://capi-libvirt.x-k8s.io/domain"), written out so no refactoring can move it.)
PROJECT_NAMESPACE = uuid.UUID("5d64ece4-dc73-59e8-9624-de2ce4c5a35e")

PREFIX = "capi"
DOMAIN_NAME_MAX = 63  # conservative: fits a DNS label, an interface alias, a cgroup/scope name and a file name
HASH_LENGTH = 8  # 32 bits of the UID: the prefix is for humans, this part keeps names apart
HOSTNAME_MAX = 63  # RFC 1123 label
VOLUME_NAME_MAX = 255  # bytes, the usual file name limit (NAME_MAX)
QEMU_OUI = (0x52, 0x54, 0x00)  # QEMU's prefix; 0x52 has the locally-administered bit set and the multicast bit clear
OVERLAY_SUFFIX = ".qcow2"
NOCLOUD_SUFFIX = "-cidata.iso"
SERIAL_LOG_SUFFIX = ".serial.log"
IGNITION_SUFFIX = ".ign"
DATA_DISK_INFIX = "-data-"  # <domain>-data-<index>.qcow2

_NOT_LABEL_CHAR = re.compile(r"[^a-z0-9]+")

# The UID the machine had when it was placed, written by the placement patch beside spec.providerID. Outside kopf's
# `capi-libvirt.x-k8s.io/` prefix on purpose: kopf leaves its own annotations out of its diff base.
IDENTITY_ANNOTATION = "infrastructure.cluster.x-k8s.io/libvirt-machine-uid"


def identity_uid(body: dict[str, Any]) -> str:
    """The UID every name, the domain UUID and the MACs of the machine derive from.

    The IDENTITY_ANNOTATION when spec.providerID names the domain UUID derived from it (a moved copy: new UID, same
    machine), else metadata.uid. An annotation the providerID does not vouch for (copied onto an object that was never
    placed, or edited) is ignored, so a clone of a manifest never takes over another machine's names.
    """
    metadata = body.get("metadata") or {}
    annotated = (metadata.get("annotations") or {}).get(IDENTITY_ANNOTATION)
    recorded = (body.get("spec") or {}).get("providerID")
    if annotated and annotated.strip() and recorded:
        try:
            if provider_id.parse_provider_id(recorded).domain_uuid == domain_uuid(annotated):
                return str(annotated)
        except ValueError:
            pass
    return metadata.get("uid") or ""


def domain_uuid(machine_uid: str) -> str:
    """The libvirt domain UUID of the machine: uuid5 of its Kubernetes UID, the same on every retry and restart."""
    return str(uuid.uuid5(PROJECT_NAMESPACE, _checked_uid(machine_uid)))


def domain_name(namespace: str, name: str, machine_uid: str) -> str:
    """`capi-<namespace>-<name>-<hash8>`, the readable parts sanitised and shortened to keep it within 63 characters."""
    suffix = uid_hash(machine_uid)
    budget = DOMAIN_NAME_MAX - len(PREFIX) - len(suffix) - 2  # the two dashes around the readable part
    readable = _fit_pair(sanitize_label(namespace), sanitize_label(name), budget)
    return "-".join(part for part in (PREFIX, readable, suffix) if part)


def overlay_volume_name(namespace: str, name: str, machine_uid: str) -> str:
    """Name of the machine's copy-on-write root disk volume: `<domain>.qcow2`."""
    return domain_name(namespace, name, machine_uid) + OVERLAY_SUFFIX


def nocloud_volume_name(namespace: str, name: str, machine_uid: str) -> str:
    """Name of the machine's NoCloud seed volume: `<domain>-cidata.iso`."""
    return domain_name(namespace, name, machine_uid) + NOCLOUD_SUFFIX


def serial_log_file_name(namespace: str, name: str, machine_uid: str) -> str:
    """File name (no directory) of the machine's serial console log: `<domain>.serial.log`."""
    return domain_name(namespace, name, machine_uid) + SERIAL_LOG_SUFFIX


def ignition_volume_name(namespace: str, name: str, machine_uid: str) -> str:
    """Name of the machine's Ignition config volume, which QEMU hands the guest through fw_cfg: `<domain>.ign`."""
    return domain_name(namespace, name, machine_uid) + IGNITION_SUFFIX


def data_disk_volume_name(namespace: str, name: str, machine_uid: str, index: int) -> str:
    """Name of the machine's `index`-th (0-based) data disk volume: `<domain>-data-<index>.qcow2`."""
    if index < 0:
        raise ValueError(f"data disk index must be >= 0, not {index}")
    return f"{domain_name(namespace, name, machine_uid)}{DATA_DISK_INFIX}{index}{OVERLAY_SUFFIX}"


def mac_address(machine_uid: str, index: int) -> str:
    """The MAC of interface `index` (0-based): 52:54:00 plus 24 bits of a hash of UID and index, stable across retries.

    24 random-looking bits are what libvirt itself uses for generated MACs; the chance that two of a few hundred guests
    on one segment collide is well under one in a thousand, and a fixed `macAddress` in the spec overrides it.
    """
    if index < 0:
        raise ValueError(f"interface index must be >= 0, not {index}")
    digest = hashlib.sha256(f"{_checked_uid(machine_uid)}/nic/{index}".encode()).digest()
    return ":".join(f"{octet:02x}" for octet in (*QEMU_OUI, *digest[:3]))


def hostname(name: str) -> str:
    """A valid RFC 1123 label from the machine name; when it must be shortened, a hash of the full name keeps it unique.

    Cut names end with a hash so that two long names sharing their first 54 characters still get different hostnames
    (the hostname becomes the Node name, and two Nodes with one name would fight).
    """
    label = sanitize_label(name)
    if label and label == name and len(label) <= HOSTNAME_MAX:
        return label
    # Lossy: the hash of the original name tells apart names that sanitise or shorten to the same text.
    suffix = _short_hash(name)
    head = _trim(label, HOSTNAME_MAX - len(suffix) - 1)
    return f"{head}-{suffix}" if head else f"machine-{suffix}"


def uid_hash(machine_uid: str) -> str:
    """The short hash of the UID that makes names unique: 8 hex characters."""
    return _short_hash(_checked_uid(machine_uid))


def sanitize_label(text: str) -> str:
    """Lowercase [a-z0-9-] only: accents folded to ASCII, every other run of characters one dash, no edge dashes."""
    decomposed = unicodedata.normalize("NFKD", text)
    ascii_only = "".join(char for char in decomposed if not unicodedata.combining(char)).lower()
    return _NOT_LABEL_CHAR.sub("-", ascii_only).strip("-")


def _checked_uid(machine_uid: str) -> str:
    # An empty UID would give every machine the same domain: refuse it rather than collide.
    if not machine_uid or not machine_uid.strip():
        raise ValueError("machine UID must not be empty")
    return machine_uid


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_LENGTH]


def _trim(label: str, limit: int) -> str:
    """At most `limit` characters, never ending on a dash."""
    return label[: max(limit, 0)].rstrip("-")


def _fit_pair(first: str, second: str, budget: int) -> str:
    """`first-second` (or the one that is non-empty) within `budget` characters, shortening the longer part first."""
    if not first or not second:
        return _trim(first or second, budget)
    room = budget - 1  # the dash between them
    if len(first) + len(second) > room:
        # Each gets half; a part shorter than its half leaves the rest to the other.
        half = room // 2
        if len(first) <= half:
            second = _trim(second, room - len(first))
        elif len(second) <= half:
            first = _trim(first, room - len(second))
        else:
            first, second = _trim(first, half), _trim(second, room - half)
    return "-".join(part for part in (first, second) if part)
