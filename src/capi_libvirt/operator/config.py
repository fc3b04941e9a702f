"""The operator's configuration: which libvirt hosts it manages, from the command line or the environment."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

HOST_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label, as status.host and providerIDs take
HOSTS_ENV = "CAPI_LIBVIRT_HOSTS"  # "name=uri,name=uri"
CRASH_AFTER_ENV = "CAPI_LIBVIRT_CRASH_AFTER"  # tests only: end the process right after this reconcile phase
CRASH_EXIT_CODE = 70


from capi_libvirt.core.outage import DEFAULT_REPLACE_AFTER_S
from capi_libvirt.core.placement import DEFAULT_CREATES_PER_HOST

DEFAULT_PROBE_INTERVAL_S = 30.0  # = reconcile.inventory.PROBE_INTERVAL_S; not imported: `--help` needs no libvirt

DEFAULT_WORKERS = 16  # machine reconciles at once (each mostly waits on libvirt or the API)


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    hosts: dict[str, str]  # host name (as in providerIDs) -> libvirt URI
    crash_after: str | None = None  # fault injection: the phase after which the process dies, as a crash would
    workers: int = DEFAULT_WORKERS
    creates_per_host: int = DEFAULT_CREATES_PER_HOST
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S  # how often every host is probed
    replace_after_s: float = DEFAULT_REPLACE_AFTER_S  # an unreachable host's machines with no domain move after this

    def after_phase(self, phase: str) -> None:
        if phase == self.crash_after:
            os._exit(CRASH_EXIT_CODE)  # no cleanup, no finally: what a SIGKILL or an OOM kill leaves behind


def parse_hosts(entries: list[str]) -> dict[str, str]:
    """`name=uri` entries; the name must be a DNS label, since it goes into providerIDs."""
    hosts: dict[str, str] = {}
    for entry in entries:
        name, sep, uri = entry.partition("=")
        if not sep or not uri:
            raise ValueError(f"host entry {entry!r}: expected name=uri")
        if not HOST_NAME.match(name):
            raise ValueError(f"host name {name!r}: must be a lowercase DNS label")
        hosts[name] = uri
    return hosts


def from_environment(extra_hosts: Sequence[str] = (), *, workers: int = DEFAULT_WORKERS,
                     creates_per_host: int = DEFAULT_CREATES_PER_HOST,
                     probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                     replace_after_s: float = DEFAULT_REPLACE_AFTER_S) -> OperatorConfig:
    entries = [e for e in os.environ.get(HOSTS_ENV, "").split(",") if e.strip()] + list(extra_hosts)
    return OperatorConfig(hosts=parse_hosts([e.strip() for e in entries]),
                          crash_after=os.environ.get(CRASH_AFTER_ENV) or None, workers=workers,
                          creates_per_host=creates_per_host, probe_interval_s=probe_interval_s,
                          replace_after_s=replace_after_s)
