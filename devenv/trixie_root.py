"""A Debian 13 (trixie) root file system holding libvirt and QEMU, for a LibvirtHost whose daemons run chrooted in it.

This machine is Debian 12: its libvirt (9.0) and QEMU (7.2) are the ones the test hosts run by default. A host given
`root=ensure_trixie_root()` runs trixie's libvirtd and virtlogd instead (libvirt 11, QEMU 10), chrooted into this root
inside the host's own network and mount namespaces (see devenv.libvirt_host), so the provider can be tried against a
newer libvirt without touching the machine's own packages.

The root is debootstrapped once (`--variant=minbase`, then apt installs the packages below and what they depend
on, without Recommends) into the cache, as `<cache>/roots/trixie-<recipe hash>`: the hash covers the suite, the package list and
RECIPE_REVISION (raise it when what is done after debootstrap changes), so a changed recipe builds a new root and an
unchanged one only checks the cache. The build happens in a temporary folder beside the result under a lock and is
renamed into place once complete, so an interrupted build leaves nothing that looks finished (a later build removes
what it left). The root is shared by every host using it and is not written to at run time: each host mounts its own
state folders, /run and /tmp over the root's, in its own mount namespace.

    python -m devenv.trixie_root            # build if needed; prints the root's folder
    python -m devenv.trixie_root --folder   # prints the folder of the current recipe, builds nothing
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import grp
import hashlib
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from devenv import paths

log = logging.getLogger(__name__)

SUITE = "trixie"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# libvirtd itself (libvirt-daemon; virtlogd comes as libvirt-daemon-log), the drivers a test host uses (QEMU, the
# NAT network with its dnsmasq, the dir pool, the traffic filters and their clean-traffic set), QEMU for x86 under
# TCG (its ROMs, SeaBIOS and iPXE, are its dependencies) and qemu-img (qemu-utils) for volumes. libvirt 11's network
# driver writes its NAT rules with nft (nftables); the nwfilter driver still drives iptables and ebtables.
PACKAGES = (
    "libvirt-daemon",
    "libvirt-daemon-system",  # what makes the user and group QEMU runs as (libvirt-qemu, kvm), as on the machine
    "apparmor",  # apparmor_parser, for each guest's profile (devenv.apparmor_check), with libvirt 11's virt-aa-helper
    "libvirt-daemon-driver-qemu",
    "libvirt-daemon-driver-network",
    "libvirt-daemon-driver-storage",
    "libvirt-daemon-driver-nwfilter",
    "libvirt-daemon-config-nwfilter",
    "qemu-system-x86",
    "qemu-utils",
    "dnsmasq-base",
    "nftables",
    "iptables",
    "ebtables",
)
RECIPE_REVISION = 3  # raise when the steps after debootstrap change
# Of no use in a root nobody logs into; removed to keep the root small.
PRUNED = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info",
          "usr/share/locale", "usr/share/lintian")
STEP_TIMEOUT_S = 3600.0


class TrixieRootError(RuntimeError):
    pass


def recipe() -> str:
    return (f"suite={SUITE}\npackages={','.join(sorted(PACKAGES))}\nrevision={RECIPE_REVISION}\n"
            f"kvm-gid={machine_kvm_gid()}\n")


def machine_kvm_gid() -> int | None:
    """The machine's `kvm` group (its /dev/kvm's, see devenv.libvirt_host.ensure_kvm_device_group): the root's gets
    the same id, so the root's QEMU user, a member of it, may open the device as on the machine. Were it another,
    libvirt would find KVM unusable to that user and probe QEMU again at every capabilities lookup (seconds each)."""
    try:
        return grp.getgrnam("kvm").gr_gid
    except KeyError:
        return None


def recipe_hash() -> str:
    return hashlib.sha256(recipe().encode()).hexdigest()[:16]


def roots_dir() -> pathlib.Path:
    return paths.cache_dir() / "roots"


def root_folder() -> pathlib.Path:
    """Where the root of the current recipe is (or will be once built)."""
    return roots_dir() / f"{SUITE}-{recipe_hash()}"


def find_trixie_root() -> pathlib.Path | None:
    folder = root_folder()
    return folder if folder.is_dir() else None


def ensure_trixie_root() -> pathlib.Path:
    """The root of the current recipe, built first when missing (a few minutes; one builder at a time)."""
    folder = root_folder()
    if folder.is_dir():
        return folder
    roots_dir().mkdir(parents=True, exist_ok=True)
    with _build_lock():
        if folder.is_dir():  # another builder finished meanwhile
            return folder
        for stale in roots_dir().glob(f".build-{SUITE}-*"):
            log.warning("removing stale build folder %s", stale)
            remove_build_dir(stale)
        work = pathlib.Path(tempfile.mkdtemp(prefix=f".build-{folder.name}.", dir=roots_dir()))
        try:
            work.chmod(0o755)  # it becomes the root's /: the daemons' unprivileged helpers (dnsmasq) must enter it
            build(work)
            work.rename(folder)
        except BaseException:
            remove_build_dir(work)
            raise
    return folder


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    with open(roots_dir() / f".build-{SUITE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(root: pathlib.Path) -> None:
    """debootstrap the bare minbase into `root` (an empty folder), install PACKAGES into it with apt, prune it."""
    started = time.monotonic()
    log.info("debootstrap %s into %s", SUITE, root)
    # Not `--include=PACKAGES`: bookworm's debootstrap (1.0.128) cannot order trixie's systemd (pulled in by libvirt)
    # in its one dpkg run ("systemd pre-depends on libsystemd-shared ... unpacked, but has never been configured");
    # apt, run in the root afterwards, can.
    run_logged(["debootstrap", "--variant=minbase", SUITE, str(root), MIRROR], root)
    log.info("debootstrap took %.0f s; installing libvirt and QEMU with apt", time.monotonic() - started)
    # No service of the root is ever started by a package's scripts (there is no init in it anyway).
    policy = root / "usr" / "sbin" / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    # /proc for the packages' scripts, mounted in a mount namespace of its own: it goes when the command ends.
    chroot = f"chroot {root}"
    kvm_gid = machine_kvm_gid()
    script = " && ".join([
        f"mount -t proc proc {root}/proc",
        *([f"{chroot} groupadd --system --gid {kvm_gid} kvm"] if kvm_gid is not None else []),  # before the packages
        f"{chroot} apt-get update -q",
        f"{chroot} apt-get install -y -q --no-install-recommends {' '.join(PACKAGES)}",
        f"{chroot} apt-get clean",
    ])
    run_logged(["unshare", "--mount", "--", "sh", "-ec", script], root, env={"DEBIAN_FRONTEND": "noninteractive"})
    configure(root)
    log.info("trixie root built in %.0f s (%d MiB)", time.monotonic() - started, du_mib(root))


def run_logged(argv: list[str], root: pathlib.Path, env: dict[str, str] | None = None) -> None:
    """Run a build step niced (the machine has two cores, and tests may run beside the build), its output in a log
    beside the build folder, in a process group of its own so an interrupt ends its children (dpkg) too."""
    build_log = root.parent / f"{root.name}.log"
    try:
        with open(build_log, "wb") as output:
            process = subprocess.Popen(["nice", "-n", "10", *argv], stdin=subprocess.DEVNULL, stdout=output,
                                       stderr=output, start_new_session=True, env={**os.environ, **(env or {})})
            try:
                returncode = process.wait(timeout=STEP_TIMEOUT_S)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise
        if returncode != 0:
            tail = build_log.read_text(errors="replace").splitlines()[-30:]
            raise TrixieRootError(f"{argv[0]} failed ({returncode}):\n" + "\n".join(tail))
    finally:
        unmount_below(root)  # debootstrap mounts /proc and /sys in the root; an interrupted run may leave them
        build_log.unlink(missing_ok=True)


def configure(root: pathlib.Path) -> None:
    for sub in PRUNED:
        folder = root / sub
        if folder.is_dir():
            shutil.rmtree(folder)
            folder.mkdir()
    # debootstrap copies this machine's resolver and host name; the root has no use for either.
    (root / "etc" / "resolv.conf").unlink(missing_ok=True)
    (root / "etc" / "hostname").write_text("trixie-libvirt\n")


def unmount_below(folder: pathlib.Path) -> None:
    """Lazily unmount whatever is mounted below `folder`, deepest first."""
    targets = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout.splitlines()
    prefix = f"{folder}/"
    for target in sorted((t for t in targets if t.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


def remove_build_dir(folder: pathlib.Path) -> None:
    unmount_below(folder)
    subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=False)
    pathlib.Path(f"{folder}.log").unlink(missing_ok=True)


def du_mib(folder: pathlib.Path) -> int:
    out = subprocess.run(["du", "-sxm", str(folder)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def versions(root: pathlib.Path) -> dict[str, str]:
    """The installed versions of libvirt and QEMU in the root, by dpkg's database."""
    out = subprocess.run(["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", "-W", "-f", "${Package} ${Version}\n",
                          "libvirt-daemon", "qemu-system-x86"], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", action="store_true", help="print the current recipe's folder, build nothing")
    args = parser.parse_args()
    if args.folder:
        print(root_folder())
        return
    logging.basicConfig(level=logging.INFO, format="[trixie-root] %(message)s", stream=sys.stderr)
    print(ensure_trixie_root())


if __name__ == "__main__":
    main()
