"""No spoofing on a shared network, proven with a real guest whose root tries: the machine's NIC carries libvirt's
clean-traffic filter (pinned to the address the host's network leased it, its allowedAddresses granted), and the guest, as root, writes whole
Ethernet frames on a raw socket (nothing its kernel would refuse to route): UDP datagrams to the gateway from its own
address, from its allowed virtual IP, from another address of the subnet, from the network's gateway address, and
from its own address with a MAC that is not its NIC's. The host's side of the network (its bridge, captured like
tcpdump does in the host's namespace) sees its own address and the virtual IP, and nothing of the rest; its own
address again at the end, so the capture was listening all along.

Real kube-apiserver, a real libvirtd of this test's own, the cached minimal guest image booted under TCG, the operator
in the test's event loop; commands in the guest through its QEMU guest agent.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest
from kubernetes_asyncio import client

import guest_agent
from capi_libvirt.api import meta
from capi_libvirt.core import naming, traffic_filter
from devenv import base_image, capi_objects
from devenv.libvirt_host import LibvirtHost
from devenv.packet_capture import BridgeCapture
from guests import machine_spec

from fixtures_control_plane import operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SUBNET = ipaddress.IPv4Network("192.168.189.0/24")
VIP, OTHER = str(SUBNET[250]), str(SUBNET[200])  # a virtual IP granted to the machine; an address that is not its own
PORT = 40189
PROVISION_DEADLINE_S = 600.0  # TCG boot on a busy 2-core CI machine
CAPTURE_S = 60.0
SPOOFED_MAC = "52:54:00:66:66:66"
SENDS = 3  # datagrams per source


@pytest.fixture(scope="module")
def spoof_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibvirtHost]:
    require_libvirt_host_prerequisites()
    with LibvirtHost("spoof-e2e", str(SUBNET), log_dir=tmp_path_factory.mktemp("spoof-host")) as host:
        yield host


GUEST_SENDER = """
import socket, struct, sys, time
device, gateway_mac, gateway_ip, port, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def checksum(header):
    total = sum(struct.unpack("!10H", header))
    total = (total & 0xFFFF) + (total >> 16)
    return ~((total & 0xFFFF) + (total >> 16)) & 0xFFFF
def frame(source_mac, source_ip, label):
    payload = label.encode()
    udp = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0, socket.inet_aton(source_ip),
                     socket.inet_aton(gateway_ip))
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    mac = lambda text: bytes.fromhex(text.replace(":", ""))
    return mac(gateway_mac) + mac(source_mac) + b"\\x08\\x00" + ip + udp
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
raw.bind((device, 0))
for send in sys.argv[6:]:
    label, source_mac, source_ip = send.split(",")
    for _ in range(count):
        raw.send(frame(source_mac, source_ip, label))
        time.sleep(0.1)
"""


def sender(device: str, gateway_mac: str, gateway_ip: str, sends: list[tuple[str, str, str]]) -> str:
    """A shell script for the guest: UDP datagrams to the gateway's PORT, each (label, source MAC, source IP) written
    as a whole Ethernet frame on a raw socket of `device`, as a hostile tenant's root can."""
    program = base64.b64encode(GUEST_SENDER.encode()).decode()
    arguments = " ".join(",".join(send) for send in sends)
    return f"echo {program} | base64 -d > /tmp/send.py && python3 /tmp/send.py {device} {gateway_mac} {gateway_ip} " \
        f"{PORT} {SENDS} {arguments}"


async def test_a_guests_root_cannot_send_as_another_address_or_mac(control_plane, api_client, namespace, spoof_host,
                                                                   guest_image):
    objects = client.CustomObjectsApi(api_client)
    with spoof_host.connect() as conn:
        base = base_image.upload_base_image(conn, spoof_host.pool_name, guest_image)
        network = conn.networkLookupByName(spoof_host.network_name)
        bridge, gateway_mac = network.bridgeName(), ET.fromstring(network.XMLDesc(0)).find("mac").get("address")
    gateway = str(spoof_host.bridge_address)
    spec = machine_spec(spoof_host, guest_image, base) | {
        "interfaces": [{"network": spoof_host.network_name, "allowedAddresses": [VIP]}]}
    await capi_objects.create_cluster(api_client, namespace, "spoof")
    made = await capi_objects.create_machine(api_client, namespace, "spoof", f"tenant-{uuid.uuid4().hex[:6]}",
                                             "#cloud-config\n", spec)

    async def provisioned():
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                          made.libvirt_machine)
        return body if body.get("status", {}).get("initialization", {}).get("provisioned") else None

    # The operator's host is given on its command line: unrestricted, so the virtual IP is granted (a LibvirtHost
    # would grant it in spec.access.allowedAddresses; tests/integration/test_tenants.py proves the refusal).
    async with operator_running(control_plane, {spoof_host.name: spoof_host.uri}):
        body = await wait_until("the machine provisioned", provisioned, PROVISION_DEADLINE_S)
        own = next(a["address"] for a in body["status"]["addresses"] if a["type"] == "InternalIP")
        domain_uuid = naming.domain_uuid(body["metadata"]["uid"])
        await wait_until("the guest agent", lambda: asyncio.to_thread(guest_agent.agent_answers, spoof_host,
                                                                         domain_uuid), PROVISION_DEADLINE_S, 2.0)

        def pinned() -> str | None:  # held to its MAC until the host's lease pins its address (same pass, or next)
            with spoof_host.connect() as conn:
                live = conn.lookupByUUIDString(domain_uuid).XMLDesc(0)
            return live if f"filter='{traffic_filter.WITH_ALLOWED}'" in live else None
        live = await wait_until("the NIC's filter pinned to its lease", lambda: asyncio.to_thread(pinned), 120)
        assert f"name='IP' value='{own}'" in live and f"value='{VIP}'" in live, live

        def inside(script: str) -> bytes:
            return guest_agent.guest_output(spoof_host, domain_uuid, script)
        device = (await asyncio.to_thread(inside, "ip -o -4 route show default | awk '{print $5; exit}'")) \
            .decode().strip()
        mac = (await asyncio.to_thread(inside, f"cat /sys/class/net/{device}/address")).decode().strip()
        guest_network = (await asyncio.to_thread(inside, "ip -4 -o addr; ip -4 route")).decode()
        print(f"\n[spoofing] the guest's network: {guest_network}")
        with BridgeCapture(spoof_host.netns, bridge, PORT, CAPTURE_S) as capture:
            await asyncio.to_thread(inside, sender(device, gateway_mac, gateway, [
                ("own", mac, own), ("virtual-ip", mac, VIP), ("other-address", mac, OTHER),
                ("gateway", mac, gateway), ("spoofed-mac", SPOOFED_MAC, own), ("own-again", mac, own)]))
            seen = await asyncio.to_thread(capture.result)

        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                      made.libvirt_machine)

        async def gone():
            listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                 "libvirtmachines")
            return not listed["items"]
        await wait_until("the machine deleted", gone, 120)
    allowed = ("own", "virtual-ip", "own-again")
    by_label: dict[str, set[tuple[str, str]]] = {}
    for source_mac, source_ip, label in seen:
        by_label.setdefault(label, set()).add((source_mac, source_ip))
    spoofed_seen = sum(1 for _, _, label in seen if label not in allowed)
    print(f"\n[spoofing] guest {own} ({mac}): seen on the host's bridge: {sorted(by_label)}; spoofed datagrams "
          f"sent {3 * SENDS} (another address, the gateway's, another MAC), seen {spoofed_seen}")
    assert by_label.get("own") == {(mac, own)} and by_label.get("own-again") == {(mac, own)}, by_label
    assert by_label.get("virtual-ip") == {(mac, VIP)}, by_label
    assert set(by_label) == set(allowed) and spoofed_seen == 0, f"spoofed traffic reached the host: {by_label}"
