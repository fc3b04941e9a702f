"""The libvirt connections of a host: opened lazily, reused, kept alive, and re-opened when they break.

libvirt's C calls never yield to the event loop, so every call runs in a thread pool of its host's own: a slow or
hung host cannot take the threads other hosts need. Each of the pool's THREADS_PER_HOST threads has a connection of
its own, so no two calls ever run on one connection: libvirt 9.0's client crashed the process (SIGSEGV in its RPC
event loop) when a keepalive timeout closed a connection that two threads were waiting on, and again on the next
connection (a host cut off by a link going down; hack/libvirt-keepalive-crash.py reproduces it). A connection is
closed only by its own thread, never under another thread's call. libvirt's default event loop runs in a thread of
its own, which is what lets connections send keepalives and notice a dead peer instead of hanging on it; libvirt
tells each connection's death (keepalive, end of file, error) through its close callback, so `connected` says whether
the host has a live connection without a call on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import libvirt

from capi_libvirt.hypervisor import credentials as creds
from capi_libvirt.hypervisor import errors

log = logging.getLogger(__name__)
T = TypeVar("T")
# (operation: the hypervisor function's name, seconds, succeeded), once per call; from the host's threads.
CallObserver = Callable[[str, float, bool], None]

KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 5, 3  # a peer silent for interval x (count + 1) = 20 s counts as dead
THREADS_PER_HOST = 4
_CLOSE_REASONS = {libvirt.VIR_CONNECT_CLOSE_REASON_ERROR: "transport error",
                  libvirt.VIR_CONNECT_CLOSE_REASON_EOF: "end of file",
                  libvirt.VIR_CONNECT_CLOSE_REASON_KEEPALIVE: "keepalive: the peer stopped answering",
                  libvirt.VIR_CONNECT_CLOSE_REASON_CLIENT: "closed by this client"}


def _silence_libvirt_stderr(_ctx: object, _error: object) -> None:
    """libvirt prints every error to stderr by default; errors reach us as exceptions, translated in one place."""


libvirt.registerErrorHandler(_silence_libvirt_stderr, None)
_event_loop_started = threading.Lock()
_event_loop_running = False


def ensure_libvirt_event_loop() -> None:
    """Start libvirt's default event loop once per process (keepalives need it)."""
    global _event_loop_running
    with _event_loop_started:
        if _event_loop_running:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _event_loop_running = True


class HostConnection:
    """A host's libvirt connections. `await call(fn, ...)` runs `fn(conn, ...)` in the host's pool with a live one."""

    def __init__(self, host: str, uri: str, credentials: creds.Credentials | None = None,
                 observe: CallObserver | None = None) -> None:
        self.host = host
        self.uri = uri
        self.credentials = credentials
        self.observe = observe
        self._executor = concurrent.futures.ThreadPoolExecutor(THREADS_PER_HOST, thread_name_prefix=f"libvirt-{host}")
        # Long transfers (image imports: minutes of streaming) get a thread and a connection of their own, so they never
        # hold the pool's threads that machine operations need; imports on one host run one after the other.
        self._transfers = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"libvirt-{host}-transfer")
        self._local = threading.local()  # .conn: the calling pool thread's connection
        self._lock = threading.Lock()  # guards _open and the counters
        self._open: set[libvirt.virConnect] = set()
        self._lost: set[libvirt.virConnect] = set()  # of _open: closed by libvirt (keepalive, EOF), not yet dropped
        self.opened = 0  # connections opened: at most THREADS_PER_HOST in a healthy life
        self.calls = 0  # operations run on the host (each one or a few libvirt API calls), for the numbers (docs/book/src/development/numbers.md)

    @property
    def connected(self) -> bool:
        """Whether a connection to the host is open and alive: opened, and not closed since by libvirt (its
        keepalive found the peer silent, the transport ended) or by a transport error."""
        with self._lock:
            return bool(self._open - self._lost)

    async def call(self, fn: Callable[..., T], *args: object, doing: str = "", transfer: bool = False) -> T:
        """`fn(conn, *args)` in the host's pool (`transfer`: in its transfer thread, for long streams)."""
        self.calls += 1
        loop = asyncio.get_running_loop()
        executor = self._transfers if transfer else self._executor
        return await loop.run_in_executor(executor, functools.partial(self._call_sync, fn, args, doing))

    def _call_sync(self, fn: Callable[..., T], args: tuple[object, ...], doing: str) -> T:
        """`fn` on this thread's connection, its libvirt errors translated; its duration and outcome observed."""
        started, ok = time.monotonic(), False
        try:
            result = self._translated(fn, args, doing)
            ok = True
            return result
        finally:
            if self.observe is not None:
                self.observe(getattr(fn, "__name__", "call"), time.monotonic() - started, ok)

    def _translated(self, fn: Callable[..., T], args: tuple[object, ...], doing: str) -> T:
        conn = self._live_connection()
        try:
            return fn(conn, *args)
        except libvirt.libvirtError as error:
            translated = errors.translate(error, self.host, doing or getattr(fn, "__name__", "call"))
            if isinstance(translated, errors.HostUnreachable):
                log.warning("host %s: %s; closing that connection", self.host, translated.message)
                self._drop(conn)
            raise translated from None
        except errors.HypervisorError as error:
            error.host = error.host or self.host
            raise

    def _live_connection(self) -> libvirt.virConnect:
        """This thread's connection, opened when it has none or it broke."""
        conn: libvirt.virConnect | None = getattr(self._local, "conn", None)
        if conn is not None:
            try:
                if conn.isAlive():
                    return conn
            except libvirt.libvirtError:
                pass
            log.warning("connection to host %s broke; re-opening", self.host)
            self._drop(conn)
        try:
            with creds.materialized(self.uri, self.credentials) as uri:
                conn = libvirt.open(uri)
        except libvirt.libvirtError as error:
            reason = errors.translate(error, self.host, "connect")
            raise errors.HostUnreachable(reason.message, self.host) from None
        except creds.CredentialsError as error:
            raise errors.HostUnreachable(str(error), self.host) from None
        try:
            conn.setKeepAlive(KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT)
        except libvirt.libvirtError:
            pass  # local (unix socket) drivers without keepalive support: nothing to detect there
        with self._lock:  # open before its close callback can fire
            self._open.add(conn)
            self.opened += 1
        try:
            conn.registerCloseCallback(self._closed_by_libvirt, conn)  # the opaque: this very connection
        except libvirt.libvirtError:
            pass  # a driver without close callbacks: a dead connection is found by its next call
        self._local.conn = conn
        log.info("connected to host %s", self.host)
        return conn

    def _closed_by_libvirt(self, _conn: object, reason: int, conn: libvirt.virConnect) -> None:
        """libvirt's close callback (from its event loop's thread): the connection is dead; its thread drops it."""
        with self._lock:
            if conn in self._open:
                self._lost.add(conn)
        log.warning("host %s: libvirt closed a connection (reason %d: %s)", self.host, reason,
                    _CLOSE_REASONS.get(reason, "unknown"))

    def _drop(self, conn: libvirt.virConnect) -> None:
        """Close this thread's broken connection (no other thread ever uses it)."""
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)
            self._lost.discard(conn)
        self._close_quietly(conn)

    @staticmethod
    def _close_quietly(conn: libvirt.virConnect) -> None:
        with contextlib.suppress(libvirt.libvirtError):
            conn.unregisterCloseCallback()
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()

    def close(self) -> None:
        """Blocking: call it from a thread (the operator's cleanup does), once no call runs any more."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._transfers.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            connections, self._open, self._lost = list(self._open), set(), set()
        for conn in connections:
            self._close_quietly(conn)

