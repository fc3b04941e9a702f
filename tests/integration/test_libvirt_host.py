"""The libvirt host of the test bed: its daemon answers, its pool and network run, hosts side by side stay apart,
and stopping one leaves neither namespace nor process behind."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET

import libvirt
import pytest

from devenv.libvirt_host import LibvirtHost, process_alive

from fixtures_libvirt import RUN_SUFFIX, require_libvirt_host_prerequisites

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def bridge_addresses(netns: str) -> str:
    return subprocess.run(["ip", "-n", netns, "-brief", "address"], capture_output=True, text=True, check=True).stdout


def test_daemon_answers_with_active_pool_and_network(libvirt_host: LibvirtHost) -> None:
    with libvirt_host.connect() as conn:
        assert conn.getType() == "QEMU"
        pool = conn.storagePoolLookupByName(libvirt_host.pool_name)
        network = conn.networkLookupByName(libvirt_host.network_name)
        assert pool.isActive() and network.isActive()
        assert ET.fromstring(pool.XMLDesc()).findtext("target/path") == str(libvirt_host.pool_dir)
    assert str(libvirt_host.bridge_address) in bridge_addresses(libvirt_host.netns)


def test_two_hosts_side_by_side_keep_their_own_pool_network_and_daemons() -> None:
    require_libvirt_host_prerequisites()
    with LibvirtHost(f"pytest-side-a-{RUN_SUFFIX}", "192.168.130.0/24") as a, \
            LibvirtHost(f"pytest-side-b-{RUN_SUFFIX}", "192.168.131.0/24") as b:
        assert a.uri != b.uri and a.netns != b.netns
        with a.connect() as conn_a, b.connect() as conn_b:
            # A pool or network defined on one host is not seen by the other: their definitions live apart.
            conn_a.storagePoolDefineXML(
                f"<pool type='dir'><name>only-on-a</name><target><path>{a.state_dir}/extra</path></target></pool>")
            assert "only-on-a" in conn_a.listDefinedStoragePools()
            with pytest.raises(libvirt.libvirtError):
                conn_b.storagePoolLookupByName("only-on-a")
            for host, conn in ((a, conn_a), (b, conn_b)):
                assert conn.storagePoolLookupByName(host.pool_name).isActive()
                assert conn.networkLookupByName(host.network_name).isActive()
            assert conn_a.storagePoolLookupByName(a.pool_name).UUIDString() != \
                conn_b.storagePoolLookupByName(b.pool_name).UUIDString()
        assert "192.168.130.1/24" in bridge_addresses(a.netns)
        assert "192.168.131.1/24" in bridge_addresses(b.netns)
        assert "192.168.131." not in bridge_addresses(a.netns)


def test_stop_leaves_no_namespace_process_or_folder_behind() -> None:
    require_libvirt_host_prerequisites()
    host = LibvirtHost(f"pytest-stop-{RUN_SUFFIX}", "192.168.132.0/24")
    host.start()
    pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True,
                                           check=True).stdout.split()]
    assert len(pids) >= 3  # virtlogd, libvirtd, dnsmasq
    host.stop()
    assert host.netns not in netns_names()
    assert not any(process_alive(pid) for pid in pids)
    assert not host.state_dir.exists()
    host.stop()  # a second stop is harmless
