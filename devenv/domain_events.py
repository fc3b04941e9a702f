"""What a libvirt host's domains went through, as libvirt itself reports it, seen as it happens: a lifecycle event
callback on a connection of its own, re-opened whenever the daemon goes away (a killed and restarted libvirtd). Tests
use it to prove no domain was ever defined twice (tests/e2e/test_chaos.py) and that nothing happened to a domain at
all (tests/e2e/test_clusterctl_move.py).

libvirt sends VIR_DOMAIN_EVENT_DEFINED for each defineXML: detail ADDED for a new domain, UPDATED for a definition
replacing an existing one. Either way, more than one for a UUID means it was defined twice (a second define of a
live domain, or a domain undefined and defined again). While the connection is down no event can be seen; the
window is counted (`reconnects`) and, on reconnecting, domains present but never seen defined are recorded
(`seen_by_listing`), so nothing goes unaccounted.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import libvirt

from capi_libvirt.hypervisor import connection

log = logging.getLogger(__name__)


LIFECYCLE = {libvirt.VIR_DOMAIN_EVENT_DEFINED: "DEFINED", libvirt.VIR_DOMAIN_EVENT_UNDEFINED: "UNDEFINED",
             libvirt.VIR_DOMAIN_EVENT_STARTED: "STARTED", libvirt.VIR_DOMAIN_EVENT_SUSPENDED: "SUSPENDED",
             libvirt.VIR_DOMAIN_EVENT_RESUMED: "RESUMED", libvirt.VIR_DOMAIN_EVENT_STOPPED: "STOPPED",
             libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: "SHUTDOWN", libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED: "PMSUSPENDED",
             libvirt.VIR_DOMAIN_EVENT_CRASHED: "CRASHED"}


class DomainEvents:
    """Every lifecycle event on `uri` between start() and stop() (or the `with` block), in order, as (domain UUID,
    event name); `defined` counts DEFINED events per UUID."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.defined: collections.Counter[str] = collections.Counter()
        self._events: list[tuple[str, str]] = []
        self.seen_by_listing: set[str] = set()
        self.reconnects = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="domain-events", daemon=True)

    def start(self, timeout: float = 30.0) -> DomainEvents:
        connection.ensure_libvirt_event_loop()  # callbacks are dispatched by libvirt's event loop thread
        self._thread.start()
        if not self._connected.wait(timeout):
            raise RuntimeError(f"could not watch domain events on {self.uri}")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> DomainEvents:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def events(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._events)

    def duplicates(self) -> dict[str, int]:
        with self._lock:
            return {uuid: count for uuid, count in self.defined.items() if count > 1}

    def _on_lifecycle(self, _conn: libvirt.virConnect, domain: libvirt.virDomain, event: int, _detail: int,
                      _opaque: object) -> None:
        uuid = domain.UUIDString()
        with self._lock:
            self._events.append((uuid, LIFECYCLE.get(event, str(event))))
            if event == libvirt.VIR_DOMAIN_EVENT_DEFINED:
                self.defined[uuid] += 1

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                conn = libvirt.open(self.uri)
            except libvirt.libvirtError:
                time.sleep(0.05)
                continue
            try:
                conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._on_lifecycle, None)
                listed = {domain.UUIDString() for domain in conn.listAllDomains()}
                with self._lock:
                    self.seen_by_listing |= {uuid for uuid in listed if uuid not in self.defined}
                if not first:
                    self.reconnects += 1
                    log.info("domain event watch on %s re-opened", self.uri)
                first = False
                self._connected.set()
                while not self._stop.is_set() and conn.isAlive():
                    time.sleep(0.05)
            except libvirt.libvirtError:
                pass
            finally:
                try:
                    conn.close()
                except libvirt.libvirtError:
                    pass
