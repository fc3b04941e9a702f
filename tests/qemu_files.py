"""Whom a guest's QEMU runs as and how it holds each file, read from /proc, and who owns a file on the host: what the
e2e tests check of libvirt's ownership labelling (DAC) on hosts configured as Debian and Ubuntu package libvirt.

On such a host QEMU runs as the unprivileged `libvirt-qemu`; libvirt gives it each file the guest uses when the guest
starts and gives the file back to its owner when the guest stops (remember_owner keeps the owner in the file's
`trusted.libvirt.security.*` extended attributes meanwhile). A base image several guests share is never given: it
stays root's, readable by all, and QEMU holds it read-only.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pwd

from devenv.libvirt_host import QEMU_USER, LibvirtHost

LIBVIRT_XATTR_PREFIX = "trusted.libvirt.security."


@dataclasses.dataclass(frozen=True)
class Held:
    """A file as a process holds it: how it opened it ("r", "w", "rw")."""

    path: str
    access: str


@dataclasses.dataclass(frozen=True)
class Owned:
    """A file's owner, group and permission bits, and libvirt's remembered-owner attributes on it."""

    uid: int
    gid: int
    mode: int
    libvirt_attributes: tuple[str, ...]


def qemu_uid() -> int:
    return pwd.getpwnam(QEMU_USER).pw_uid


def qemu_pid(host: LibvirtHost, domain_name: str) -> int:
    """The pid of a running domain's QEMU, from the pid file libvirt keeps in the host's run folder."""
    return int((host.state_dir / "run" / "qemu" / f"{domain_name}.pid").read_text().strip())


def process_uid(pid: int) -> int:
    """The effective user id of a process."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[2])
    raise AssertionError(f"no Uid line for process {pid}")


def held_files(pid: int) -> dict[str, Held]:
    """The regular files a process has open, by path, with how it opened them (the O_ACCMODE bits of each fd)."""
    held: dict[str, Held] = {}
    for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
            flags = next(int(line.split()[1], 8) for line in (pathlib.Path(f"/proc/{pid}/fdinfo") / fd.name)
                         .read_text().splitlines() if line.startswith("flags:"))
        except (FileNotFoundError, StopIteration):
            continue  # closed meanwhile
        if not target.startswith("/"):
            continue  # sockets, pipes, anonymous inodes
        access = {os.O_RDONLY: "r", os.O_WRONLY: "w", os.O_RDWR: "rw"}[flags & os.O_ACCMODE]
        # A file held twice (QEMU reopens images) counts with its widest access.
        if target not in held or len(access) > len(held[target].access):
            held[target] = Held(target, access)
    return held


def owned(path: pathlib.Path | str) -> Owned:
    stat = os.stat(path)
    attributes = tuple(sorted(name for name in os.listxattr(path) if name.startswith(LIBVIRT_XATTR_PREFIX)))
    return Owned(stat.st_uid, stat.st_gid, stat.st_mode & 0o7777, attributes)
