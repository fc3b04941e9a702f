"""What a libvirt host's domains went through, as libvirt itself reports it: its lifecycle events (defined, undefined,
started, stopped, ...), recorded from a connection of the test's own while the context runs; and a host's state as
tests compare it (every provider domain's name, libvirt ID and state; the pool's volumes but base images)."""

from __future__ import annotations

import threading
from types import TracebackType

import libvirt

from capi_libvirt.core import domain_xml
from capi_libvirt.hypervisor.connection import ensure_libvirt_event_loop
from devenv import base_image
from guests import refreshed_pool

LIFECYCLE = {libvirt.VIR_DOMAIN_EVENT_DEFINED: "DEFINED", libvirt.VIR_DOMAIN_EVENT_UNDEFINED: "UNDEFINED",
             libvirt.VIR_DOMAIN_EVENT_STARTED: "STARTED", libvirt.VIR_DOMAIN_EVENT_SUSPENDED: "SUSPENDED",
             libvirt.VIR_DOMAIN_EVENT_RESUMED: "RESUMED", libvirt.VIR_DOMAIN_EVENT_STOPPED: "STOPPED",
             libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: "SHUTDOWN", libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED: "PMSUSPENDED",
             libvirt.VIR_DOMAIN_EVENT_CRASHED: "CRASHED"}


class DomainEvents:
    """Every lifecycle event of every domain of the host at `uri`, as (domain UUID, event name), in order."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._lock = threading.Lock()
        self._events: list[tuple[str, str]] = []
        self._conn: libvirt.virConnect | None = None
        self._callback = -1

    @property
    def events(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._events)

    def _record(self, _conn: libvirt.virConnect, domain: libvirt.virDomain, event: int, _detail: int,
                _opaque: object) -> None:
        with self._lock:
            self._events.append((domain.UUIDString(), LIFECYCLE.get(event, str(event))))

    def __enter__(self) -> DomainEvents:
        ensure_libvirt_event_loop()  # events are dispatched by libvirt's default event loop
        self._conn = libvirt.open(self.uri)
        self._callback = self._conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                                           self._record, None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._conn is not None:
            self._conn.domainEventDeregisterAny(self._callback)
            self._conn.close()
            self._conn = None


def host_state(host) -> dict:
    """{"domains": {UUID: (name, libvirt ID, state)} of the provider's domains, "volumes": the pool's volumes but base
    images}: a domain restarted gets another ID, a redefined one another UUID or name."""
    with host.connect() as conn:
        domains = {d.UUIDString(): (d.name(), d.ID(), d.state()[0]) for d in conn.listAllDomains()
                   if domain_xml.parse_owner(d.XMLDesc(0)) is not None}
        volumes = sorted(v for v in refreshed_pool(conn, host.pool_name).listVolumes()
                         if not base_image.is_base_volume(v))
    return {"domains": domains, "volumes": volumes}


def owner_of(host, uuid_: str) -> domain_xml.Owner | None:
    """The provider's owner metadata of the domain `uuid_` (namespace, name, UID, management cluster)."""
    with host.connect() as conn:
        return domain_xml.parse_owner(conn.lookupByUUIDString(uuid_).XMLDesc(0))
