"""What the provider reads and changes in a domain's XML as libvirt returns it: the host files it uses, its CD-ROMs
and fw_cfg entries, and the device XML that ejects the NoCloud ISO or drops the Ignition file (core.seed_removal)."""

from __future__ import annotations

import copy
import posixpath
import xml.etree.ElementTree as ET


def disk_paths(xml_text: str) -> frozenset[str]:
    """Every host file the domain uses: disk and CD-ROM sources, serial/console log files, and fw_cfg files."""
    root = ET.fromstring(xml_text)
    paths = {source.get("file") for source in root.findall("devices/disk/source")}
    paths |= {entry.get("file") for entry in root.findall("sysinfo[@type='fwcfg']/entry")}
    paths |= {source.get("path") for kind in ("serial", "console") for source in root.findall(f"devices/{kind}/source")}
    paths |= {log.get("file") for kind in ("serial", "console") for log in root.findall(f"devices/{kind}/log")}
    return frozenset(path for path in paths if path)


def ejected_cdrom_xml(xml_text: str, volume_name: str) -> str | None:
    """The device XML that empties the CD-ROM whose source is the volume `volume_name` (a file of that name, in any
    folder), for virDomainUpdateDeviceFlags: the domain's own <disk> element without its <source> (so the target,
    bus, driver and address stay, and libvirt knows which device is meant). None when no CD-ROM holds that file:
    already ejected, or never there."""
    root = ET.fromstring(xml_text)
    for disk in root.findall("devices/disk[@device='cdrom']"):
        source = disk.find("source")
        if source is None or posixpath.basename(source.get("file") or "") != volume_name:
            continue
        ejected = copy.deepcopy(disk)
        for child in list(ejected):
            # The source and what only a running domain's XML carries about it (libvirt rejects or ignores it).
            if child.tag in ("source", "backingStore", "alias"):
                ejected.remove(child)
        return ET.tostring(ejected, encoding="unicode")
    return None


def fw_cfg_files(xml_text: str) -> list[str]:
    """The files the domain's fw_cfg entries hand to the guest (an Ignition config)."""
    return [entry.get("file") or "" for entry in ET.fromstring(xml_text).findall("sysinfo[@type='fwcfg']/entry")]


def without_fw_cfg_file_xml(xml_text: str, volume_name: str) -> str | None:
    """The domain XML without the fw_cfg entry whose file is the volume `volume_name` (a file of that name, in any
    folder), and without its <sysinfo type='fwcfg'> when nothing else is left in it; None when no entry names it."""
    root = ET.fromstring(xml_text)
    found = False
    for sysinfo in root.findall("sysinfo[@type='fwcfg']"):
        for entry in sysinfo.findall("entry"):
            if posixpath.basename(entry.get("file") or "") == volume_name:
                sysinfo.remove(entry)
                found = True
        if not list(sysinfo):
            root.remove(sysinfo)
    return ET.tostring(root, encoding="unicode") if found else None


def cdrom_sources(xml_text: str) -> list[str]:
    """The files in the domain's CD-ROM drives (an empty drive has none: no <source>, or, on a running domain after a
    forced eject, a <source> with no file)."""
    root = ET.fromstring(xml_text)
    files = (source.get("file") for source in root.findall("devices/disk[@device='cdrom']/source"))
    return [file for file in files if file]
