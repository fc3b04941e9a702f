"""The provider on a newer libvirt than this machine's: Debian 13's libvirt 11 and QEMU 10 (devenv.trixie_root, as
Ubuntu 24.04 hosts are past this machine's libvirt 9.0), run chrooted in a test host's own namespaces and reached
through LibvirtHost objects over qemu+tls and qemu+ssh, as a remote hypervisor is.

- Both hosts report trixie's libvirt and QEMU versions in their status, and their pool.
- A machine whose base image is imported by URL (the iPXE image, from an HTTP server on loopback) is placed over
  qemu+tls, its image imported through libvirt 11's upload stream, its domain defined and started; its address is
  the DHCP lease the host's network gave it, and its NIC's anti-spoofing filter is pinned to that lease.
- A second machine over qemu+ssh boots from the imported image (found, not fetched again).
- libvirt 11's ARP lookup answers for a running guest, where this machine's libvirt 9.0 fails (`wrong nlmsg len`):
  the address source the provider asks for bridged NICs works on such hosts.
- Deleted, both leave nothing on the host but the imported image.
- A Linux guest's QEMU guest agent answers libvirt 11 with the guest's address (the agent source).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator

import libvirt
import pytest
from kubernetes_asyncio import client

import guest_agent
from capi_libvirt.api import meta
from capi_libvirt.core import images, naming, traffic_filter
from declared_host import credentials, host_uri
from devenv import base_image, capi_objects, ipxe_image, trixie_root
from devenv import remote_access as ra
from devenv.image_server import ImageServer, Served
from devenv.libvirt_host import LibvirtHost
from guests import host_access, machine_spec, provider_objects

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require
from waiting import CONVERGENCE_S, Pending, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SUBNET, LINK = "192.168.193.0/24", 193
TLS_HOST, SSH_HOST = "trixie-tls", "trixie-ssh"
DEADLINE_S = CONVERGENCE_S


@pytest.fixture(scope="module")
def trixie(tmp_path_factory: pytest.TempPathFactory, guest_image) -> Iterator[tuple[ra.RemoteAccess, str, dict]]:
    """The host (trixie's libvirtd, chrooted) with qemu+tls and qemu+ssh access; the root's libvirt version; the spec
    of a Linux guest (the minimal image, uploaded to its pool) with its guest agent."""
    require_libvirt_host_prerequisites()
    for program in ("/usr/sbin/sshd", "openssl", "ssh-keygen", "chroot"):
        require(__import__("shutil").which(program) is not None, f"{program} (make test installs it)")
    root = trixie_root.root_folder()
    require(root.is_dir(), f"the trixie root {root} (make trixie-root)")
    host = LibvirtHost("trixie-e2e", SUBNET, root=root, log_dir=tmp_path_factory.mktemp("trixie-host-logs"))
    with ra.RemoteAccess(host, link_index=LINK) as access:
        with host.connect() as conn:
            version = conn.getLibVersion()
            base = base_image.upload_base_image(conn, host.pool_name, guest_image)
        yield access, f"{version // 1000000}.{version // 1000 % 1000}.{version % 1000}", \
            machine_spec(host, guest_image, base)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ImageServer, bytes]]:
    require(ipxe_image.IPXE_ISO.exists(), f"{ipxe_image.IPXE_ISO} (Debian's ipxe package; make system-deps)")
    ipxe = ipxe_image.ipxe_qcow2(tmp_path_factory.mktemp("trixie-image")).read_bytes()
    with ImageServer({"/images/ipxe.qcow2": Served(ipxe)}) as server:
        yield server, ipxe


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
async def hosts(control_plane, api_client, trixie, served) -> AsyncIterator[dict]:
    """Two LibvirtHosts of the one trixie hypervisor: over qemu+tls and over qemu+ssh; the operator running."""
    access, _, linux = trixie
    server = served[0]
    core, objects = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    transports = {TLS_HOST: "tls", SSH_HOST: "ssh"}
    secrets = {name: credentials(access, transport) for name, transport in transports.items()}
    uris = {name: host_uri(access, transport) for name, transport in transports.items()}
    for name, data in secrets.items():
        await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name=name), data={k: b64(v) for k, v in data.items()}))
    async with operator_running(control_plane, {}):
        for name, uri in uris.items():
            await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
                "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
                "spec": {"uri": uri, "storagePool": access.host.pool_name,
                         "credentialsSecretRef": {"name": name, "namespace": PROVIDER_NAMESPACE},
                         "access": {**host_access(linux), "imageURLPrefixes": [server.url("/images/")]}}})
        try:
            yield {"access": access, "server": server}
        finally:
            for name in uris:
                await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)

            async def gone():
                listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
                return not set(uris) & {h["metadata"]["name"] for h in listed["items"]}
            await wait_until("the LibvirtHosts released", gone, DEADLINE_S)
    for name in secrets:
        await core.delete_namespaced_secret(name, PROVIDER_NAMESPACE)


async def host_status(api_client, name: str) -> dict:
    body = await client.CustomObjectsApi(api_client).get_cluster_custom_object(meta.GROUP, meta.VERSION,
                                                                               "libvirthosts", name)
    return body.get("status") or {}


async def test_the_newer_libvirt_runs_machines_over_tls_and_ssh_and_answers_every_address_source(
        api_client, namespace, trixie, hosts, served):
    access, version, _ = trixie
    server, ipxe = served
    assert int(version.split(".")[0]) >= 11, f"trixie's libvirt, not this machine's: {version}"
    for name in (TLS_HOST, SSH_HOST):
        async def reachable(name=name):
            status = await host_status(api_client, name)
            return status if status.get("reachable") else Pending(status=status)
        status = await wait_until(f"{name} reachable", reachable, DEADLINE_S)
        assert status["libvirtVersion"] == version, status
        assert int(status["hypervisorVersion"].split(".")[0]) >= 10, status  # trixie's QEMU
        assert [p["name"] for p in status["pools"]] == [access.host.pool_name], status
    print(f"\n[newer libvirt] {TLS_HOST} and {SSH_HOST}: libvirt {status['libvirtVersion']}, "
          f"QEMU {status['hypervisorVersion']}")

    digest = hashlib.sha256(ipxe).hexdigest()
    spec = ipxe_image.machine_spec(access.host.pool_name, access.host.network_name) | {
        "image": {"url": server.url("/images/ipxe.qcow2"), "sha256": digest}}
    await capi_objects.create_cluster(api_client, namespace, "newer")
    objects = client.CustomObjectsApi(api_client)
    names: dict[str, str] = {}
    downloads: list[int] = []  # the image server's count of the image's requests, after each machine
    for host in (TLS_HOST, SSH_HOST):  # one after the other: the second finds the image the first imported
        made = await capi_objects.create_machine(api_client, namespace, "newer", f"on-{host}-{uuid.uuid4().hex[:4]}",
                                                 "#cloud-config\n", spec | {"host": host})
        names[host] = made.libvirt_machine

        async def provisioned(name=made.libvirt_machine):
            body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                              "libvirtmachines", name)
            status = body.get("status") or {}
            conditions = {c["type"]: c.get("reason") for c in status.get("conditions") or []}
            return body if (status.get("initialization") or {}).get("provisioned") else Pending(**conditions)
        body = await wait_until(f"the machine on {host} provisioned", provisioned, DEADLINE_S)
        address = next(a["address"] for a in body["status"]["addresses"] if a["type"] == "InternalIP")
        assert ipaddress.ip_address(address) in ipaddress.ip_network(SUBNET)
        uuid_ = naming.domain_uuid(body["metadata"]["uid"])

        def pinned(uuid_=uuid_, address=address) -> bool:
            with access.host.connect() as conn:
                live = conn.lookupByUUIDString(uuid_).XMLDesc(0)
            return f"filter='{traffic_filter.CLEAN_TRAFFIC}'" in live and f"value='{address}'" in live
        await wait_until(f"the NIC on {host} pinned to its lease {address}", lambda: asyncio.to_thread(pinned),
                         DEADLINE_S)
        print(f"[newer libvirt] machine over {host}: address {address} (DHCP lease), filter pinned to it")
        downloads.append(server.hits("/images/ipxe.qcow2"))
    # The first machine's import downloaded the image (more than once if a download was cut short and retried); the
    # second machine, on another LibvirtHost of the same libvirtd, found it in the pool and downloaded nothing.
    assert downloads[0] >= 1 and downloads[1] == downloads[0], f"downloads after each machine: {downloads}"

    # libvirt 11's ARP lookup: the host's neighbour entry of the guest, once the host has talked to it.
    first = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                       names[TLS_HOST])
    first_uuid = naming.domain_uuid(first["metadata"]["uid"])
    first_address = next(a["address"] for a in first["status"]["addresses"] if a["type"] == "InternalIP")

    def arp_answer() -> list[str]:
        subprocess.run(["ip", "netns", "exec", access.host.netns, "ping", "-c", "1", "-W", "1", first_address],
                       capture_output=True, check=False)  # inside the host's namespace: the guest's network
        with access.host.connect() as conn:
            found = conn.lookupByUUIDString(first_uuid).interfaceAddresses(
                libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP, 0) or {}
        return [entry["addr"] for interface in found.values() for entry in interface.get("addrs") or []]
    arp = await wait_until("libvirt 11's ARP lookup", lambda: asyncio.to_thread(arp_answer), 60, 2.0)
    assert arp == [first_address], arp
    print(f"[newer libvirt] ARP source: {arp}")

    for name in names.values():
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    async def all_gone():
        listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
        return not listed["items"]
    await wait_until("both machines deleted", all_gone, DEADLINE_S)
    left = provider_objects(access.host, images.image_volume_name(digest))
    assert [item for item in left if images.verified_marker_name(digest) not in item] == [], left


async def test_a_linux_guests_agent_answers_on_the_newer_libvirt(api_client, namespace, trixie, hosts):
    """The third address source: a Linux guest (the minimal image, direct kernel boot) over qemu+tls, its address
    read through its QEMU guest agent by libvirt 11, the same the provider's agent source reads."""
    access, _, linux = trixie
    objects = client.CustomObjectsApi(api_client)
    await capi_objects.create_cluster(api_client, namespace, "newer")
    made = await capi_objects.create_machine(api_client, namespace, "newer", f"linux-{uuid.uuid4().hex[:4]}",
                                             "#cloud-config\n", linux | {"host": TLS_HOST})

    async def provisioned():
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                          made.libvirt_machine)
        return body if ((body.get("status") or {}).get("initialization") or {}).get("provisioned") else None
    body = await wait_until("the Linux guest provisioned", provisioned, DEADLINE_S)
    address = next(a["address"] for a in body["status"]["addresses"] if a["type"] == "InternalIP")
    uuid_ = naming.domain_uuid(body["metadata"]["uid"])
    await wait_until("its guest agent", lambda: asyncio.to_thread(guest_agent.agent_answers, access.host, uuid_),
                     DEADLINE_S, 2.0)

    def agent_addresses() -> list[str]:
        with access.host.connect() as conn:
            found = conn.lookupByUUIDString(uuid_).interfaceAddresses(
                libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0) or {}
        return [entry["addr"] for name, interface in found.items() if name != "lo"
                for entry in interface.get("addrs") or [] if ipaddress.ip_address(entry["addr"]).version == 4]
    reported = await wait_until("the agent's addresses", lambda: asyncio.to_thread(agent_addresses), 60, 2.0)
    assert reported == [address], (reported, address)
    print(f"[newer libvirt] agent source: {reported}")
    await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                  made.libvirt_machine)

    async def gone():
        listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
        return not listed["items"]
    await wait_until("the Linux guest deleted", gone, DEADLINE_S)
