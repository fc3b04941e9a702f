"""The stand-in for hardware virtualization on a test host: QEMU as libvirt starts it, with a domain's KVM accelerator
turned into TCG at the last step.

This machine's /dev/kvm opens but runs no guest (no virtualization extensions are passed through: `-accel kvm` guests
hang or die with an emulation failure), so a `<domain type='kvm'>`, the provider's default, could not boot here. In
each test host's mount namespace a wrapper is bound over QEMU's binary (and the binary itself onto a path the wrapper
execs): libvirt probes, validates, defines, labels and starts the default domain exactly as on a real host, and only
the process it starts for a domain gets `-accel tcg` where libvirt wrote `-accel kvm`, with the translation cache the
provider gives a `qemu` domain of the same memory (core.domain_xml.tcg_tb_cache_mib: QEMU's 1 GiB default boots the
node image about a tenth slower), so a kvm domain runs here as the provider's qemu domain does. libvirt's capability
probes pass through unchanged (they find /dev/kvm and report the kvm domain type, as on a real host). The wrapper
says on QEMU's stderr, which libvirt writes to the domain's log, that it changed the accelerator.

The files live under paths.run_dir(), which QEMU's unprivileged user can reach (root's home, where the cache is, it
cannot), and are written only when their text changes: libvirt keys its cached QEMU capabilities on the binary's
ctime, which is the wrapper's inside the namespace.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Callable

from capi_libvirt.core import domain_xml
from devenv import paths

QEMU_BINARY = pathlib.Path("/usr/bin/qemu-system-x86_64")

WRAPPER = """\
#!/bin/sh
# capi-libvirt test host (devenv/kvm_as_tcg.py): this machine's /dev/kvm runs no guest, so a domain libvirt starts
# with -accel kvm runs with -accel tcg and the provider's translation cache for its memory (half of it, between
# @MIN_TB@ and @MAX_TB@ MiB). Anything else (libvirt's capability probes) runs unchanged.
real=@REAL@
domain=no
previous=
tb=@MIN_TB@
for arg in "$@"; do
    if [ "$previous" = -name ]; then case "$arg" in guest=*) domain=yes ;; esac; fi
    if [ "$previous" = -m ]; then
        size=${arg#size=}
        case "$size" in
            *k) mib=$((${size%k} / 1024)) ;;
            *M) mib=${size%M} ;;
            *G) mib=$((${size%G} * 1024)) ;;
            *) mib=$size ;;
        esac
        tb=$((mib / 2))
        [ "$tb" -lt @MIN_TB@ ] && tb=@MIN_TB@
        [ "$tb" -gt @MAX_TB@ ] && tb=@MAX_TB@
    fi
    previous=$arg
done
if [ "$domain" = yes ]; then
    count=$#
    previous=
    while [ "$count" -gt 0 ]; do
        arg=$1
        shift
        if [ "$previous" = -accel ] && [ "$arg" = kvm ]; then
            arg="tcg,tb-size=$tb"
            echo "capi-libvirt test host: -accel kvm run as -accel $arg (no usable /dev/kvm on this machine)" >&2
        fi
        set -- "$@" "$arg"
        previous=$arg
        count=$((count - 1))
    done
fi
exec "$real" "$@"
"""


def folder() -> pathlib.Path:
    return paths.run_dir() / "kvm-as-tcg"


def wrapper_path() -> pathlib.Path:
    return folder() / QEMU_BINARY.name


def real_path() -> pathlib.Path:
    """Where each host's namespace binds QEMU's own binary: an empty file outside it, in a `usr/bin` beside `usr/lib`,
    `usr/share` and `usr/libexec` links to the system's (QEMU finds its modules and firmware relative to its own
    path). Its name stays QEMU's, so the process is still called qemu-system-x86_64."""
    return folder() / "usr" / "bin" / QEMU_BINARY.name


def wrapper_text(real: pathlib.Path) -> str:
    """The wrapper, exec'ing `real`, with the provider's bounds of a qemu domain's translation cache."""
    return (WRAPPER.replace("@REAL@", str(real)).replace("@MIN_TB@", str(domain_xml.DEFAULT_TCG_TB_CACHE_MIB))
            .replace("@MAX_TB@", str(domain_xml.MAX_TCG_TB_CACHE_MIB)))


def install() -> None:
    """The wrapper and the real binary's mount point, readable and executable by every user (QEMU's included)."""
    real = real_path()
    usr = real.parent.parent
    real.parent.mkdir(parents=True, exist_ok=True)
    for path in (folder(), usr, real.parent):
        path.chmod(0o755)
    for name in ("lib", "share", "libexec"):
        link = usr / name
        with contextlib.suppress(FileExistsError):  # made by a host starting beside this one
            link.symlink_to(pathlib.Path("/usr") / name)
    if not real.exists():
        real.touch(mode=0o755)
    text = wrapper_text(real)
    wrapper = wrapper_path()
    if not wrapper.exists() or wrapper.read_text() != text:
        partial = wrapper.with_name(f".{wrapper.name}.{os.getpid()}.partial")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.replace(wrapper)


def mount_steps(place: Callable[[pathlib.Path], str] = str) -> list[list[str]]:
    """The mounts, in a host's mount namespace, that put the wrapper in QEMU's place; `place` gives a path's place in
    the file system the daemons see (inside a root, with a root)."""
    return [["mount", "--bind", place(QEMU_BINARY), place(real_path())],
            ["mount", "--bind", place(wrapper_path()), place(QEMU_BINARY)]]
