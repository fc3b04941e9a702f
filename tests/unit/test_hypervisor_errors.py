"""libvirt errors are translated by code (never by message text), and URIs never reach a condition; the codes are
read in hypervisor/errors.py only."""

from __future__ import annotations

import pathlib
import re

import libvirt
import pytest

from capi_libvirt.hypervisor import errors

pytestmark = pytest.mark.unit


def libvirt_error(code: int, domain: int, message: str) -> libvirt.libvirtError:
    error = libvirt.libvirtError(message)
    error.err = (code, domain, message, 2, None, None, None, -1, -1)  # what libvirt fills in from virGetLastError
    return error


@pytest.mark.parametrize(("code", "domain", "expected"), [
    (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_FROM_QEMU, errors.DomainNotFound),
    (libvirt.VIR_ERR_NO_STORAGE_VOL, libvirt.VIR_FROM_STORAGE, errors.VolumeNotFound),
    (libvirt.VIR_ERR_NO_STORAGE_POOL, libvirt.VIR_FROM_STORAGE, errors.PoolNotFound),
    (libvirt.VIR_ERR_NO_NETWORK, libvirt.VIR_FROM_NETWORK, errors.NetworkNotFound),
    (libvirt.VIR_ERR_AUTH_FAILED, libvirt.VIR_FROM_AUTH, errors.HostUnreachable),
    (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC, errors.HostUnreachable),
    (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_STORAGE, errors.HypervisorError),  # a full disk, not the network
    (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_FROM_DOMAIN, errors.OperationInvalid),
    (libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU, errors.HypervisorError),
])
def test_errors_are_translated_by_code_and_domain(code, domain, expected):
    translated = errors.translate(libvirt_error(code, domain, "whatever the text says"), "kvm1", "doing it")
    assert type(translated) is expected
    assert translated.host == "kvm1" and str(translated).startswith("host kvm1: doing it")


def test_messages_with_uris_are_redacted():
    error = libvirt_error(libvirt.VIR_ERR_NO_CONNECT, libvirt.VIR_FROM_REMOTE,
                          "no connection driver available for qemu+ssh://root@kvm1.example/system?keyfile=/s/id")
    translated = errors.translate(error, "kvm1", "connect")
    assert "root@" not in str(translated) and "keyfile" not in str(translated) and "<uri>" in str(translated)


@pytest.mark.parametrize(("predicate", "code", "domain"), [
    (errors.is_missing_domain, libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_FROM_QEMU),
    (errors.is_missing_volume, libvirt.VIR_ERR_NO_STORAGE_VOL, libvirt.VIR_FROM_STORAGE),
    (errors.is_missing_pool, libvirt.VIR_ERR_NO_STORAGE_POOL, libvirt.VIR_FROM_STORAGE),
    (errors.is_missing_nwfilter, libvirt.VIR_ERR_NO_NWFILTER, libvirt.VIR_FROM_NWFILTER),
    (errors.is_operation_invalid, libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_FROM_DOMAIN),
    (errors.is_unsupported, libvirt.VIR_ERR_NO_SUPPORT, libvirt.VIR_FROM_QEMU),
    (errors.is_unsupported, libvirt.VIR_ERR_OPERATION_UNSUPPORTED, libvirt.VIR_FROM_QEMU),
    (errors.is_internal_error, libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU),
    (errors.is_storage_busy, libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_STORAGE),
])
def test_the_errors_handled_in_place_are_recognised_by_code(predicate, code, domain):
    assert predicate(libvirt_error(code, domain, "whatever the text says"))
    assert not predicate(libvirt_error(libvirt.VIR_ERR_RPC, libvirt.VIR_FROM_RPC, "whatever the text says"))


def test_storage_busy_is_the_storage_drivers_internal_error_only():
    assert not errors.is_storage_busy(libvirt_error(libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_FROM_QEMU, "busy"))


def test_libvirt_error_codes_are_read_only_where_they_are_translated():
    """hypervisor/errors.py is the one module that reads a libvirtError's code or domain (the others ask it)."""
    source = pathlib.Path(errors.__file__).parent.parent
    readers = sorted(str(path.relative_to(source)) for path in source.rglob("*.py")
                     if re.search(r"get_error_(code|domain)\(", path.read_text()) and path.name != "errors.py")
    assert readers == []
