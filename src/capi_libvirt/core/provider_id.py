"""The provider ID `libvirt://<host>/<domain-uuid>`: how Cluster API matches a Machine to its Node and its domain.

The same string is written to LibvirtMachine.spec.providerID and, through the NoCloud meta-data, to the kubelet's
--provider-id, and Cluster API compares the two as plain strings. So both directions are strict: one canonical form
(lowercase host, lowercase hyphenated UUID, nothing else), and anything else is refused with a message saying why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEME = "libvirt://"
MAX_LENGTH = 512  # spec.providerID's maxLength in the CRD

# A DNS-1123 subdomain: what host names are in this project (spec.host is a label, a subdomain is allowed too).
_HOST = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HOST_MAX = 253
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class ProviderID:
    """A parsed provider ID: the host the domain lives on and the domain's UUID."""

    host: str
    domain_uuid: str

    def __str__(self) -> str:
        return format_provider_id(self.host, self.domain_uuid)


def format_provider_id(host: str, domain_uuid: str) -> str:
    """`libvirt://<host>/<domain-uuid>`; ValueError when the host or the UUID is not in canonical form."""
    _check_host(host)
    _check_uuid(domain_uuid)
    return f"{SCHEME}{host}/{domain_uuid}"


def parse_provider_id(provider_id: str) -> ProviderID:
    """The host and domain UUID of a provider ID; ValueError naming what is wrong with anything malformed."""
    if not isinstance(provider_id, str):
        raise ValueError(f"provider ID must be a string, not {type(provider_id).__name__}")
    if len(provider_id) > MAX_LENGTH:
        raise ValueError(f"provider ID is {len(provider_id)} characters long, more than {MAX_LENGTH}")
    if not provider_id.startswith(SCHEME):
        raise ValueError(f"provider ID {provider_id!r} does not start with {SCHEME!r}")
    parts = provider_id[len(SCHEME) :].split("/")
    if not parts[0]:
        raise ValueError(f"provider ID {provider_id!r} has no host")
    if len(parts) < 2 or not parts[1]:
        raise ValueError(f"provider ID {provider_id!r} has no domain UUID after the host")
    if len(parts) > 2:
        raise ValueError(f"provider ID {provider_id!r} has a path after the domain UUID")
    host, domain_uuid = parts
    _check_host(host, provider_id)
    _check_uuid(domain_uuid, provider_id)
    return ProviderID(host=host, domain_uuid=domain_uuid)


def _check_host(host: str, context: str | None = None) -> None:
    where = f" in provider ID {context!r}" if context is not None else ""
    if not (isinstance(host, str) and len(host) <= _HOST_MAX and _HOST.fullmatch(host)):
        raise ValueError(f"host {host!r}{where} is not a lowercase DNS name (no port, user or IPv6 literal)")


def _check_uuid(domain_uuid: str, context: str | None = None) -> None:
    where = f" in provider ID {context!r}" if context is not None else ""
    if not (isinstance(domain_uuid, str) and _UUID.fullmatch(domain_uuid)):
        raise ValueError(f"domain UUID {domain_uuid!r}{where} is not a lowercase hyphenated UUID")
