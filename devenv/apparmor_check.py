"""AppArmor as Ubuntu's libvirtd makes it, for every domain a test libvirt host starts, checked without a kernel that
enforces it (this machine's has no AppArmor).

On Ubuntu, libvirtd confines each guest's QEMU with a profile of its own: libvirt's `virt-aa-helper` writes the
profile's file rules from the domain's XML (every disk and its backing chain, the CD-ROM, kernel and initrd, firmware
and NVRAM, fw_cfg files, the serial log), and the profile is TEMPLATE.qemu (the `libvirt-qemu` abstraction) with
those rules. A file the rules miss is one QEMU cannot open there, so the guest does not start or fails later.

Each test host installs libvirt's QEMU hook (`/etc/libvirt/hooks/qemu`, in its state folder) from HOOK. At a domain's
`start` the hook runs the host's own `virt-aa-helper` on the domain's XML in dry-run mode (nothing is written into
/etc/apparmor.d or loaded) and compiles the whole profile with `apparmor_parser` without loading it; a profile that
cannot be made or compiled fails the start with their message, as it would on Ubuntu. At `started` it records the
files the domain's QEMU holds and how (read, write). `findings` then checks each recorded domain: every file its XML
names, and every file of the host's folders QEMU holds, must be allowed by the rules with the access it needs and not
denied. What is not checked: the rules of the `libvirt-qemu` abstraction itself (libvirt's and Ubuntu's, for QEMU's
own files), and enforcement.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import xml.etree.ElementTree as ET

RECORDS = "apparmor"  # the host's state sub-folder the hook records each domain in, one folder per domain UUID
CHECKED = "checked"  # the mark of a record `findings` has read

# The hook, with @RECORDS@ replaced by the records folder. POSIX sh, absolute paths, no Python: it runs in libvirtd's
# mount namespace, inside a root's file system for a host that has one (devenv.trixie_root installs apparmor there).
HOOK = r"""#!/bin/sh
# capi-libvirt test host: each domain's AppArmor profile, made and compiled as Ubuntu's libvirtd makes it (not loaded),
# and the files its QEMU holds (devenv/apparmor_check.py). Arguments: domain name, operation; the domain XML on stdin.
set -eu
case "$2" in start|started) ;; *) cat >/dev/null; exit 0 ;; esac
xml=$(cat)
uuid=$(printf '%s\n' "$xml" | sed -n 's:.*<uuid>\([0-9a-f-]*\)</uuid>.*:\1:p' | head -n 1)
dir="@RECORDS@/$uuid"
mkdir -p "$dir/libvirt"
if [ "$2" = start ]; then
  profile="libvirt-$uuid"
  rm -f "$dir/checked" "$dir/held"  # a domain started again is checked again
  printf '%s\n' "$xml" > "$dir/domain.xml"
  if ! /usr/lib/libvirt/virt-aa-helper -c -d -u "$profile" < "$dir/domain.xml" 2> "$dir/helper.out"; then
    echo "virt-aa-helper could not make the AppArmor profile of $1:" >&2; cat "$dir/helper.out" >&2; exit 1
  fi
  # Dry run: each part of the profile follows a "virt-aa-helper:" line; the second part is the file rules.
  awk '/^virt-aa-helper:$/ { part++; next } part == 2' "$dir/helper.out" > "$dir/libvirt/$profile.files"
  sed -e "s/LIBVIRT_TEMPLATE/$profile/" \
      -e "s|#include <abstractions/libvirt-qemu>|&\n  #include <libvirt/$profile.files>|" \
      /etc/apparmor.d/libvirt/TEMPLATE.qemu > "$dir/libvirt/$profile"
  if ! grep -q "#include <libvirt/$profile.files>" "$dir/libvirt/$profile"; then
    echo "TEMPLATE.qemu has no '#include <abstractions/libvirt-qemu>' line to add the rules after" >&2; exit 1
  fi
  if ! /usr/sbin/apparmor_parser -Q -K -I "$dir" -I /etc/apparmor.d -o "$dir/profile.bin" "$dir/libvirt/$profile" \
      2> "$dir/parser.out"; then
    echo "apparmor_parser refused the AppArmor profile of $1:" >&2; cat "$dir/parser.out" >&2; exit 1
  fi
else
  pid=$(cat "/run/libvirt/qemu/$1.pid")
  for fd in /proc/"$pid"/fd/*; do
    [ -f "$fd" ] || continue  # regular files only, while they exist
    target=$(readlink "$fd") || continue
    flags=$(sed -n 's/^flags:[[:space:]]*//p' "/proc/$pid/fdinfo/${fd##*/}") || continue
    printf '%s %s\n' "$flags" "$target"
  done > "$dir/held"
fi
"""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One file rule of a profile: an AppArmor path glob and its permissions; `deny` rules forbid them."""

    glob: str
    permissions: str
    deny: bool = False

    def matches(self, path: str) -> bool:
        return re.fullmatch(glob_regex(self.glob), path) is not None


def install_hook(etc: pathlib.Path, records: pathlib.Path) -> None:
    """The hook as libvirtd finds it at start: `hooks/qemu` of its /etc/libvirt (the host's `etc`), executable."""
    hook = etc / "hooks" / "qemu"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(HOOK.replace("@RECORDS@", str(records)))
    hook.chmod(0o755)
    records.mkdir(parents=True, exist_ok=True)


def programs(root: pathlib.Path | None = None) -> list[str]:
    """The programs the hook runs that are missing (on the machine, or in `root`)."""
    base = root or pathlib.Path("/")
    wanted = ["usr/lib/libvirt/virt-aa-helper", "usr/sbin/apparmor_parser", "etc/apparmor.d/libvirt/TEMPLATE.qemu"]
    return [f"/{path}" for path in wanted if not (base / path).exists()]


def findings(records: pathlib.Path, host_folders: list[pathlib.Path], root: pathlib.Path | None = None) -> list[str]:
    """What the profiles of the domains recorded since the last call miss: one line per file, naming the domain.
    `root`: the root file system the host's daemons run in, whose path the hook may see before a file's (QEMU's
    mount namespace is not the hook's)."""
    found = []
    for record in sorted(records.glob("*/domain.xml")):
        folder = record.parent
        if (folder / CHECKED).exists() or not (folder / "held").exists():
            continue  # read before, or QEMU not (yet) started
        found += domain_findings(folder, host_folders, root)
        (folder / CHECKED).touch()
    return found


def domain_findings(folder: pathlib.Path, host_folders: list[pathlib.Path],
                    root: pathlib.Path | None = None) -> list[str]:
    domain = ET.fromstring((folder / "domain.xml").read_text())
    name = domain.findtext("name") or folder.name
    files = sorted(folder.glob("libvirt/*.files"))
    if not files:
        return [f"domain {name}: its profile's rules were not recorded (the hook failed before them)"]
    rules = parse_rules(files[0].read_text())
    needed = named_files(domain)
    for access, path in held_files((folder / "held").read_text()):
        if root is not None and pathlib.Path(path).is_relative_to(root):
            path = "/" + str(pathlib.Path(path).relative_to(root))
        if any(pathlib.Path(path).is_relative_to(host) for host in host_folders):
            needed[path] = widest(needed.get(path, ""), access)
    return [f"domain {name}: {path} needs {access} and its AppArmor profile does not allow it"
            for path, access in sorted(needed.items()) if not allows(rules, path, access)]


def named_files(domain: ET.Element) -> dict[str, str]:
    """The host files the domain XML names, with the access QEMU needs: disks read-write unless read-only, their
    backing chains, CD-ROMs, kernel, initrd and firmware read, NVRAM read-write, fw_cfg files read, file serials
    written."""
    needed: dict[str, str] = {}
    for disk in domain.findall("devices/disk"):
        source = disk.find("source")
        if source is not None and source.get("file"):
            readonly = disk.find("readonly") is not None or disk.get("device") == "cdrom"
            needed[source.get("file", "")] = "r" if readonly else "rw"
        for backing in disk.iter("backingStore"):
            backing_source = backing.find("source")
            if backing_source is not None and backing_source.get("file"):
                needed[backing_source.get("file", "")] = "r"
    for tag, access in (("kernel", "r"), ("initrd", "r"), ("loader", "r"), ("nvram", "rw")):
        text = domain.findtext(f"os/{tag}")
        if text:
            needed[text.strip()] = access
    for entry in domain.findall("sysinfo[@type='fwcfg']/entry"):
        if entry.get("file"):
            needed[entry.get("file", "")] = "r"
    for serial in domain.findall("devices/serial[@type='file']/source"):
        if serial.get("path"):
            needed[serial.get("path", "")] = "w"
    return needed


def widest(one: str, other: str) -> str:
    """The access that covers both ("r", "w", "rw", or "" for none)."""
    return "".join(permission for permission in "rw" if permission in one + other)


def held_files(text: str) -> list[tuple[str, str]]:
    """(access, path) of each file descriptor the hook recorded ("<octal flags> <target>"; regular files only, as they
    were when QEMU had started)."""
    held = []
    for line in text.splitlines():
        flags, _, target = line.partition(" ")
        if target.startswith("/"):
            held.append(({os.O_RDONLY: "r", os.O_WRONLY: "w", os.O_RDWR: "rw"}[int(flags, 8) & os.O_ACCMODE],
                         target))
    return held


RULE = re.compile(r'^\s*(deny\s+)?"([^"]+)"\s+([a-zA-Z]+),\s*$')


def parse_rules(text: str) -> list[Rule]:
    """The file rules of virt-aa-helper's output (`"path" perms,`, `deny "path" perms,`); comments and the rest are
    left out."""
    rules = []
    for line in text.splitlines():
        match = RULE.match(line)
        if match:
            rules.append(Rule(match.group(2), match.group(3), deny=bool(match.group(1))))
    return rules


def allows(rules: list[Rule], path: str, access: str) -> bool:
    """Whether the rules let `path` be opened with `access` ("r", "w", "rw"): each permission allowed by some rule
    (write also by append) and denied by none."""
    matching = [rule for rule in rules if rule.matches(path)]
    for permission in access:
        granted = {permission, "a"} if permission == "w" else {permission}
        if not any(granted & set(rule.permissions) for rule in matching if not rule.deny):
            return False
        if any(permission in rule.permissions for rule in matching if rule.deny):
            return False
    return True


def glob_regex(glob: str) -> str:
    """AppArmor's path globbing as a regular expression: `**` any characters, `*` and `?` within one path element,
    `{a,b}` alternatives, `[...]` a character class."""
    out, index = [], 0
    while index < len(glob):
        char = glob[index]
        if glob.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "{" and "}" in glob[index:]:
            end = glob.index("}", index)
            out.append("(?:" + "|".join(glob_regex(part) for part in glob[index + 1:end].split(",")) + ")")
            index = end + 1
            continue
        elif char == "[" and "]" in glob[index:]:
            end = glob.index("]", index)
            out.append(glob[index:end + 1])
            index = end + 1
            continue
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def remove_records(records: pathlib.Path) -> None:
    shutil.rmtree(records, ignore_errors=True)
