"""A LAN on a test libvirt host as a typical Ubuntu KVM host has one: a plain Linux bridge, no libvirt network.

BridgedLan takes a started LibvirtHost (best made with `network_name=None`, so libvirt runs no network and no DHCP of
its own) and, in the host's network namespace, adds a Linux bridge (`br0`) carrying the host's own address on the LAN
(the subnet's first address), as netplan or ifupdown would set it up. Guests attach to it with
`<interface type='bridge'>`: libvirt only plugs their tap devices in, and knows no lease of theirs.

With `dhcp=True` the LAN also gets its DHCP server: a dnsmasq in the host's namespace, DHCP only (no DNS), serving
the bridge alone from `.100` to `.199` (addresses below `.100` are free for static use), its leases in a file of its
own (`lease_file`, dnsmasq's format: expiry, MAC, address, hostname, client ID). That is the router's or the site's
DHCP server of a real LAN, not libvirt's: a guest leasing from it is found by the guest agent or the host's ARP table,
never by libvirt's lease source.

stop() ends dnsmasq by PID and deletes the bridge; the host's own stop() removes the namespace with anything left.
"""

from __future__ import annotations

import ipaddress
import logging
import pathlib
import subprocess
import time
from types import TracebackType

from devenv.libvirt_host import LibvirtHost, LibvirtHostError, process_alive, run, terminate

log = logging.getLogger(__name__)

DHCP_FIRST, DHCP_LAST = 100, 199  # host numbers of the dynamic range; the rest of the subnet is for static addresses
DHCP_LEASE_TIME = "1h"
DNSMASQ_START_TIMEOUT_S = 10.0


class BridgedLan:
    """A Linux bridge with the host's address in `host`'s network namespace, and optionally the LAN's DHCP server."""

    def __init__(self, host: LibvirtHost, subnet: str, *, bridge: str = "br0", dhcp: bool = True) -> None:
        self.host = host
        self.subnet = ipaddress.IPv4Network(subnet)
        self.bridge = bridge
        self.dhcp = dhcp
        self.address = next(self.subnet.hosts())  # the host's own address on the LAN
        self.folder = host.state_dir / f"lan-{bridge}"
        self._dnsmasq: subprocess.Popen[bytes] | None = None

    # -- where things are -------------------------------------------------------------------------------------------

    @property
    def netns(self) -> str:
        return self.host.netns

    @property
    def lease_file(self) -> pathlib.Path:
        return self.folder / "dnsmasq.leases"

    @property
    def dnsmasq_log(self) -> pathlib.Path:
        return self.host.log_dir / f"dnsmasq-{self.bridge}.log"

    def dhcp_range(self) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
        base = int(self.subnet.network_address)
        return ipaddress.IPv4Address(base + DHCP_FIRST), ipaddress.IPv4Address(base + DHCP_LAST)

    # -- life cycle -------------------------------------------------------------------------------------------------

    def __enter__(self) -> BridgedLan:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """The bridge (STP off, no forward delay: ports forward at once), its address, then dnsmasq."""
        try:
            self._ip("link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
            self._ip("address", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            if self.dhcp:
                self._start_dnsmasq()
        except BaseException:
            self.stop()
            raise
        log.info("LAN %s on host %s: bridge %s at %s%s", self.subnet, self.host.name, self.bridge, self.address,
                 f", DHCP {'-'.join(map(str, self.dhcp_range()))}" if self.dhcp else "")

    def stop(self) -> None:
        """dnsmasq by PID, then the bridge; harmless when repeated, or when the namespace is gone already."""
        if self._dnsmasq is not None:
            terminate(self._dnsmasq.pid)
            self._dnsmasq.wait()
            log.info("LAN %s: dnsmasq (pid %d) stopped", self.subnet, self._dnsmasq.pid)
            self._dnsmasq = None
        if (pathlib.Path("/run/netns") / self.netns).exists():
            run(["ip", "-n", self.netns, "link", "delete", self.bridge], check=False)

    def _start_dnsmasq(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.host.log_dir.mkdir(parents=True, exist_ok=True)
        first, last = self.dhcp_range()
        argv = ["ip", "netns", "exec", self.netns, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
                "--port=0",  # DHCP only: no DNS server
                f"--interface={self.bridge}", "--bind-interfaces", "--except-interface=lo",
                f"--dhcp-range={first},{last},{self.subnet.netmask},{DHCP_LEASE_TIME}", "--dhcp-authoritative",
                f"--dhcp-leasefile={self.lease_file}", "--no-ping",  # as the bench does: no 3 s wait per offer
                "--user=root", f"--log-facility={self.dnsmasq_log}", "--log-dhcp"]
        # `ip netns exec` execs dnsmasq: the child's PID is dnsmasq's own.
        self._dnsmasq = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + DNSMASQ_START_TIMEOUT_S
        while not self.lease_file.exists():  # dnsmasq creates it once it runs
            if not process_alive(self._dnsmasq.pid) or time.monotonic() > deadline:
                raise LibvirtHostError(f"dnsmasq on {self.bridge} of host {self.host.name} did not start; see "
                                       f"{self.dnsmasq_log}")
            time.sleep(0.05)

    def _ip(self, *args: str) -> None:
        run(["ip", "-n", self.netns, *args])

    # -- what a test looks at ---------------------------------------------------------------------------------------

    def leases(self) -> dict[str, str]:
        """MAC (lower case) -> IPv4 address of every lease dnsmasq has given (its lease file)."""
        leases = {}
        text = self.lease_file.read_text() if self.lease_file.exists() else ""
        for line in text.splitlines():
            fields = line.split()
            if len(fields) >= 3 and ":" in fields[1]:
                leases[fields[1].lower()] = fields[2]
        return leases

    def ping(self, address: str) -> bool:
        """One ping from the host's namespace (a LAN address: never sent from the machine's own namespace)."""
        if ipaddress.IPv4Address(address) not in self.subnet:
            raise LibvirtHostError(f"{address} is not on the LAN {self.subnet}")
        return run(["ip", "netns", "exec", self.netns, "ping", "-c", "1", "-W", "1", "-n", "-q", address],
                   check=False).returncode == 0

    def neighbours(self) -> dict[str, str]:
        """The host's neighbour (ARP) table on the bridge: IPv4 address -> MAC, entries that have a MAC."""
        out = run(["ip", "-n", self.netns, "-4", "neigh", "show", "dev", self.bridge]).stdout
        table = {}
        for line in out.splitlines():
            fields = line.split()
            if "lladdr" in fields:
                table[fields[0]] = fields[fields.index("lladdr") + 1].lower()
        return table

    def flush_neighbours(self) -> None:
        """Forget every neighbour the host learnt on the bridge (`ip neigh flush`), as entries age out."""
        run(["ip", "-n", self.netns, "neigh", "flush", "dev", self.bridge])
