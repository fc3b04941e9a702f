"""libvirt errors are translated by code (never by message text), and URIs never reach a condition."""

from __future__ import annotations

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
