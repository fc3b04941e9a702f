"""The test API server, reachable from a libvirt host's guests through that host's network namespace only.

The local kube-apiserver listens on 127.0.0.1 of the machine's own network namespace, which guests cannot reach.
ApiGateway is a TCP forwarder whose listening socket is made INSIDE the libvirt host's namespace (on the NAT
network's bridge address, port 6443 by default): a short-lived thread enters the namespace with setns(2), creates and
binds the socket there and ends, and a socket keeps the namespace it was made in for life. The accepted connections
are relayed, from ordinary threads of this process, to the API server's loopback address. So:

- nothing listens on a private address in the machine's own namespace (`ss -ltn` there shows no trace of it);
- this process never sends a packet to a private address: its one outgoing connection is to loopback;
- a guest reaches the API server only while the gateway runs; the namespace has no other way out.

TLS is not terminated here: bytes are relayed as they are, and the guest verifies the API server's own certificate
against the cluster CA, for the gateway's address (in the certificate's SAN: the control plane's `serving_addresses`).

EndpointRelay is the other way round, for a workload cluster whose API server runs on guests behind a virtual IP: the
management side (Cluster API's managers, the tests) connects to that address in the machine's own namespace, where it
is a /32 on `lo` (devenv.service_address: an address of the benchmarking range, never a private one), and each
connection is relayed to the same address and port inside the libvirt host's namespace, from a socket made there. So
the `<cluster>-kubeconfig` Cluster API writes (server: the control-plane endpoint) works unchanged from the management
side, and TLS is verified for the endpoint's own address.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import socket
import threading
import urllib.parse
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from devenv.control_plane import LocalControlPlane
from devenv.libvirt_host import LibvirtHost
from devenv.service_address import ServiceAddress

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R", bound="TcpRelay")

CLONE_NEWNET = 0x40000000  # <sched.h>; os.setns exists only from Python 3.12
DEFAULT_PORT = 6443
ACCEPT_POLL_S = 0.25  # how often the accept loop looks at the stop flag
RELAY_CHUNK = 65536
# The network rule's ranges (RFC 1918), which this machine's own namespace never sends to. (ipaddress's is_private
# also covers the benchmarking range 198.18.0.0/15 the test bed uses for addresses it puts on `lo`.)
PRIVATE_RANGES = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


class ApiGatewayError(RuntimeError):
    pass


class TcpRelay:
    """Accepts on a listening socket and relays each connection to a new upstream one, a thread per direction.
    Subclasses say where it listens (`_listen`) and how an upstream connection is made (`_connect`)."""

    label = "relay"

    def __init__(self) -> None:
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.connections = 0  # accepted so far

    def _listen(self) -> socket.socket:
        raise NotImplementedError

    def _connect(self) -> socket.socket:
        raise NotImplementedError

    def __enter__(self: R) -> R:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Bind the listening socket and start accepting."""
        self._listener = self._listen()
        self._listener.settimeout(ACCEPT_POLL_S)
        self._spawn(self._accept_loop, "accept")

    def stop(self) -> None:
        """Stop accepting, cut every relayed connection and wait for the threads."""
        self._stopping.set()
        for thread in self._threads[:1]:  # the accept loop: no new connection after it
            thread.join(timeout=10)
        with self._lock:
            for sock in self._open:
                shutdown_quietly(sock)
        for thread in self._threads[1:]:
            thread.join(timeout=10)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        log.info("%s stopped after %d connections", self.label, self.connections)

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        """A thread of the gateway; the first one spawned is the accept loop, kept first (finished ones are dropped)."""
        thread = threading.Thread(target=target, args=args, name=f"{self.label}-{name}", daemon=True)
        self._threads = self._threads[:1] + [t for t in self._threads[1:] if t.is_alive()] + [thread]
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if not self._stopping.is_set():
                    log.warning("%s: accept failed: %s", self.label, error)
                return
            self.connections += 1
            self._spawn(self._connect_and_relay, "conn", client, peer)

    def _connect_and_relay(self, client: socket.socket, peer: tuple[str, int]) -> None:
        """One connection: open the upstream one, then relay both ways until both sides are done."""
        client.settimeout(None)
        self._track(client)
        try:
            upstream = self._connect()
        except OSError as error:
            log.warning("%s: %s:%d -> upstream failed: %s", self.label, *peer, error)
            self._untrack(client)
            return
        upstream.settimeout(None)
        self._track(upstream)
        log.debug("%s: relaying %s:%d", self.label, *peer)
        back = threading.Thread(target=relay, args=(upstream, client), name=f"{self.label}-back", daemon=True)
        back.start()
        relay(client, upstream)
        back.join()
        self._untrack(client)
        self._untrack(upstream)

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)
        if self._stopping.is_set():
            shutdown_quietly(sock)

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        sock.close()


class ApiGateway(TcpRelay):
    """Forwards <bridge address>:<port> inside `host`'s network namespace to the control plane's loopback port.

    Use as a context manager; `url` is what a guest of the host connects to."""

    label = "api-gateway"

    def __init__(self, host: LibvirtHost, control_plane: LocalControlPlane, port: int = DEFAULT_PORT) -> None:
        super().__init__()
        self.netns = host.netns
        self.address = host.bridge_address
        self.port = port
        self.upstream = loopback_endpoint(control_plane.server)

    @property
    def url(self) -> str:
        """The API server as the host's guests reach it (an address in the host's namespace)."""
        return f"https://{self.address}:{self.port}"

    def _listen(self) -> socket.socket:
        listener = in_netns(self.netns, lambda: listening_socket(str(self.address), self.port))
        log.info("API gateway: %s in netns %s -> %s:%d", self.url, self.netns, *self.upstream)
        return listener

    def _connect(self) -> socket.socket:
        return socket.create_connection(self.upstream, timeout=10)


class EndpointRelay(TcpRelay):
    """`address`:`port` in this machine's namespace (the address a /32 on `lo` while started) relayed to the same
    endpoint inside `host`'s network namespace: a workload cluster's control-plane endpoint, held by its guests."""

    label = "endpoint-relay"

    def __init__(self, host: LibvirtHost, address: str, port: int = DEFAULT_PORT) -> None:
        super().__init__()
        if any(ipaddress.ip_address(address) in network for network in PRIVATE_RANGES):
            raise ApiGatewayError(f"{address} is a private address: the machine's own namespace never sends to one")
        self.netns, self.address, self.port = host.netns, address, port
        self._local = ServiceAddress(address)

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    def _listen(self) -> socket.socket:
        self._local.start()
        try:
            listener = listening_socket(self.address, self.port)
        except OSError:
            self._local.stop()
            raise
        log.info("endpoint relay: %s here -> the same in netns %s", self.url, self.netns)
        return listener

    def _connect(self) -> socket.socket:
        return in_netns(self.netns, lambda: socket.create_connection((self.address, self.port), timeout=10))

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self._local.stop()


def loopback_endpoint(server: str) -> tuple[str, int]:
    """(host, port) of an https:// server URL; refused unless the host is a loopback address (the network rule)."""
    url = urllib.parse.urlsplit(server)
    if url.hostname is None or url.port is None or not ipaddress.ip_address(url.hostname).is_loopback:
        raise ApiGatewayError(f"the gateway forwards to a loopback address only, not {server}")
    return url.hostname, url.port


def listening_socket(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


def in_netns(netns: str, make: Callable[[], T]) -> T:
    """make() run by a thread that has entered network namespace `netns` (named by `ip netns`), then ends.

    setns(2) with CLONE_NEWNET moves only the calling thread, so the rest of the process stays where it is; sockets
    made by make() belong to `netns` for good."""
    outcome: dict[str, object] = {}

    def enter_and_make() -> None:
        try:
            setns_net(f"/run/netns/{netns}")
            outcome["value"] = make()
        except BaseException as error:  # handed to the caller
            outcome["error"] = error

    thread = threading.Thread(target=enter_and_make, name=f"netns-{netns}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def setns_net(path: str) -> None:
    """Move the calling thread into the network namespace bound at `path`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def relay(source: socket.socket, target: socket.socket) -> None:
    """Copy until `source` ends (or either side breaks), then tell `target` that no more is coming."""
    try:
        while chunk := source.recv(RELAY_CHUNK):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def shutdown_quietly(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
