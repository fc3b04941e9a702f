"""Guests on a host's Linux bridge, and every way the operator finds their addresses, on real parts.

One libvirt host with NO libvirt network and no libvirt DHCP, as a typical Ubuntu KVM host: a plain bridge `br0`
carrying the host's own address, and the LAN's DHCP server (a dnsmasq in the host's namespace, not libvirt's) on it
(devenv.bridged_lan). The host runs Debian 13's libvirt 11 (devenv.trixie_root), as Ubuntu 24.04's hosts run a
libvirt past this machine's 9.0, whose ARP source fails on this kernel (`wrong nlmsg len`, see the ARP test). The
operator reaches it over qemu+tls as a LibvirtHost whose `spec.access.bridges` allows `br0`. Two machines of the
minimal cached image boot on the bridge at once (two, not three: the test-time budget):

- `static`: a static address (interfaces[].static), `guestAgent: false`. It is published and the machine provisioned as
  soon as the domain runs, before the guest has booted; the guest then answers a ping from the host at that address,
  and the host's neighbour table holds its MAC. Without an agent, the host's ARP table is the only source discovery
  can ask: the operator publishes what libvirt's ARP source answers.
- `agent`: DHCP from the LAN's dnsmasq, guest agent on. libvirt holds no lease of it (no libvirt network exists): its
  leased address (in dnsmasq's lease file) comes from the guest agent once it answers (the ARP table may find it
  first).

Then the flap: the agent guest's agent is stopped from inside the guest (guest-exec of `systemctl stop`), the host's
neighbour table flushed, and the machine woken (an annotation, as `kubectl annotate` would); the pass that follows finds
nothing (its AddressesDiscovered condition says so) and still publishes the last discovered address. Once the host has
talked to the guest again (a ping), the ARP table alone finds its leased address: no lease, no agent.

The lease path (a guest on a libvirt NAT network) is proven by tests/e2e/test_machine_lifecycle.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import pathlib
import shutil
import time
import uuid
import xml.etree.ElementTree as ET

import libvirt
import pytest
from kubernetes_asyncio import client

import guest_agent
from capi_libvirt.api import meta
from capi_libvirt.core import conditions, domain_xml, naming
from declared_host import credentials, host_uri
from devenv import base_image, capi_objects, trixie_root
from devenv import remote_access as ra
from devenv.bridged_lan import BridgedLan
from devenv.libvirt_host import LibvirtHost
from guests import host_access, machine_spec, provider_objects

from fixtures_control_plane import PROVIDER_NAMESPACE, allow_secrets, operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require
from waiting import Clock, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

HOST, LAN, LINK, BRIDGE = "bridge-lan", "192.168.182.0/24", 182, "br0"
STATIC, GATEWAY = "192.168.182.10", "192.168.182.1"  # below the LAN's DHCP range (.100-.199); the host's address
PROVISION_DEADLINE_S = 600.0  # TCG boots on a busy 2-core CI machine: a deadline for convergence, not a measure
DELETE_DEADLINE_S = 120.0
KINDS = ("static", "agent")


class Bed:
    """The booted machines and what the tests look at: their LibvirtMachines, their domains, the LAN."""

    def __init__(self, api_client, namespace: str, access: ra.RemoteAccess, lan: BridgedLan, volume: str) -> None:
        self.objects = client.CustomObjectsApi(api_client)
        self.namespace, self.access, self.lan, self.volume = namespace, access, lan, volume
        self.names: dict[str, str] = {}
        self.clock = Clock()

    @property
    def host(self) -> LibvirtHost:
        return self.access.host

    async def get(self, kind: str) -> dict:
        return await self.objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, self.namespace,
                                                               "libvirtmachines", self.names[kind])

    def domain_xml(self, body: dict) -> ET.Element:
        with self.host.connect() as conn:
            return ET.fromstring(conn.lookupByUUIDString(naming.domain_uuid(body["metadata"]["uid"])).XMLDesc(0))

    def mac(self, body: dict) -> str:
        return self.domain_xml(body).find("devices/interface/mac").get("address").lower()


def internal(body: dict) -> list[str]:
    return [a["address"] for a in (body.get("status") or {}).get("addresses") or [] if a["type"] == "InternalIP"]


def discovered(body: dict) -> dict:
    return conditions.get_condition((body.get("status") or {}).get("conditions"),
                                    conditions.ADDRESSES_DISCOVERED) or {}


def provisioned(body: dict) -> bool:
    return bool((body.get("status") or {}).get("initialization", {}).get("provisioned"))


def spec_for(kind: str, host: LibvirtHost, guest_image, volume: str) -> dict:
    spec = machine_spec(host, guest_image, volume) | {"host": HOST, "interfaces": [{"bridge": BRIDGE}]}
    if kind == "static":
        spec["interfaces"] = [{"bridge": BRIDGE, "static": {"addresses": [f"{STATIC}/24"],
                                                             "gateway": GATEWAY}}]
        spec["guestAgent"] = False
    return spec


@pytest.fixture(scope="module")
async def bed(control_plane, api_client, guest_image):
    require_libvirt_host_prerequisites()
    require(shutil.which("ping") is not None, "ping on PATH (iputils-ping, hack/install-system-deps.sh)")
    root = trixie_root.root_folder()
    require(root.is_dir(), f"the trixie root {root} (make trixie-root)")
    core = client.CoreV1Api(api_client)
    namespace = f"bridge-{uuid.uuid4().hex[:6]}"
    with ra.RemoteAccess(LibvirtHost(HOST, LAN, network_name=None, root=root), link_index=LINK) as access, \
            BridgedLan(access.host, LAN, bridge=BRIDGE) as lan:
        with access.host.connect() as conn:
            volume = base_image.upload_base_image(conn, access.host.pool_name, guest_image)
            assert conn.listAllNetworks() == [], "the host has no libvirt network: no libvirt DHCP, no lease"
        bed = Bed(api_client, namespace, access, lan, volume)
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        try:
            allow_secrets(control_plane, namespace)
            await add_host(bed, core, guest_image)
            await capi_objects.create_cluster(api_client, namespace, "lan", infrastructure_kind="ProxmoxCluster")
            async with operator_running(control_plane, {}):
                try:
                    made = await asyncio.gather(*(capi_objects.create_machine(
                        api_client, namespace, "lan", f"{kind}-{uuid.uuid4().hex[:5]}",
                        capi_objects.marker_user_data(f"marker-{kind}"),
                        spec_for(kind, access.host, guest_image, volume)) for kind in KINDS))
                    bed.names = {kind: m.libvirt_machine for kind, m in zip(KINDS, made, strict=True)}
                    bed.clock.mark("2 machines created")
                    yield bed
                finally:  # while the operator runs, so it releases the machines' and the host's finalizers
                    await delete_machines(bed)
                    await delete_host(bed)
        finally:
            with contextlib.suppress(client.exceptions.ApiException):
                await core.delete_namespaced_secret(HOST, PROVIDER_NAMESPACE)
            await core.delete_namespace(namespace)
    # The host's stop (RemoteAccess, then the LibvirtHost) took its namespace with the bridge and dnsmasq.
    assert not (pathlib.Path("/run/netns") / access.host.netns).exists()


async def add_host(bed: Bed, core: client.CoreV1Api, guest_image) -> None:
    """The LibvirtHost over qemu+tls, its credentials in the provider's namespace; its access rules allow the test's
    namespace the base image, the kernel's folder and the bridge."""
    await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=HOST),
        data={key: base64.b64encode(value).decode() for key, value in credentials(bed.access, "tls").items()}))
    access_rules = host_access(spec_for("static", bed.host, guest_image, bed.volume))
    assert access_rules["bridges"] == [BRIDGE]
    await bed.objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": HOST},
        "spec": {"uri": host_uri(bed.access, "tls"), "storagePool": bed.host.pool_name,
                 "access": {**access_rules, "namespaces": [bed.namespace]},
                 "credentialsSecretRef": {"name": HOST, "namespace": PROVIDER_NAMESPACE}}})


async def delete_host(bed: Bed) -> None:
    await bed.objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", HOST)

    async def released():
        try:
            await bed.objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", HOST)
            return False
        except client.exceptions.ApiException as error:
            return error.status == 404
    await wait_until("the LibvirtHost released", released, DELETE_DEADLINE_S)


async def delete_machines(bed: Bed) -> None:
    """Delete every machine still there (the last test does it first and checks the host is clean)."""
    for name in bed.names.values():
        try:
            await bed.objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, bed.namespace,
                                                              "libvirtmachines", name)
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise

    async def all_gone():
        for kind in bed.names:
            try:
                await bed.get(kind)
                return False
            except client.exceptions.ApiException as error:
                if error.status != 404:
                    raise
        return True
    await wait_until("the machines deleted (finalizers released)", all_gone, DELETE_DEADLINE_S)


# -- a. a static address ------------------------------------------------------------------------------------------

async def test_a_static_address_is_published_at_once_and_the_guest_boots_with_it(bed: Bed) -> None:
    body = await wait_until("the static machine provisioned", lambda: _provisioned(bed, "static"),
                            PROVISION_DEADLINE_S, interval=0.5)
    bed.clock.mark("static: provisioned (its address published)")
    assert internal(body) == [STATIC], body["status"]["addresses"]
    assert body["status"]["ready"] is True
    # Provisioned in the pass that started the domain (the next one comes a minute later, or on a watch event): the
    # guest had not booted, so no source could have answered. The address was known up front, not discovered.
    condition = discovered(body)
    assert condition["status"] == "False" and f"known up front: {STATIC}" in condition["message"], condition

    async def answers_ping():
        return await asyncio.to_thread(bed.lan.ping, STATIC)
    await wait_until(f"the static guest answering a ping at {STATIC}", answers_ping, PROVISION_DEADLINE_S, 1.0)
    bed.clock.mark("static: guest answers ping at its static address")
    # The address answered from that guest's own NIC: the host learnt its MAC.
    assert bed.lan.neighbours().get(STATIC) == bed.mac(body)


async def _provisioned(bed: Bed, kind: str) -> dict | None:
    body = await bed.get(kind)
    return body if provisioned(body) else None


# -- b. the guest agent -------------------------------------------------------------------------------------------

async def test_an_address_leased_by_the_lan_dhcp_server_is_found_by_the_guest_agent(bed: Bed) -> None:
    body = await bed.get("agent")
    mac = bed.mac(await wait_until("the agent machine's domain", lambda: _with_domain(bed, "agent"),
                                   PROVISION_DEADLINE_S))
    leased = await wait_until("the agent guest's lease from the LAN's dnsmasq", lambda: _lease(bed, mac),
                              PROVISION_DEADLINE_S, 1.0)
    bed.clock.mark("agent: leased by the LAN's dnsmasq")

    async def published():
        body = await bed.get("agent")
        return body if leased in internal(body) and provisioned(body) else None
    body = await wait_until(f"the agent machine publishing {leased}", published, PROVISION_DEADLINE_S)
    bed.clock.mark("agent: leased address published")
    # Published by the first source that answered: on libvirt 11 the host's ARP table may hold the guest before its
    # agent runs (the host learns its MAC from the DHCP exchange or the guest's first ARP). Once the agent answers it
    # is asked first.
    uuid_ = naming.domain_uuid(body["metadata"]["uid"])
    await wait_until("the agent guest's agent", lambda: asyncio.to_thread(guest_agent.agent_answers, bed.host, uuid_),
                     PROVISION_DEADLINE_S, 1.0)
    await wake(bed, "agent")
    body = await wait_until("the leased address from the guest agent", lambda: _found_by(bed, "agent", "GuestAgent"),
                            120)
    bed.clock.mark("agent: leased address found by the guest agent")
    condition = discovered(body)
    assert (condition["status"], condition["reason"]) == ("True", "GuestAgent"), condition
    assert leased in condition["message"] and internal(body) == [leased], body["status"]
    with bed.host.connect() as conn:
        assert conn.listAllNetworks() == [], "no libvirt network, so libvirt holds no lease to find"


async def _with_domain(bed: Bed, kind: str) -> dict | None:
    body = await bed.get(kind)
    return body if (body.get("status") or {}).get("state") == "running" else None


async def _lease(bed: Bed, mac: str) -> str | None:
    return bed.lan.leases().get(mac)


# -- c. the host's ARP table --------------------------------------------------------------------------------------

async def test_without_agent_the_hosts_arp_table_is_asked_and_its_answer_published(bed: Bed) -> None:
    """The static guest has no agent: the host's ARP table is the only source. The host holds its MAC (it answered a
    ping), libvirt 11's ARP source answers with its address, and the operator publishes it as discovered there.
    (libvirt 9.0's ARP source fails on this machine's kernel, "wrong nlmsg len": virArpTableGet rejects the NLMSG_DONE
    message that kernels since 6.10 put into the same netlink reply as the neighbour entries.)"""
    body = await wait_until("the static machine provisioned", lambda: _provisioned(bed, "static"),
                            PROVISION_DEADLINE_S)
    assert not [t for t in bed.domain_xml(body).iter("target") if t.get("name") == domain_xml.GUEST_AGENT_CHANNEL]
    mac = bed.mac(body)

    async def answers_ping():  # the host talks to it, and so learns its MAC (as any LAN peer would)
        return await asyncio.to_thread(bed.lan.ping, STATIC)
    await wait_until(f"the static guest answering a ping at {STATIC}", answers_ping, PROVISION_DEADLINE_S, 1.0)
    assert bed.lan.neighbours().get(STATIC) == mac, "the host's neighbour table holds the guest"
    uuid_ = naming.domain_uuid(body["metadata"]["uid"])
    with bed.host.connect() as conn:
        assert conn.getLibVersion() >= 11_000_000, conn.getLibVersion()
        libvirt_answer = conn.lookupByUUIDString(uuid_).interfaceAddresses(
            libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP, 0)
    assert [a["addr"] for i in libvirt_answer.values() for a in i["addrs"]] == [STATIC], libvirt_answer
    await wake(bed, "static")

    async def from_arp():
        body = await bed.get("static")
        return body if discovered(body).get("reason") == "ARPTable" else None
    body = await wait_until("the static machine's address from the ARP table", from_arp, 120)
    bed.clock.mark("static: address discovered in the ARP table")
    assert internal(body) == [STATIC] and STATIC in discovered(body)["message"], body["status"]


async def wake(bed: Bed, kind: str) -> None:
    """Make the operator look at the machine again now, as `kubectl annotate` does (any change of the object)."""
    await bed.objects.patch_namespaced_custom_object(
        meta.GROUP, meta.VERSION, bed.namespace, "libvirtmachines", bed.names[kind],
        {"metadata": {"annotations": {"example.com/poke": str(time.time())}}},
        _content_type="application/merge-patch+json")


# -- d. discovery flaps: the last known address stays ----------------------------------------------------------------

async def test_the_last_known_address_stays_when_the_agent_stops_and_arp_forgets_the_guest(bed: Bed) -> None:
    body = await wait_until("the agent machine provisioned by its agent", lambda: _found_by(bed, "agent", "GuestAgent"),
                            PROVISION_DEADLINE_S)
    leased = internal(body)
    uuid_ = naming.domain_uuid(body["metadata"]["uid"])
    with bed.host.connect() as conn:
        domain = conn.lookupByUUIDString(uuid_)
        # Not waited on: the agent that would report the command's end is what it stops.
        started = guest_agent.agent(domain, "guest-exec", path="/bin/systemctl", arg=["stop", "qemu-guest-agent.service"])
        assert "pid" in started, started
    bed.clock.mark("flap: agent stop sent from inside the guest")

    async def agent_gone():
        with bed.host.connect() as conn:
            xml = ET.fromstring(conn.lookupByUUIDString(uuid_).XMLDesc(0))
        return all(t.get("state") == "disconnected" for t in xml.iter("target")
                   if t.get("name") == domain_xml.GUEST_AGENT_CHANNEL)
    await wait_until("the guest agent's channel disconnected", agent_gone, 60, 0.5)
    bed.lan.flush_neighbours()
    assert not [mac for mac in bed.lan.neighbours().values() if mac == bed.mac(body)]
    bed.clock.mark("flap: agent gone, neighbour table flushed")
    with bed.host.connect() as conn:
        with pytest.raises(libvirt.libvirtError):
            conn.lookupByUUIDString(uuid_).interfaceAddresses(libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0)
    # Wake the machine (what `kubectl annotate` does); the pass that follows looks again and finds nothing.
    await wake(bed, "agent")

    async def nothing_found():
        body = await bed.get("agent")
        reason = discovered(body).get("reason")
        if reason == "ARPTable":  # the guest talked to the host again (it is the LAN's router), so it forgets again
            bed.lan.flush_neighbours()
            await wake(bed, "agent")
        return body if reason == "NothingDiscovered" else None
    body = await wait_until("a pass that discovers nothing", nothing_found, 120)
    bed.clock.mark("flap: a pass found nothing; address kept")
    assert internal(body) == leased, body["status"]["addresses"]
    assert f"keeping the last discovered {', '.join(leased)}" in discovered(body)["message"], discovered(body)
    assert "the guest agent" not in discovered(body)["message"] and "ARP table" in discovered(body)["message"]
    assert provisioned(body) and conditions.is_true(body["status"]["conditions"], conditions.READY)

    # The host talks to the guest again (as any LAN peer would): its leased address, which only the LAN's dnsmasq
    # gave and no agent reports now, is found in the host's ARP table alone.
    [address] = leased

    async def answers_ping():
        return await asyncio.to_thread(bed.lan.ping, address)
    await wait_until(f"the agent guest answering a ping at {address}", answers_ping, 60, 1.0)
    assert bed.lan.neighbours().get(address) == bed.mac(body)
    await wake(bed, "agent")
    body = await wait_until("the leased address found in the ARP table alone",
                            lambda: _found_by(bed, "agent", "ARPTable"), 120)
    bed.clock.mark("flap: the leased address found again, by ARP alone")
    assert internal(body) == leased and address in discovered(body)["message"], body["status"]


async def _found_by(bed: Bed, kind: str, reason: str) -> dict | None:
    body = await bed.get(kind)
    return body if provisioned(body) and discovered(body).get("reason") == reason else None


# -- nothing left -------------------------------------------------------------------------------------------------

async def test_the_machines_are_deleted_leaving_nothing_on_the_host(bed: Bed) -> None:
    await delete_machines(bed)
    bed.clock.mark("all deleted")
    assert provider_objects(bed.host, bed.volume) == []
    print(f"\n[numbers] bridged host, 2 guests booted at once (TCG, 256 MiB):\n{bed.clock.report()}")
