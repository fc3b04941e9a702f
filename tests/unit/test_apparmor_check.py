"""The AppArmor check of the test hosts (devenv.apparmor_check): reading virt-aa-helper's rules, AppArmor's globbing,
and the findings for a recorded domain whose profile misses a file, denies a write or lets it all through."""

from __future__ import annotations

import os
import pathlib
import xml.etree.ElementTree as ET

import pytest

from devenv import apparmor_check

pytestmark = pytest.mark.unit

# virt-aa-helper's file rules (libvirt 9, dry run) for a disk on a shared base, a CD-ROM, a serial log and a kernel.
RULES = """\
  "/var/log/libvirt/**/m1.log" w,
  "/run/libvirt/**/m1.pid" rwk,
  "/pool/m1.qcow2" rwk,
  "/pool/base.qcow2" rk,
  # don't audit writes to readonly files
  deny "/pool/base.qcow2" w,
  "/pool/m1-cidata.iso" rk,
  # don't audit writes to readonly files
  deny "/pool/m1-cidata.iso" w,
  "/pool/m1.serial.log" rw,
  "/boot/vmlinuz" r,
"""

DOMAIN = """\
<domain type='qemu'><name>m1</name><uuid>5d64ece4-dc73-59e8-9624-de2ce4c5a35e</uuid>
  <os><type>hvm</type><kernel>/boot/vmlinuz</kernel></os>
  <devices>
    <disk type='file' device='disk'><source file='/pool/m1.qcow2'/>
      <backingStore type='file'><format type='qcow2'/><source file='/pool/base.qcow2'/><backingStore/></backingStore>
      <target dev='vda'/></disk>
    <disk type='file' device='cdrom'><source file='/pool/m1-cidata.iso'/><readonly/><target dev='sda'/></disk>
    <serial type='file'><source path='/pool/m1.serial.log'/></serial>
  </devices>
</domain>
"""


def test_rules_are_read_with_their_denials_and_comments_left_out() -> None:
    rules = apparmor_check.parse_rules(RULES)
    assert len(rules) == 9
    assert apparmor_check.Rule("/pool/base.qcow2", "w", deny=True) in rules


@pytest.mark.parametrize("glob, path, matches", [
    ("/var/log/libvirt/**/m1.log", "/var/log/libvirt/qemu/m1.log", True),
    ("/var/log/libvirt/**/m1.log", "/var/log/libvirt/a/b/m1.log", True),
    ("/pool/*.qcow2", "/pool/m1.qcow2", True),
    ("/pool/*.qcow2", "/pool/sub/m1.qcow2", False),
    ("/pool/m?.qcow2", "/pool/m1.qcow2", True),
    ("/dev/{kvm,vhost-net}", "/dev/kvm", True),
    ("/dev/{kvm,vhost-net}", "/dev/tun", False),
    ("/pool/m[0-9].iso", "/pool/m7.iso", True),
    ("/etc/{,*.conf}", "/etc/a.conf", True),
    ("/etc/{,*.conf}", "/etc/", True),
    ("/pool/[unclosed", "/pool/[unclosed", True),
    ("/pool/m1.qcow2", "/pool/m1Xqcow2", False),
])
def test_apparmor_globbing(glob: str, path: str, matches: bool) -> None:
    assert apparmor_check.Rule(glob, "r").matches(path) is matches


def test_access_is_allowed_per_permission_and_a_denial_wins() -> None:
    rules = apparmor_check.parse_rules(RULES)
    assert apparmor_check.allows(rules, "/pool/m1.qcow2", "rw")
    assert apparmor_check.allows(rules, "/pool/base.qcow2", "r")
    assert not apparmor_check.allows(rules, "/pool/base.qcow2", "rw"), "the shared base is never written"
    assert apparmor_check.allows(rules, "/var/log/libvirt/qemu/m1.log", "w")
    assert not apparmor_check.allows(rules, "/pool/other.qcow2", "r")


def test_the_files_a_domain_names_with_the_access_qemu_needs() -> None:
    assert apparmor_check.named_files(ET.fromstring(DOMAIN)) == {
        "/pool/m1.qcow2": "rw", "/pool/base.qcow2": "r", "/pool/m1-cidata.iso": "r", "/pool/m1.serial.log": "w",
        "/boot/vmlinuz": "r"}


def record(tmp_path: pathlib.Path, rules: str, held: str, domain: str = DOMAIN) -> pathlib.Path:
    folder = tmp_path / "records" / "5d64ece4-dc73-59e8-9624-de2ce4c5a35e"
    (folder / "libvirt").mkdir(parents=True)
    (folder / "domain.xml").write_text(domain)
    (folder / "libvirt" / "libvirt-5d64ece4-dc73-59e8-9624-de2ce4c5a35e.files").write_text(rules)
    (folder / "held").write_text(held)
    return folder.parent


def test_a_profile_that_covers_every_file_has_no_findings_and_each_record_is_read_once(tmp_path) -> None:
    records = record(tmp_path, RULES, "0100002 /pool/m1.qcow2\n0100000 /pool/base.qcow2\n")
    assert apparmor_check.findings(records, []) == []
    assert apparmor_check.findings(records, []) == []


def test_a_named_file_the_rules_miss_is_a_finding(tmp_path) -> None:
    missing_kernel = RULES.replace('  "/boot/vmlinuz" r,\n', "")
    records = record(tmp_path, missing_kernel, "")
    assert apparmor_check.findings(records, []) == [
        "domain m1: /boot/vmlinuz needs r and its AppArmor profile does not allow it"]
    assert apparmor_check.findings(records, []) == [], "reported once"


def test_a_host_file_qemu_holds_that_the_rules_miss_is_a_finding(tmp_path) -> None:
    host = tmp_path / "host"
    stray = host / "stray.img"
    elsewhere = tmp_path / "elsewhere.img"
    held = f"{oct(os.O_RDWR)[2:]} {stray}\n{oct(os.O_RDONLY)[2:]} {elsewhere}\n0 pipe:[1234]\n"
    records = record(tmp_path, RULES, held)
    assert apparmor_check.findings(records, [host]) == [
        f"domain m1: {stray} needs rw and its AppArmor profile does not allow it"], \
        "only files of the host's folders; a pipe is no file"


def test_a_record_without_held_files_waits_for_qemu(tmp_path) -> None:
    records = record(tmp_path, "", "")
    (records / "5d64ece4-dc73-59e8-9624-de2ce4c5a35e" / "held").unlink()
    assert apparmor_check.findings(records, []) == []


def test_a_path_seen_through_the_hosts_root_file_system_is_the_path_qemu_opened(tmp_path) -> None:
    host = tmp_path / "host"
    root = tmp_path / "roots" / "trixie"
    rules = f'  "{host}/m1.qcow2" rk,\n'
    held = f"{oct(os.O_RDWR)[2:]} {root}{host}/m1.qcow2\n"
    domain = "<domain><name>m1</name><devices/></domain>"
    records = record(tmp_path, rules, held, domain)
    assert apparmor_check.findings(records, [host], root) == [
        f"domain m1: {host}/m1.qcow2 needs rw and its AppArmor profile does not allow it"]


def test_a_file_held_twice_needs_its_widest_access(tmp_path) -> None:
    host = tmp_path / "host"
    disk = host / "d.img"
    rules = f'  "{disk}" rk,\n'
    held = f"{oct(os.O_RDONLY)[2:]} {disk}\n{oct(os.O_RDWR)[2:]} {disk}\n"
    records = record(tmp_path, rules, held, "<domain><name>m1</name><devices/></domain>")
    assert apparmor_check.findings(records, [host]) == [
        f"domain m1: {disk} needs rw and its AppArmor profile does not allow it"]


def test_a_record_without_its_rules_is_a_finding_not_a_crash(tmp_path) -> None:
    records = record(tmp_path, "", "")
    for files in (records / "5d64ece4-dc73-59e8-9624-de2ce4c5a35e" / "libvirt").glob("*.files"):
        files.unlink()
    assert apparmor_check.findings(records, []) == [
        "domain m1: its profile's rules were not recorded (the hook failed before them)"]
