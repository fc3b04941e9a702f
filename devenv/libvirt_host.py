"""A throw-away libvirt host for the test bed: libvirtd and virtlogd in a network and mount namespace of their own.

Each LibvirtHost creates a network namespace (its guests, bridge, dnsmasq and NAT rules live there, never in the
machine's own network namespace) and starts its daemons in a private mount namespace inside it, where the folders
libvirt hard-codes (/etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt) are bind
mounts of the host's own state folder under paths.run_dir()/<name>. That is what lets several hosts run side by side:
their sockets, pid files, domain/network/pool definitions and state never meet. The sockets stay reachable from the
machine's own namespaces through the state folder, so `uri` works from anywhere on the machine.

QEMU runs as Debian and Ubuntu run it (QEMU_CONF), and a libvirt hook makes and checks each domain's AppArmor profile
as Ubuntu's libvirtd would (devenv.apparmor_check); a `kvm` domain, the provider's default, starts as on a real host
and runs under TCG (devenv.kvm_as_tcg, the one stand-in for hardware virtualization). The host gets one `dir` storage
pool and one NAT network with DHCP (none with `network_name=None`: a host whose guests sit on a plain bridge, see
devenv.bridged_lan). stop() destroys what runs there, stops the daemons by PID, ends anything left in the
namespace, deletes the namespace and removes the state folder (logs survive only when given a log folder of their
own). The traces left on the machine are the empty mount point /run/libvirt, made when it is missing, and the QEMU
wrapper's files under paths.run_dir().
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import pathlib
import shlex
import shutil
import signal
import stat
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType

import libvirt

from devenv import apparmor_check, kvm_as_tcg, paths
from devenv.guest_image import GuestImage

log = logging.getLogger(__name__)

# Folders libvirt compiles in; each gets a private bind mount per host (key: sub-folder of the host's state folder).
LIBVIRT_SYSTEM_DIRS = {
    "etc": pathlib.Path("/etc/libvirt"),
    "run": pathlib.Path("/run/libvirt"),
    "lib": pathlib.Path("/var/lib/libvirt"),
    "cache": pathlib.Path("/var/cache/libvirt"),
    "log": pathlib.Path("/var/log/libvirt"),
}
LIBVIRT_NWFILTERS = pathlib.Path("/usr/share/libvirt/nwfilter")  # Debian's libvirt-daemon-config-nwfilter
UNIX_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
START_TIMEOUT_S = 120.0  # generous: the first start probes QEMU, and the machine may be busy building
STOP_GRACE_S = 15.0

ConfValue = str | int | Sequence[str]  # a libvirt config value: "string", number, ["list", "of", "strings"]


class LibvirtHostError(RuntimeError):
    pass


class LibvirtHost:
    """One libvirt host in its own network namespace; use as a context manager or call start() and stop()."""

    # The hosts of this process that are running, and what the AppArmor check found on hosts stopped since it was
    # last taken (take_profile_findings).
    running: set[LibvirtHost] = set()
    stopped_findings: list[str] = []

    def __init__(
        self,
        name: str,
        subnet: str = "192.168.122.0/24",
        *,
        pool_name: str = "capi-libvirt",
        network_name: str | None = "capi-libvirt",
        state_dir: pathlib.Path | None = None,
        log_dir: pathlib.Path | None = None,
        log_level: int = 3,
        libvirtd_settings: Mapping[str, ConfValue] | None = None,
        before_daemons: Callable[[LibvirtHost], None] | None = None,
        dnsmasq_options: Sequence[str] = (),
        dhcp_reserved: int = 0,
        root: pathlib.Path | None = None,
        root_binds: Sequence[pathlib.Path] = (),
    ) -> None:
        """`subnet` is the NAT network's (the bridge takes its first address); `network_name` None: no libvirt network
        at all (and no libvirt DHCP), as on a host whose guests sit on a bridge of the LAN. Logs (libvirtd, virtlogd, each guest's
        QEMU log) go to `log_dir`, which stop() keeps, else into the state folder, which stop() removes.
        `log_level` is libvirt's: 1 debug, 2 info, 3 warning, 4 error.
        `libvirtd_settings` are added to libvirtd.conf; when they turn listen_tls or listen_tcp on, libvirtd starts
        with --listen. `before_daemons` runs once the namespace exists, before the daemons start (to add a link whose
        address libvirtd listens on); a failure there fails start(), which then stops the host. See remote_access.
        `dnsmasq_options` are passed to the network's dnsmasq (the bench sets `no-ping`, see bench/testbed.py).
        `dhcp_reserved`: the subnet's last addresses DHCP never hands out (a virtual IP's, `reserved_addresses`).
        `root`: a root file system holding another libvirt and QEMU (devenv.trixie_root's, Debian 13's); the daemons
        then run chrooted in it (see _root_steps), and everything else stays as it is: the socket is still
        `socket_path`, the pool is still `pool_dir`. The host's folders a guest or libvirtd may be given by path
        (`root_shared_folders`: the state folder, paths.run_dir() and paths.cache_dir(), plus `root_binds`) are seen
        inside the root at the same paths. None (the default): the machine's own libvirt and QEMU."""
        self.name = name
        self.subnet = ipaddress.IPv4Network(subnet)
        self.pool_name = pool_name
        self.network_name = network_name
        self.netns = f"capi-libvirt-{name}"
        self.state_dir = state_dir or paths.run_dir() / name
        self.log_dir = log_dir or self.state_dir / "log"
        self.log_level = log_level
        self.libvirtd_settings = dict(libvirtd_settings or {})
        self.before_daemons = before_daemons
        self.dnsmasq_options = tuple(dnsmasq_options)
        self.dhcp_reserved = dhcp_reserved
        self.root = root.resolve() if root is not None else None
        self.root_binds = tuple(pathlib.Path(folder) for folder in root_binds)
        if self.root is not None and not (self.root / "usr" / "sbin" / "libvirtd").exists():
            raise LibvirtHostError(f"no libvirtd in the root {self.root}")
        missing = apparmor_check.programs(self.root)
        if missing:
            raise LibvirtHostError(f"no {', '.join(missing)} for the AppArmor check"
                                   + (f" in the root {self.root}" if self.root else " (make system-deps)"))
        if len(str(self.socket_path)) > UNIX_SOCKET_PATH_MAX:
            raise LibvirtHostError(f"state folder path too long for a UNIX socket: {self.socket_path}")

    # -- where things are -------------------------------------------------------------------------------------------

    @property
    def socket_path(self) -> pathlib.Path:
        return self.state_dir / "run" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.socket_path}"

    @property
    def pool_dir(self) -> pathlib.Path:
        return self.state_dir / "pool"

    @property
    def libvirtd_log(self) -> pathlib.Path:
        return self.log_dir / "libvirtd.log"

    @property
    def virtlogd_log(self) -> pathlib.Path:
        return self.log_dir / "virtlogd.log"

    @property
    def qemu_log_dir(self) -> pathlib.Path:
        """Where libvirt writes each domain's QEMU log (<domain>.log)."""
        return self.log_dir / "qemu"

    @property
    def bridge_address(self) -> ipaddress.IPv4Address:
        return next(self.subnet.hosts())

    @property
    def reserved_addresses(self) -> list[ipaddress.IPv4Address]:
        """The addresses of the NAT network that DHCP never hands out (`dhcp_reserved`), lowest first."""
        return list(self.subnet.hosts())[len(list(self.subnet.hosts())) - self.dhcp_reserved:]

    def _bind_mounts(self) -> dict[pathlib.Path, pathlib.Path]:
        """System folder -> this host's folder mounted over it in the daemons' mount namespace."""
        sources = {sub: self.state_dir / sub for sub in LIBVIRT_SYSTEM_DIRS}
        sources["log"] = self.log_dir
        return {LIBVIRT_SYSTEM_DIRS[sub]: source for sub, source in sources.items()}

    @property
    def root_shared_folders(self) -> list[pathlib.Path]:
        """With a `root`: the host's folders bound into the root at their own paths, outermost only, sorted."""
        folders = sorted({pathlib.Path(os.path.abspath(folder)) for folder in
                          (self.state_dir, paths.run_dir(), paths.cache_dir(), *self.root_binds)})
        return [folder for folder in folders if not any(other in folder.parents for other in folders)]

    @property
    def boot_dir(self) -> pathlib.Path:
        """The kernels and initrds this host's guests boot (kernelBoot), as an admin keeps them in
        /var/lib/libvirt/boot: in a folder the QEMU user can reach, which the image cache in root's home is not."""
        return self.state_dir / "boot"

    def boot_files(self, image: GuestImage) -> tuple[str, str]:
        """The image's kernel and initrd, copied into `boot_dir` once (readable by all, root's): their paths."""
        if image.kernel is None or image.initrd is None:
            raise LibvirtHostError(f"the {image.flavor} image boots from its own disk; it has no kernel and initrd")
        folder = self.boot_dir / image.folder.name
        folder.mkdir(parents=True, exist_ok=True)
        copies = []
        for source in (image.kernel, image.initrd):
            target = folder / source.name
            if not target.exists():
                partial = folder / f".{source.name}.partial"
                shutil.copyfile(source, partial)
                partial.chmod(0o644)
                partial.replace(target)
            copies.append(str(target))
        return copies[0], copies[1]

    @property
    def apparmor_records(self) -> pathlib.Path:
        """Where the AppArmor hook records each domain's profile and the files its QEMU holds (devenv.apparmor_check)."""
        return self.state_dir / apparmor_check.RECORDS

    def profile_findings(self) -> list[str]:
        """The files of domains started here since the last call that their AppArmor profiles would not allow."""
        if not self.apparmor_records.is_dir():
            return []
        return [f"host {self.name}: {finding}" for finding in
                apparmor_check.findings(self.apparmor_records, [self.state_dir], self.root)]

    @classmethod
    def take_profile_findings(cls) -> list[str]:
        """What the AppArmor check found on this process's hosts, running or stopped, since the last call."""
        found, cls.stopped_findings = cls.stopped_findings, []
        for host in sorted(cls.running, key=lambda host: host.name):
            found += host.profile_findings()
        return found

    def _pid_file(self, daemon: str) -> pathlib.Path:
        return self.state_dir / f"{daemon}.pid"

    # -- life cycle -------------------------------------------------------------------------------------------------

    def __enter__(self) -> LibvirtHost:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Create the namespace, start the daemons, wait until libvirtd answers, then add the pool and the network."""
        if self._netns_exists() or self.state_dir.exists():
            log.warning("libvirt host %s: clearing what an earlier run left behind", self.name)
            self.stop()
        ensure_kvm_device_group()
        kvm_as_tcg.install()
        try:
            self._write_state_folder()
            self._create_netns()
            if self.before_daemons is not None:
                self.before_daemons(self)
            self._start_daemons()
            self._wait_until_answering()
            with self.connect() as conn:
                define_dir_pool(conn, self.pool_name, self.pool_dir)
                if self.network_name is not None:
                    define_nat_network(conn, self.network_name, self.subnet, self.dnsmasq_options, self.dhcp_reserved)
        except BaseException:
            log.error("libvirt host %s failed to start; libvirtd log: %s", self.name, self.libvirtd_log)
            self._log_tail(self.libvirtd_log)
            self.stop()
            raise
        LibvirtHost.running.add(self)
        log.info("libvirt host %s ready: %s (netns %s, network %s, logs in %s)",
                 self.name, self.uri, self.netns, self.subnet, self.log_dir)

    def stop(self) -> None:
        """Leave nothing behind: domains, daemons, every process in the namespace, the namespace, the state folder."""
        if self._answers():
            self._destroy_everything_running()
        for daemon in ("libvirtd", "virtlogd"):
            pid = self._read_pid(daemon)
            # A pid file from an earlier, killed run may name a reused pid: only end the daemon it was written for.
            if pid is not None and process_command(pid) == daemon:
                log.info("libvirt host %s: stopping %s (pid %d)", self.name, daemon, pid)
                terminate(pid)
                log.info("libvirt host %s: %s (pid %d) stopped", self.name, daemon, pid)
        if self._netns_exists():
            for pid in self._netns_pids():
                log.info("libvirt host %s: ending leftover process %d in netns %s", self.name, pid, self.netns)
                terminate(pid)
            run(["ip", "netns", "delete", self.netns])
        LibvirtHost.running.discard(self)
        if self.state_dir.exists():
            try:
                LibvirtHost.stopped_findings += self.profile_findings()
            except Exception as error:  # a record it cannot read must not leave the state folder behind
                LibvirtHost.stopped_findings.append(f"host {self.name}: AppArmor records unreadable: {error!r}")
            # libvirt probes QEMU lazily, so the capabilities exist only once a host was used; keep them for the next.
            keep_qemu_capabilities(self.state_dir / "cache", self.root)
            shutil.rmtree(self.state_dir)
        log.info("libvirt host %s stopped and removed", self.name)

    def connect(self) -> libvirt.virConnect:
        """A new read-write connection; the caller closes it (virConnect is a context manager)."""
        return libvirt.open(self.uri)

    # -- start, step by step ----------------------------------------------------------------------------------------

    def _write_state_folder(self) -> None:
        for folder in (*self._bind_mounts().values(), self.pool_dir):
            folder.mkdir(parents=True, exist_ok=True)
        # The QEMU user passes through to the pool (0711, as Debian's and Ubuntu's /var/lib/libvirt/images) whatever
        # the umask; libvirt labels the files in it.
        self.state_dir.chmod(0o755)
        self.pool_dir.chmod(0o711)
        # libvirt makes it only when a guest's QEMU log is first written, after opening a serial log placed there.
        self.qemu_log_dir.mkdir(exist_ok=True)
        etc = self.state_dir / "etc"
        (etc / "libvirtd.conf").write_text(self._libvirtd_conf())
        (etc / "virtlogd.conf").write_text(self._virtlogd_conf())
        (etc / "qemu.conf").write_text(QEMU_CONF)
        apparmor_check.install_hook(etc, self.apparmor_records)
        # libvirt's own traffic filters (clean-traffic and the filters it is made of), as Debian's and Ubuntu's
        # libvirt-daemon-config-nwfilter install them into /etc/libvirt/nwfilter, where libvirtd loads them at start.
        nwfilters = LIBVIRT_NWFILTERS if self.root is None else self.root / LIBVIRT_NWFILTERS.relative_to("/")
        shutil.copytree(nwfilters, etc / "nwfilter", dirs_exist_ok=True)
        seed_qemu_capabilities(self.state_dir / "cache", self.root)

    def _libvirtd_conf(self) -> str:
        settings: dict[str, ConfValue] = dict(
            unix_sock_dir=str(LIBVIRT_SYSTEM_DIRS["run"]),
            # Only root on this machine reaches the socket (mode 0700); no polkit, which needs a system D-Bus.
            auth_unix_ro="none",
            auth_unix_rw="none",
            unix_sock_rw_perms="0700",
            log_outputs=f"{self.log_level}:file:{LIBVIRT_SYSTEM_DIRS['log'] / 'libvirtd.log'}",
        )
        return libvirt_conf(**(settings | self.libvirtd_settings))

    def _listens(self) -> bool:
        return any(self.libvirtd_settings.get(key) in (1, "1") for key in ("listen_tls", "listen_tcp"))

    def _virtlogd_conf(self) -> str:
        return libvirt_conf(log_outputs=f"{self.log_level}:file:{LIBVIRT_SYSTEM_DIRS['log'] / 'virtlogd.log'}")

    def _create_netns(self) -> None:
        run(["ip", "netns", "add", self.netns])
        run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        log.info("libvirt host %s: created network namespace %s", self.name, self.netns)

    def _start_daemons(self, daemons: Sequence[str] = ("virtlogd", "libvirtd")) -> None:
        for target in LIBVIRT_SYSTEM_DIRS.values():
            # Bind mounts need their mount point; /run/libvirt does not exist where no system libvirtd ever ran.
            target.mkdir(parents=True, exist_ok=True)
        steps = [["mount", "--bind", str(source), str(target)] for target, source in self._bind_mounts().items()]
        # With a root, the binds above stay too: a program of the machine's entering this mount namespace (remote
        # access's sshd and virt-ssh-helper) finds the sockets where it looks for them.
        chroot = [] if self.root is None else ["chroot", str(self.root)]
        if self.root is not None:
            steps += self._root_steps()
        else:
            steps += kvm_as_tcg.mount_steps()
        if "virtlogd" in daemons:
            steps.append([*chroot, "virtlogd", "--daemon", "--config", "/etc/libvirt/virtlogd.conf",
                          "--pid-file", str(self._pid_file("virtlogd"))])
        if "libvirtd" in daemons:
            steps.append([*chroot, "libvirtd", "--daemon", *(["--listen"] if self._listens() else []),
                          "--config", "/etc/libvirt/libvirtd.conf", "--pid-file", str(self._pid_file("libvirtd"))])
        script = " && ".join(shlex.join(step) for step in steps)
        # unshare's default propagation is private: the bind mounts stay inside this host's mount namespace.
        run(["ip", "netns", "exec", self.netns, "unshare", "--mount", "--", "sh", "-ec", script])
        for daemon in daemons:
            log.info("libvirt host %s: started %s (pid %s) in netns %s", self.name, daemon, self._read_pid(daemon), self.netns)

    def _root_steps(self) -> list[list[str]]:
        """What the daemons need inside the root, all mounted in their own mount namespace (it ends with them, so
        nothing stays mounted on the machine or in the root, which several hosts may share): the machine's /dev (with
        /dev/net/tun and /dev/pts), /proc, and the /sys that `ip netns exec` mounted for the namespace (its links,
        and /sys/fs/cgroup); a fresh /run and /tmp; the host's shared folders at their own paths; and the state
        folders over the root's own libvirt folders, as over the machine's outside a root."""
        assert self.root is not None
        root = self.root

        def inside(folder: pathlib.Path) -> str:
            return str(root / folder.relative_to("/"))

        # First the root onto itself: the root of a chroot must be a mount point, or libvirt cannot give each QEMU its
        # own mount namespace ("Failed disable mount propagation out of the root filesystem: Invalid argument").
        steps = [["mount", "--bind", str(root), str(root)]]
        steps += [["mount", "--rbind", folder, inside(pathlib.Path(folder))] for folder in ("/dev", "/proc", "/sys")]
        steps += [["mount", "-t", "tmpfs", "-o", "mode=0755", "capi-libvirt-run", inside(pathlib.Path("/run"))],
                  ["mount", "-t", "tmpfs", "-o", "mode=1777", "capi-libvirt-tmp", inside(pathlib.Path("/tmp"))]]
        for folder in self.root_shared_folders:
            steps += [["mkdir", "-p", str(folder), inside(folder)], ["mount", "--bind", str(folder), inside(folder)]]
        for target, source in self._bind_mounts().items():
            steps += [["mkdir", "-p", inside(target)], ["mount", "--bind", str(source), inside(target)]]
        return steps + kvm_as_tcg.mount_steps(inside)

    def mount_tmpfs(self, folder: pathlib.Path, size_mib: int) -> None:
        """A tmpfs of `size_mib` on `folder`, in the daemons' mount namespace: a folder pool on it is a small pool
        (its capacity exactly that; memory is taken only for what is written). It goes with the namespace.
        With a `root`, `folder` must lie in one of `root_shared_folders`: the tmpfs is mounted on its path in the
        root and bound onto the folder outside the root as well, so both views see the one tmpfs."""
        folder.mkdir(parents=True, exist_ok=True)
        enter = ["nsenter", f"--target={self._read_pid('libvirtd')}", "--mount", "--"]
        target = folder if self.root is None else self.root / folder.resolve().relative_to("/")
        run([*enter, "mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0711", "capi-libvirt-test", str(target)])
        if self.root is not None:
            run([*enter, "mount", "--bind", str(target), str(folder)])

    def kill_and_restart_libvirtd(self) -> tuple[int, int]:
        """SIGKILL libvirtd, as a crash or the OOM killer would end it (guests, dnsmasq and virtlogd live on), and start
        it again in the same namespaces, with the same state folders; returns once it answers. (old pid, new pid)"""
        old = self._read_pid("libvirtd")
        if old is None or process_command(old) != "libvirtd":
            raise LibvirtHostError(f"libvirtd of host {self.name} is not running")
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_alive(old):
            if time.monotonic() > deadline:
                raise LibvirtHostError(f"libvirtd of host {self.name} (pid {old}) survived SIGKILL")
            time.sleep(0.05)
        log.info("libvirt host %s: killed libvirtd (pid %d)", self.name, old)
        self._start_daemons(("libvirtd",))
        self._wait_until_answering()
        new = self._read_pid("libvirtd")
        assert new is not None
        return old, new

    def libvirtd_pid(self) -> int:
        """The running libvirtd's pid (for a test that signals it)."""
        pid = self._read_pid("libvirtd")
        if pid is None or process_command(pid) != "libvirtd":
            raise LibvirtHostError(f"libvirtd of host {self.name} is not running")
        return pid

    @contextlib.contextmanager
    def answering_slowly(self, stopped_s: float, running_s: float) -> Iterator[None]:
        """Inside the block, libvirtd is paused (SIGSTOP) for `stopped_s`, then runs for `running_s`, over and over:
        every call waits for the next run, as on a daemon too busy to answer, while libvirt's keepalive (a ping after
        5 s of silence, the peer dead after three more unanswered) still gets its answers as long as `stopped_s`
        stays well under 20 s. libvirtd runs on when the block ends."""
        pid = self.libvirtd_pid()
        done = threading.Event()

        def pause_now_and_then() -> None:
            while not done.is_set():
                os.kill(pid, signal.SIGSTOP)
                done.wait(stopped_s)
                os.kill(pid, signal.SIGCONT)
                time.sleep(running_s)

        pauser = threading.Thread(target=pause_now_and_then, name=f"pause-{self.name}", daemon=True)
        pauser.start()
        try:
            yield
        finally:
            done.set()
            pauser.join()
            os.kill(pid, signal.SIGCONT)

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            pid = self._read_pid("libvirtd")
            if pid is None or not process_alive(pid):
                raise LibvirtHostError(f"libvirtd of host {self.name} exited; see {self.libvirtd_log}")
            if time.monotonic() > deadline:
                raise LibvirtHostError(f"libvirtd of host {self.name} did not answer within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.2)

    # -- stop, step by step -----------------------------------------------------------------------------------------

    def _answers(self) -> bool:
        if not self.socket_path.is_socket():
            return False
        try:
            with self.connect() as conn:
                conn.getLibVersion()
            return True
        except libvirt.libvirtError:
            return False

    def _destroy_everything_running(self) -> None:
        """Guests first, then networks (their dnsmasq) and pools; a failure is logged, and stop() goes on regardless:
        whatever survives here ends with the namespace's processes."""
        try:
            with self.connect() as conn:
                for domain in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                    log.info("libvirt host %s: destroying domain %s", self.name, domain.name())
                    destroy_quietly(domain)
                for network in conn.listAllNetworks(libvirt.VIR_CONNECT_LIST_NETWORKS_ACTIVE):
                    destroy_quietly(network)
                for pool in conn.listAllStoragePools(libvirt.VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE):
                    destroy_quietly(pool)
        except libvirt.libvirtError as err:
            log.warning("libvirt host %s: could not list what runs: %s", self.name, err)

    def _read_pid(self, daemon: str) -> int | None:
        try:
            return int(self._pid_file(daemon).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _netns_exists(self) -> bool:
        return (pathlib.Path("/run/netns") / self.netns).exists()

    def _netns_pids(self) -> list[int]:
        out = run(["ip", "netns", "pids", self.netns], check=False).stdout
        return [int(pid) for pid in out.split()]

    def _log_tail(self, path: pathlib.Path, lines: int = 20) -> None:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines()[-lines:]:
                log.error("  %s", line)


# -- configuration ------------------------------------------------------------------------------------------------

# QEMU as Debian and Ubuntu package libvirt: as the unprivileged user and group their build sets (user and group
# unset: libvirt-qemu, made by libvirt-daemon-system), with the DAC driver giving it each file a guest uses when the
# guest starts and back to its owner when it stops (dynamic_ownership, remember_owner: libvirt's defaults, spelled
# out). No security_driver is named, as in the packages: libvirtd takes AppArmor where the kernel has it (Ubuntu's),
# and this kernel has none, which is the one difference left (docs/book/src/development/stand-ins.md). No cgroups:
# hosts side by side would share their paths.
QEMU_CONF = """\
dynamic_ownership = 1
remember_owner = 1
cgroup_controllers = [ ]
"""
QEMU_USER = "libvirt-qemu"  # whom QEMU runs as on these hosts, as on Debian's and Ubuntu's


def libvirt_conf(**settings: ConfValue) -> str:
    """libvirt's config syntax, one setting a line: key = "string", key = 1, key = ["a", "b"]."""
    return "".join(f"{key} = {conf_value(value)}\n" for key, value in settings.items())


def conf_value(value: ConfValue) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if '"' in value or "\\" in value or "\n" in value:
            raise LibvirtHostError(f"libvirt config string cannot hold quotes, backslashes or newlines: {value!r}")
        return f'"{value}"'
    return "[" + ", ".join(conf_value(item) for item in value) + "]"


def shared_capabilities_dir(root: pathlib.Path | None = None) -> pathlib.Path:
    """The machine's libvirt's, or a root's own: the files are named by the emulator's path, the same in both, and
    each libvirt would take the other's for stale and probe again."""
    folder = paths.cache_dir() / "libvirt" / "qemu-capabilities"
    return folder if root is None else folder.with_name(f"{folder.name}-{root.name}")


def seed_qemu_capabilities(cache: pathlib.Path, root: pathlib.Path | None = None) -> None:
    """Give a new host the QEMU capabilities an earlier host probed; libvirt re-probes by itself if they are stale."""
    copy_files_atomically(shared_capabilities_dir(root), cache / "qemu" / "capabilities")


def keep_qemu_capabilities(cache: pathlib.Path, root: pathlib.Path | None = None) -> None:
    copy_files_atomically(cache / "qemu" / "capabilities", shared_capabilities_dir(root))


def copy_files_atomically(source: pathlib.Path, target: pathlib.Path) -> None:
    """Copy the files of `source` into `target`, each through a rename, so a host starting meanwhile never reads half."""
    if not source.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file():
            partial = target / f".{file.name}.{os.getpid()}.partial"
            shutil.copyfile(file, partial)
            partial.replace(target / file.name)


def ensure_kvm_device_group() -> None:
    """/dev/kvm root:kvm 0660, as udev would set it: libvirt otherwise re-probes QEMU on every start (seconds each)."""
    kvm = pathlib.Path("/dev/kvm")
    if not kvm.exists():
        return
    mode = stat.S_IMODE(kvm.stat().st_mode)
    try:
        shutil.chown(kvm, group="kvm")
        if mode & 0o060 != 0o060:
            kvm.chmod(mode | 0o060)
    except (LookupError, PermissionError) as err:
        log.warning("cannot give /dev/kvm to group kvm (%s); libvirt will re-probe QEMU at each start", err)


# -- pool and network ---------------------------------------------------------------------------------------------

def dir_pool_xml(name: str, path: pathlib.Path) -> str:
    pool = ET.Element("pool", type="dir")
    ET.SubElement(pool, "name").text = name
    target = ET.SubElement(pool, "target")
    ET.SubElement(target, "path").text = str(path)
    return ET.tostring(pool, encoding="unicode")


DNSMASQ_NS = "http://libvirt.org/schemas/network/dnsmasq/1.0"


def nat_network_xml(name: str, subnet: ipaddress.IPv4Network, bridge: str = "virbr0",
                    dnsmasq_options: Sequence[str] = (), dhcp_reserved: int = 0) -> str:
    """NAT network with DHCP over the whole subnet but the bridge's own (first) address and its last `dhcp_reserved`
    ones; one bridge per namespace. `dnsmasq_options` go to its dnsmasq as they are (libvirt's dnsmasq namespace),
    e.g. `no-ping`."""
    hosts = list(subnet.hosts())[:len(list(subnet.hosts())) - dhcp_reserved]
    network = ET.Element("network")
    ET.SubElement(network, "name").text = name
    ET.SubElement(network, "forward", mode="nat")
    ET.SubElement(network, "bridge", name=bridge, stp="on", delay="0")
    ip = ET.SubElement(network, "ip", address=str(hosts[0]), netmask=str(subnet.netmask))
    dhcp = ET.SubElement(ip, "dhcp")
    ET.SubElement(dhcp, "range", start=str(hosts[1]), end=str(hosts[-1]))
    if dnsmasq_options:
        options = ET.SubElement(network, f"{{{DNSMASQ_NS}}}options")
        for option in dnsmasq_options:
            ET.SubElement(options, f"{{{DNSMASQ_NS}}}option", value=option)
    return ET.tostring(network, encoding="unicode")


def isolated_network_xml(name: str, subnet: ipaddress.IPv4Network, bridge: str) -> str:
    """An isolated network WITHOUT DHCP: the bridge takes the subnet's first address, guests only have the addresses
    they are given (static addressing, an IP pool's). No forwarding, no NAT."""
    network = ET.Element("network")
    ET.SubElement(network, "name").text = name
    ET.SubElement(network, "bridge", name=bridge, stp="on", delay="0")
    ET.SubElement(network, "ip", address=str(next(subnet.hosts())), netmask=str(subnet.netmask))
    return ET.tostring(network, encoding="unicode")


def define_dir_pool(conn: libvirt.virConnect, name: str, path: pathlib.Path) -> libvirt.virStoragePool:
    pool = conn.storagePoolDefineXML(dir_pool_xml(name, path), 0)
    pool.build(0)
    pool.create(0)
    return pool


def define_nat_network(conn: libvirt.virConnect, name: str, subnet: ipaddress.IPv4Network,
                       dnsmasq_options: Sequence[str] = (), dhcp_reserved: int = 0) -> libvirt.virNetwork:
    network = conn.networkDefineXML(nat_network_xml(name, subnet, dnsmasq_options=dnsmasq_options,
                                                    dhcp_reserved=dhcp_reserved))
    network.create()
    return network


def destroy_quietly(thing: libvirt.virDomain | libvirt.virNetwork | libvirt.virStoragePool) -> None:
    try:
        thing.destroy()
    except libvirt.libvirtError as err:
        log.warning("could not destroy %s: %s", thing.name(), err)


# -- processes ----------------------------------------------------------------------------------------------------

def run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise LibvirtHostError(f"{shlex.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def process_alive(pid: int) -> bool:
    """True while the process runs; a zombie (this machine's init may never reap it) counts as ended."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def process_command(pid: int) -> str | None:
    try:
        return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return None


def terminate(pid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL if the process is still there after `grace_s`; returns once it has ended."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while process_alive(pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        else:
            return
    log.warning("process %d survived SIGKILL", pid)
