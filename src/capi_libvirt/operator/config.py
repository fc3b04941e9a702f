"""The operator's configuration: which libvirt hosts it manages, from the command line or the environment."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

from capi_libvirt.core.placement import DEFAULT_CREATES_PER_HOST

HOST_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label, as status.host and providerIDs take
HOSTS_ENV = "CAPI_LIBVIRT_HOSTS"  # "name=uri,name=uri"
DEFAULT_WORKERS = 16  # machine reconciles at once (each mostly waits on libvirt or the API)


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    hosts: dict[str, str]  # host name (as in providerIDs) -> libvirt URI
    workers: int = DEFAULT_WORKERS
    creates_per_host: int = DEFAULT_CREATES_PER_HOST


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
                     creates_per_host: int = DEFAULT_CREATES_PER_HOST) -> OperatorConfig:
    entries = [e for e in os.environ.get(HOSTS_ENV, "").split(",") if e.strip()] + list(extra_hosts)
    return OperatorConfig(hosts=parse_hosts([e.strip() for e in entries]),
                          workers=workers, creates_per_host=creates_per_host)
