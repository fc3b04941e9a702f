"""The provider's own hypervisor errors, and the ONE translation of libvirt error codes into them."""

from __future__ import annotations

import re

import libvirt


class HypervisorError(Exception):
    """A libvirt operation failed; the message names the host and what was attempted, never secret material."""

    def __init__(self, message: str, host: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.host = host  # filled in by the host's connection when the raiser did not know it

    def __str__(self) -> str:
        return f"host {self.host}: {self.message}" if self.host else self.message


class HostUnreachable(HypervisorError):
    """The host's libvirt daemon cannot be reached (connection refused, broken, authentication failed)."""


class NotFound(HypervisorError):
    """The object does not exist; deleting it counts as done."""


class DomainNotFound(NotFound):
    pass


class VolumeNotFound(NotFound):
    pass


class PoolNotFound(NotFound):
    pass


class NetworkNotFound(NotFound):
    pass


class OperationInvalid(HypervisorError):
    """The operation does not apply in the object's current state (e.g. destroying a domain that is not running)."""


_NOT_FOUND = {
    libvirt.VIR_ERR_NO_DOMAIN: DomainNotFound,
    libvirt.VIR_ERR_NO_STORAGE_VOL: VolumeNotFound,
    libvirt.VIR_ERR_NO_STORAGE_POOL: PoolNotFound,
    libvirt.VIR_ERR_NO_NETWORK: NetworkNotFound,
}
_UNREACHABLE_CODES = {
    libvirt.VIR_ERR_RPC, libvirt.VIR_ERR_NO_CONNECT, libvirt.VIR_ERR_INVALID_CONN,
    libvirt.VIR_ERR_AUTH_FAILED, libvirt.VIR_ERR_AUTH_CANCELLED, libvirt.VIR_ERR_AUTH_UNAVAILABLE,
}
# A system error (errno) means the transport only when the transport layers raised it; elsewhere it is a disk or a
# permission problem on the host, which a new connection would not mend.
_TRANSPORT_DOMAINS = {libvirt.VIR_FROM_RPC, libvirt.VIR_FROM_REMOTE, libvirt.VIR_FROM_SSH}
_URI = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


# What a libvirtError says, asked by the hypervisor modules that handle some errors in place (a delete of what is gone,
# a pool refreshed while busy) before the rest reach translate(): the codes are read here only.
def is_missing_domain(error: libvirt.libvirtError) -> bool:
    return bool(error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN)


def is_missing_volume(error: libvirt.libvirtError) -> bool:
    return bool(error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL)


def is_missing_pool(error: libvirt.libvirtError) -> bool:
    return bool(error.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL)


def is_missing_nwfilter(error: libvirt.libvirtError) -> bool:
    return bool(error.get_error_code() == libvirt.VIR_ERR_NO_NWFILTER)


def is_operation_invalid(error: libvirt.libvirtError) -> bool:
    """The object is not in a state the operation applies to (a domain stopped meanwhile, an inactive pool)."""
    return bool(error.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID)


def is_unsupported(error: libvirt.libvirtError) -> bool:
    """The driver or the hypervisor does not support the call."""
    return error.get_error_code() in (libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_ERR_OPERATION_UNSUPPORTED)


def is_internal_error(error: libvirt.libvirtError) -> bool:
    """libvirt's catch-all, e.g. "has asynchronous jobs running" for a domain that is busy."""
    return bool(error.get_error_code() == libvirt.VIR_ERR_INTERNAL_ERROR)


def is_storage_busy(error: libvirt.libvirtError) -> bool:
    """An internal error of the storage driver: a pool refreshed while another operation holds it."""
    return is_internal_error(error) and error.get_error_domain() == libvirt.VIR_FROM_STORAGE


def redact(text: str) -> str:
    """Messages end up in conditions and events: URIs (users, hosts, key paths in their query) are cut out."""
    return _URI.sub("<uri>", text)


def translate(error: libvirt.libvirtError, host: str, doing: str) -> HypervisorError:
    """Map a libvirtError to the provider's error, by code, never by matching message text."""
    code, domain = error.get_error_code(), error.get_error_domain()
    message = redact(f"{doing}: {error.get_error_message() or error}")
    if code in _NOT_FOUND:
        return _NOT_FOUND[code](message, host)
    if code in _UNREACHABLE_CODES or (code == libvirt.VIR_ERR_SYSTEM_ERROR and domain in _TRANSPORT_DOMAINS):
        return HostUnreachable(message, host)
    if code == libvirt.VIR_ERR_OPERATION_INVALID:
        return OperationInvalid(message, host)
    return HypervisorError(message, host)
