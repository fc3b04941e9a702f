"""The chaos-at-scale hosts (bench/journaled_hosts.py) come back from their journal as they were, a record cut by a
SIGKILL mid-write is not replayed, each define that made a domain is logged once, and the run's checks
(bench/scale_chaos.findings) name what is out of place."""

from __future__ import annotations

import asyncio
import pathlib
import xml.etree.ElementTree as ET

import pytest

from bench.journaled_hosts import Journal, JournaledHost
from bench.memory_operator import BASE_VOLUME, bench_host
from bench.scale_chaos import NAMESPACE, Storm, findings
from capi_libvirt.core import domain_owner, naming
from capi_libvirt.reconcile.machine.state import machine_volumes

pytestmark = pytest.mark.unit

UID = "0f7c1b1e-3c55-4b52-9a8e-2b2c0d8f6a01"


def make(name: str) -> JournaledHost:
    host = bench_host(name, 0.0, kind=JournaledHost)
    assert isinstance(host, JournaledHost)
    return host


def started(folder: pathlib.Path) -> tuple[Journal, dict[str, JournaledHost]]:
    journal = Journal(folder)
    hosts = journal.load(make)
    journal.start(hosts)
    for host in hosts.values():
        host.journal = journal
    return journal, hosts


def xml(uuid: str, name: str, uid: str = UID) -> str:
    """A domain of the machine `name` (its owner metadata naming it), as the provider defines one."""
    root = ET.Element("domain", type="qemu")
    ET.SubElement(root, "name").text = name
    ET.SubElement(root, "uuid").text = uuid
    ET.SubElement(root, "memory", unit="KiB").text = "1024"
    root.append(domain_owner.metadata_element(domain_owner.Owner(namespace=NAMESPACE, name=name, uid=uid)))
    ET.SubElement(root, "devices")
    return ET.tostring(root, encoding="unicode")


async def test_the_hosts_come_back_from_snapshot_and_journal_and_creations_are_logged_once(tmp_path):
    journal, hosts = await asyncio.to_thread(started, tmp_path)
    host = hosts["h"] = make("h")
    host.journal = journal
    volumes = machine_volumes(NAMESPACE, "m0", UID, "default")
    uuid = naming.domain_uuid(UID)
    await host.ensure_overlay(volumes, "default", BASE_VOLUME, 1)
    await host.define_domain(uuid, xml(uuid, "m0"))
    await host.define_domain(uuid, xml(uuid, "m0"))  # found defined: not a creation
    # A SIGKILL here; the next start finds it all, and writes a new generation.
    again = await asyncio.to_thread(Journal(tmp_path).load, make)
    assert set(again["h"].domains) == {uuid} and volumes.overlay in again["h"].pools["default"].volumes
    journal2, hosts2 = await asyncio.to_thread(started, tmp_path)
    await hosts2["h"].delete_machine(uuid, UID, volumes, NAMESPACE, "m0")
    torn = (999).to_bytes(4, "big") + b"torn"  # the last record, cut mid-write by a SIGKILL
    journal2.append_raw(torn)
    third = await asyncio.to_thread(Journal(tmp_path).load, make)
    assert third["h"].domains == {} and volumes.overlay not in third["h"].pools["default"].volumes
    assert Journal(tmp_path).creations() == [("h", uuid)]


async def test_the_checks_name_a_leaked_domain_a_leaked_volume_a_missing_one_and_a_stuck_finalizer(tmp_path):
    storm = Storm.__new__(Storm)
    storm.uids, storm.deleted = {"live": UID, "gone": "1a2b3c4d-0000-4000-8000-000000000001"}, {"gone"}
    host = make("h")
    uuid = naming.domain_uuid(UID)
    live = {"live": {"status": {"host": "h", "initialization": {"provisioned": True}}}}
    assert findings({"h": host}, live, storm)["without exactly one domain on their host"] == ["live"]
    await host.ensure_overlay(machine_volumes(NAMESPACE, "live", UID, "default"), "default", BASE_VOLUME, 1)
    await host.define_domain(uuid, xml(uuid, "live"))
    assert not any(findings({"h": host}, live, storm).values())
    stray = naming.domain_uuid(storm.uids["gone"])
    await host.define_domain(stray, xml(stray, "gone"))
    host.add_volume("default", "leftover.qcow2", b"x")
    found = findings({"h": host}, {**live, "gone": {"status": {}}}, storm)
    assert found["domains of no live machine"] == [f"h/{stray}"]
    assert found["volumes of no live machine"] == ["h/leftover.qcow2"]
    assert found["deleted but not gone (finalizer stuck)"] == ["gone"]
