"""A domain of ours left paused is resumed by start_domain, on a real libvirtd: paused behind libvirt's back (QEMU's
monitor `stop`, which libvirt records as reason "unknown", as the chaos test found domains after a libvirtd restart)
it runs again; paused by a user (`virsh suspend`) it is left paused. domain_info names the reason either way."""

from __future__ import annotations

import uuid

import libvirt
import libvirt_qemu
import pytest

from capi_libvirt.hypervisor import machines
from devenv.libvirt_host import LibvirtHost

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def diskless_domain_xml(name: str, domain_uuid: str) -> str:
    """A VM with no disk (it sits in its firmware): enough for libvirt to run and pause it, cheap under TCG."""
    return (f"<domain type='qemu'><name>{name}</name><uuid>{domain_uuid}</uuid><memory unit='MiB'>32</memory>"
            "<vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os><devices/></domain>")


@pytest.fixture
def running_domain(libvirt_host: LibvirtHost):
    domain_uuid = str(uuid.uuid4())
    with libvirt_host.connect() as conn:
        domain = conn.defineXML(diskless_domain_xml(f"paused-{domain_uuid[:8]}", domain_uuid))
        domain.create()
        try:
            yield conn, domain
        finally:
            machines.destroy_and_undefine(domain)


def test_a_domain_paused_behind_libvirts_back_is_resumed(running_domain) -> None:
    conn, domain = running_domain
    libvirt_qemu.qemuMonitorCommand(domain, '{"execute": "stop"}', 0)
    assert domain.state() == [libvirt.VIR_DOMAIN_PAUSED, libvirt.VIR_DOMAIN_PAUSED_UNKNOWN]
    info = machines.domain_info(conn, domain.UUIDString())
    assert info is not None and (info.state, info.pause_reason) == ("paused", "unknown")
    assert machines.start_domain(conn, domain.UUIDString()) is True
    assert domain.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    info = machines.domain_info(conn, domain.UUIDString())
    assert info is not None and (info.state, info.pause_reason) == ("running", None)


def test_a_domain_a_user_paused_stays_paused(running_domain) -> None:
    conn, domain = running_domain
    domain.suspend()
    assert machines.start_domain(conn, domain.UUIDString()) is False
    assert domain.state() == [libvirt.VIR_DOMAIN_PAUSED, libvirt.VIR_DOMAIN_PAUSED_USER]
    info = machines.domain_info(conn, domain.UUIDString())
    assert info is not None and (info.state, info.pause_reason) == ("paused", "user")


def test_a_shut_off_domain_is_started(running_domain) -> None:
    conn, domain = running_domain
    domain.destroy()
    assert machines.start_domain(conn, domain.UUIDString()) is False
    assert domain.state()[0] == libvirt.VIR_DOMAIN_RUNNING
