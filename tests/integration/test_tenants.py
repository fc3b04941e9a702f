"""Tenant boundaries, proven with the operator logged in as the tests' operator user, bound only to what config/rbac
ships (the ClusterRole by a ClusterRoleBinding; the Secrets ClusterRole by RoleBindings in the provider's namespace
and in each namespace it serves), against a real libvirtd reached over qemu+tls through LibvirtHost objects.

A tenant (whoever may create LibvirtMachines in a namespace) tries to reach what it must not: a host that does not
allow its namespace, host files as kernel and initrd, a bridge, a pool, a network and an image not on the host's
lists, another machine's disk. Each ends in a TenantNotAllowed condition naming what was refused, before the host is
touched: no finalizer, no providerID, nothing on the host. The operator cannot read a Secret in a namespace without
the RoleBinding (a SecretsForbidden condition naming the ClusterRole and the namespace, retried: binding it the
documented way lets the machine go on), and refuses host credentials outside its own namespace.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import shutil
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta
from capi_libvirt.core import naming
from devenv import capi_objects
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost, dir_pool_xml

from fixtures_control_plane import OPERATOR_USER, PROVIDER_NAMESPACE, allow_secrets, operator_running
from prereq import require
from waiting import CONVERGENCE_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DEADLINE_S = CONVERGENCE_S
HOST_A, HOST_B = "tenant-kvm-a", "tenant-kvm-b"  # two LibvirtHosts of one hypervisor, with different access rules
BASE = "tenant-base.qcow2"  # listed on host A, and absent: an allowed machine gets as far as the host (ImageNotFound)
KERNELS = "/var/lib/capi-libvirt-kernels/"
USER_DATA = "#cloud-config\n# token: s3cr3t-tenant-bootstrap\n"


SHARED = "tenant-kvm-shared"  # a third LibvirtHost of the hypervisor, for shared-* namespaces: a small pool, quotas
SMALL_POOL, SMALL_POOL_MIB = "small", 4096
QUOTA = {"namespaces": ["shared-quota-*"], "machines": 1, "cpus": 2}


@pytest.fixture(scope="module")
def tls_host():
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen", "nsenter"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost("tenants-tls", "192.168.176.0/24"), link_index=176) as access:
        folder = access.host.state_dir / "small-pool"
        access.host.mount_tmpfs(folder, SMALL_POOL_MIB)
        with access.host.connect() as conn:
            conn.storagePoolDefineXML(dir_pool_xml(SMALL_POOL, folder), 0).create(0)
        yield access


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def host_status(objects: client.CustomObjectsApi, name: str) -> dict:
    body = await objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)
    return body.get("status") or {}


@pytest.fixture(scope="module")
async def hosts(control_plane, api_client, tls_host) -> AsyncIterator[dict]:
    """Host A allows the tenant's namespace (set per test), host B only `someone-else`; both on the same libvirtd over
    qemu+tls, credentials in the provider's namespace. The operator runs with no static host."""
    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    secret = f"tenants-tls-{uuid.uuid4().hex[:6]}"
    folder = tls_host.client_dir
    await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret), data={
            "ca.crt": b64((folder / "cacert.pem").read_bytes()), "tls.crt": b64((folder / "clientcert.pem").read_bytes()),
            "tls.key": b64((folder / "clientkey.pem").read_bytes())}))
    common = {"uri": f"qemu+tls://{tls_host.address}/system", "storagePool": tls_host.host.pool_name,
              "credentialsSecretRef": {"name": secret, "namespace": PROVIDER_NAMESPACE}}
    access_a = {"namespaces": ["tenant-a-*"], "images": [BASE], "networks": [tls_host.host.network_name],
                "hostPaths": [KERNELS]}
    access_b = {"namespaces": ["someone-else"], "images": ["*"], "networks": ["*"], "bridges": ["*"]}
    access_shared = {"namespaces": ["shared-*"], "images": [BASE], "networks": [tls_host.host.network_name],
                     "storagePools": [tls_host.host.pool_name, SMALL_POOL], "quotas": [QUOTA]}
    async with operator_running(control_plane, {}):
        for name, access in ((HOST_A, access_a), (HOST_B, access_b), (SHARED, access_shared)):
            await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
                "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
                "spec": {**common, "access": access}})
        for name in (HOST_A, HOST_B, SHARED):
            async def reachable(name=name):
                return (await host_status(objects, name)).get("reachable")
            await wait_until(f"{name} reachable", reachable, DEADLINE_S)
        try:
            yield {"access": tls_host, "objects": objects}
        finally:
            for name in (HOST_A, HOST_B, SHARED):
                await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)

            async def gone():
                listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
                return not {HOST_A, HOST_B, SHARED} & {h["metadata"]["name"] for h in listed["items"]}
            await wait_until("the LibvirtHosts released", gone, DEADLINE_S)
            await core.delete_namespaced_secret(secret, PROVIDER_NAMESPACE)


@contextlib.asynccontextmanager
async def namespace_of_a_tenant(api_client, control_plane, prefix: str) -> AsyncIterator[str]:
    """A namespace (`prefix` and a random suffix) with a Cluster, its Secrets readable by the operator
    (allow_secrets); its machines deleted and waited for at the end."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    allow_secrets(control_plane, name)
    await capi_objects.create_cluster(api_client, name, "demo")
    try:
        yield name
    finally:
        await delete_all_machines(api_client, name)
        await core.delete_namespace(name)


@pytest.fixture
async def tenant(api_client, control_plane) -> AsyncIterator[str]:
    """Tenant A's namespace (tenant-a-*: host A allows it)."""
    async with namespace_of_a_tenant(api_client, control_plane, "tenant-a-") as name:
        yield name


async def delete_machine(api_client, namespace: str, name: str) -> None:
    objects = client.CustomObjectsApi(api_client)
    await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    async def gone():
        listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
        return name not in {item["metadata"]["name"] for item in listed["items"]}
    await wait_until(f"{namespace}/{name} gone", gone, DEADLINE_S)


async def delete_all_machines(api_client, namespace: str) -> None:
    objects = client.CustomObjectsApi(api_client)
    listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
    for item in listed["items"]:
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                      item["metadata"]["name"])

    async def none_left():
        left = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
        return not left["items"]
    await wait_until(f"the LibvirtMachines of {namespace} gone", none_left, DEADLINE_S)


def machine_spec(access: ra.RemoteAccess, **changes) -> dict:
    return {"image": {"volume": BASE}, "storagePool": access.host.pool_name, "domainType": "qemu", "memoryMiB": 128,
            "cpus": 1, "interfaces": [{"network": access.host.network_name}], **changes}


async def make(api_client, namespace: str, libvirt_spec: dict) -> str:
    name = f"m-{uuid.uuid4().hex[:6]}"
    await capi_objects.create_machine(api_client, namespace, "demo", name, USER_DATA, libvirt_spec)
    return name


async def condition(api_client, namespace: str, name: str, reason: str) -> tuple[dict, dict]:
    """The machine's Provisioned condition once its reason is `reason`, and the machine."""
    objects = client.CustomObjectsApi(api_client)

    async def probe():
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)
        found = {c["type"]: c for c in (body.get("status") or {}).get("conditions", [])}.get("Provisioned")
        return (found, body) if found and found["reason"] == reason else None
    return await wait_until(f"{namespace}/{name}: Provisioned {reason}", probe, DEADLINE_S)


def on_host(access: ra.RemoteAccess, namespace: str) -> list[str]:
    """Every domain and pool volume of the namespace's machines on the hypervisor (their names carry the namespace)."""
    prefix = f"{naming.PREFIX}-{naming.sanitize_label(namespace)}"
    with access.host.connect() as conn:
        found = [d.name() for d in conn.listAllDomains() if d.name().startswith(prefix)]
        for pool in conn.listAllStoragePools():
            if pool.isActive():
                pool.refresh(0)
                found += [v for v in pool.listVolumes() if v.startswith(prefix)]
    return found


REFUSED = {  # what a tenant of host A tries, and the words of the refusal
    "host B (does not allow the namespace)": ({"host": HOST_B}, f"host {HOST_B} does not allow machines of namespace"),
    "a host file as kernel": ({"kernelBoot": {"kernel": "/etc/shadow"}}, "kernelBoot.kernel '/etc/shadow'"),
    "a host file as initrd": ({"kernelBoot": {"kernel": f"{KERNELS}vmlinuz", "initrd": "/etc/shadow"}},
                              "kernelBoot.initrd '/etc/shadow'"),
    "a path escaping the kernel folder": ({"kernelBoot": {"kernel": f"{KERNELS}../../../../etc/shadow"}},
                                          "kernelBoot.kernel"),
    "a bridge not on the list": ({"interfaces": [{"bridge": "br0"}]}, "interfaces[0].bridge 'br0'"),
    "a pool not on the list": ({"storagePool": "other-pool"}, "storagePool 'other-pool'"),
    "a network not on the list": ({"interfaces": [{"network": "default"}]}, "interfaces[0].network 'default'"),
    "an image not on the list": ({"image": {"volume": "admin-vm.qcow2"}}, "image.volume 'admin-vm.qcow2'"),
}


async def test_a_tenant_cannot_reach_what_its_host_does_not_allow(api_client, hosts, tenant):
    """Pinned to host A (or to host B), each forbidden thing ends in TenantNotAllowed naming it, nothing placed and
    nothing on the hypervisor; the same machine spec that is allowed gets as far as the host (the base image, listed
    but absent there: ImageNotFound)."""
    access = hosts["access"]
    names = {case: await make(api_client, tenant, machine_spec(access, host=HOST_A) | changes)
             for case, (changes, _) in REFUSED.items()}
    allowed = await make(api_client, tenant, machine_spec(access, host=HOST_A))
    for case, name in names.items():
        found, body = await condition(api_client, tenant, name, "TenantNotAllowed")
        assert REFUSED[case][1] in found["message"], (case, found["message"])
        assert "someone-else" not in found["message"]  # host B's other tenants are not named
        assert not body["spec"].get("providerID") and not body["metadata"].get("finalizers"), case
    found, body = await condition(api_client, tenant, allowed, "ImageNotFound")
    assert BASE in found["message"] and body["metadata"].get("finalizers")  # placed: the host was asked
    assert on_host(access, tenant) == []


async def test_placement_never_picks_a_host_that_refuses(api_client, hosts, tenant):
    """Unpinned: host B has the bridge, but not the namespace; host A has the namespace, not the bridge: no host."""
    access = hosts["access"]
    name = await make(api_client, tenant, machine_spec(access, interfaces=[{"bridge": "br0"}]))
    found, _ = await condition(api_client, tenant, name, "TenantNotAllowed")
    assert found["message"].startswith("no host allows this machine")
    assert f"host {HOST_B} does not allow machines of namespace {tenant}" in found["message"]
    assert "interfaces[0].bridge 'br0'" in found["message"]
    placed = await make(api_client, tenant, machine_spec(access))  # allowed by A only: placed there
    _, body = await condition(api_client, tenant, placed, "ImageNotFound")
    assert body["status"]["host"] == HOST_A
    assert on_host(access, tenant) == []


async def test_no_secret_without_the_namespace_binding(api_client, control_plane, hosts):
    """The operator's user cannot read a Secret in a namespace without the RoleBinding: the API says 403, the machine
    says SecretsForbidden, naming the ClusterRole and the namespace; once bound the documented way, it goes on."""
    namespace = f"tenant-a-unbound-{uuid.uuid4().hex[:4]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        await capi_objects.create_cluster(api_client, namespace, "demo")
        name = await make(api_client, namespace, machine_spec(hosts["access"], host=HOST_A))

        operator_config = client.Configuration()
        await config.load_kube_config(config_file=str(control_plane.kubeconfig_for(OPERATOR_USER)),
                                      client_configuration=operator_config)
        async with client.ApiClient(operator_config) as as_operator:
            with pytest.raises(client.exceptions.ApiException) as refused:
                await client.CoreV1Api(as_operator).read_namespaced_secret(f"{name}-bootstrap", namespace)
            assert refused.value.status == 403

        found, body = await condition(api_client, namespace, name, "SecretsForbidden")
        assert f"ClusterRole {meta.SECRETS_CLUSTER_ROLE}" in found["message"] and namespace in found["message"]
        assert f"{PROVIDER_NAMESPACE}/{meta.PROVIDER_SERVICE_ACCOUNT}" in found["message"]
        assert "s3cr3t" not in found["message"] and not body["metadata"].get("finalizers")

        allow_secrets(control_plane, namespace)  # retried with backoff: the next pass reads the Secret
        await condition(api_client, namespace, name, "ImageNotFound")
        await delete_all_machines(api_client, namespace)
    finally:
        await core.delete_namespace(namespace)


async def test_host_credentials_outside_the_provider_namespace_are_refused(api_client, hosts, tenant):
    """A LibvirtHost whose credentialsSecretRef names another namespace (a tenant's, which the operator may read for
    bootstrap data): refused with a condition, the Secret never used."""
    objects = hosts["objects"]
    folder = hosts["access"].client_dir
    await client.CoreV1Api(api_client).create_namespaced_secret(tenant, client.V1Secret(
        metadata=client.V1ObjectMeta(name="stolen"), data={
            "ca.crt": b64((folder / "cacert.pem").read_bytes()), "tls.crt": b64(b"x"), "tls.key": b64(b"x")}))
    name = f"tenant-kvm-c-{uuid.uuid4().hex[:4]}"
    await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
        "spec": {"uri": f"qemu+tls://{hosts['access'].address}/system",
                 "credentialsSecretRef": {"name": "stolen", "namespace": tenant}}})
    try:
        async def refused():
            ready = {c["type"]: c for c in (await host_status(objects, name)).get("conditions", [])}.get("Ready")
            return ready if ready and ready["reason"] == "CredentialsNamespaceNotAllowed" else None
        ready = await wait_until("the host refused", refused, DEADLINE_S)
        assert ready["status"] == "False" and PROVIDER_NAMESPACE in ready["message"] and tenant in ready["message"]
    finally:
        await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)

        async def gone():
            listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
            return name not in {h["metadata"]["name"] for h in listed["items"]}
        await wait_until("the refused LibvirtHost released", gone, DEADLINE_S)


async def host_pool(objects: client.CustomObjectsApi, host: str, pool: str) -> dict:
    async def listed():
        return next((p for p in (await host_status(objects, host)).get("pools") or [] if p["name"] == pool), None)
    found: dict = await wait_until(f"pool {pool} in the status of {host}", listed, DEADLINE_S)
    return found


async def test_disks_are_counted_against_the_pool_and_a_machine_that_does_not_fit_waits(api_client, control_plane,
                                                                                         hosts):
    """Storage counted like memory, on a 4 GiB pool: the status shows it; a machine claiming 3 GiB is placed (and
    waits for its base image, listed but absent); one claiming 2 GiB more, and the hostile 64 TiB disks, wait in
    InsufficientCapacity naming the pool, what they need and what is left, with nothing on the host; once the first
    machine is gone, the waiting one is placed."""
    access, objects = hosts["access"], hosts["objects"]
    pool = await host_pool(objects, SHARED, SMALL_POOL)
    assert pool["capacityBytes"] == SMALL_POOL_MIB * 2 ** 20 and pool["overcommit"] == 1.0, pool
    assert pool["machineDisksBytes"] == 0 and pool["roomBytes"] == SMALL_POOL_MIB * 2 ** 20, pool
    on_small = {"storagePool": SMALL_POOL, "image": {"volume": BASE, "pool": access.host.pool_name}}
    async with namespace_of_a_tenant(api_client, control_plane, "shared-disk-") as namespace:
        first = await make(api_client, namespace, machine_spec(access, diskGiB=3, **on_small))
        _, body = await condition(api_client, namespace, first, "ImageNotFound")
        assert body["status"]["host"] == SHARED
        waiting = await make(api_client, namespace, machine_spec(access, diskGiB=1, dataDisks=[{"sizeGiB": 1}],
                                                                 **on_small))
        hostile = {"a 64 TiB root disk": {"diskGiB": 65536},
                   "eight 64 TiB data disks": {"diskGiB": 1, "dataDisks": [{"sizeGiB": 65536}] * 8}}
        refused = {case: await make(api_client, namespace, machine_spec(access, **changes, **on_small))
                   for case, changes in hostile.items()}
        found, body = await condition(api_client, namespace, waiting, "InsufficientCapacity")
        assert f"2.0 GiB of disk in pool {SMALL_POOL}" in found["message"], found["message"]
        assert f"pool {SMALL_POOL}: 1.0 GiB left of 4.0 GiB x 1 (machine disks 3.0 GiB" in found["message"]
        assert not body["spec"].get("providerID") and not body["metadata"].get("finalizers")
        for case, name in refused.items():
            found, body = await condition(api_client, namespace, name, "InsufficientCapacity")
            assert f"pool {SMALL_POOL}: 1.0 GiB left" in found["message"], (case, found["message"])
            assert not body["spec"].get("providerID"), case
        print(f"\nstorage: {len(refused) + 1} machines over the pool's room waited, none placed")
        assert on_host(access, namespace) == []

        await delete_machine(api_client, namespace, first)
        _, body = await condition(api_client, namespace, waiting, "ImageNotFound")  # placed once the room is back
        assert body["status"]["host"] == SHARED


async def test_a_namespace_over_its_quota_waits_and_another_is_not_held_back(api_client, control_plane, hosts):
    """Two namespaces on one host whose quota lets each hold one machine and two vCPUs: the second machine of the
    first namespace waits in QuotaExceeded naming the quota and the usage, the other namespace's machine is placed,
    and freeing room lets the waiting one go on."""
    access = hosts["access"]
    async with namespace_of_a_tenant(api_client, control_plane, "shared-quota-") as one, \
            namespace_of_a_tenant(api_client, control_plane, "shared-quota-") as two:
        first = await make(api_client, one, machine_spec(access))
        await condition(api_client, one, first, "ImageNotFound")
        second = await make(api_client, one, machine_spec(access))
        too_big = await make(api_client, two, machine_spec(access, cpus=3))
        other = await make(api_client, two, machine_spec(access))
        found, body = await condition(api_client, one, second, "QuotaExceeded")
        assert f"namespace {one} may hold 1 machines on host {SHARED}" in found["message"], found["message"]
        assert "spec.access.quotas[0].machines" in found["message"] and "it holds 1" in found["message"]
        assert not body["spec"].get("providerID") and not body["metadata"].get("finalizers")
        found, _ = await condition(api_client, two, too_big, "QuotaExceeded")
        assert f"namespace {two} may hold 2 vCPUs on host {SHARED}" in found["message"], found["message"]
        _, body = await condition(api_client, two, other, "ImageNotFound")
        assert body["status"]["host"] == SHARED
        assert on_host(access, one) == [] and on_host(access, two) == []

        await delete_machine(api_client, one, first)
        _, body = await condition(api_client, one, second, "ImageNotFound")
        assert body["status"]["host"] == SHARED


async def after_the_second_of(timestamp: str) -> None:
    """Until the clock (the API server's: the same machine's) is past the second of an RFC 3339 `timestamp`."""
    created = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    left = (created + datetime.timedelta(seconds=1) - datetime.datetime.now(datetime.UTC)).total_seconds()
    await asyncio.sleep(max(0.0, left))


def foreign_domain_xml(name: str, network: str, mac: str) -> str:
    """A VM another tool defined on the hypervisor (no owner metadata of ours), with a NIC on `network`."""
    domain = ET.Element("domain", type="qemu")
    ET.SubElement(domain, "name").text = name
    ET.SubElement(domain, "memory", unit="MiB").text = "64"
    ET.SubElement(ET.SubElement(domain, "os"), "type", arch="x86_64", machine="pc").text = "hvm"
    interface = ET.SubElement(ET.SubElement(domain, "devices"), "interface", type="network")
    ET.SubElement(interface, "source", network=network)
    ET.SubElement(interface, "mac", address=mac)
    return ET.tostring(domain, encoding="unicode")


async def test_addresses_and_macs_of_someone_else_are_refused_before_the_host_is_touched(api_client, control_plane,
                                                                                        hosts):
    """On one host and network: the network's gateway, an address outside its subnet, another tenant's address and
    MAC (its machine asked first), a MAC another VM on the host uses, and a machine type the host's QEMU lacks each
    end in a condition naming the conflict, with nothing of the machine on the host; a free address goes on."""
    access = hosts["access"]
    network, subnet = access.host.network_name, access.host.subnet
    taken, free, foreign_mac, their_mac = str(subnet[20]), str(subnet[21]), "52:54:00:fe:00:01", "52:54:00:fe:00:02"

    def on_network(**nic) -> dict:
        return machine_spec(access, interfaces=[{"network": network, **nic}])

    cases = {
        "the network's gateway": (on_network(static={"addresses": [f"{access.host.bridge_address}/24"]}),
                                  "AddressConflict", "is the network's own (its gateway, DHCP and DNS server)"),
        "an address outside the subnet": (on_network(static={"addresses": ["10.99.0.5/24"]}), "AddressConflict",
                                          f"address 10.99.0.5 is outside the network's subnet ({subnet})"),
        "another tenant's address": (on_network(static={"addresses": [f"{taken}/24"]}), "AddressConflict",
                                     f"address {taken} is already another machine's there"),
        "another tenant's MAC": (on_network(macAddress=their_mac.upper()), "AddressConflict",
                                 f"MAC {their_mac} is already another machine's there"),
        "a foreign VM's MAC": (on_network(macAddress=foreign_mac), "AddressConflict",
                               f"MAC {foreign_mac} is already used there by another VM on the host"),
        "a machine type QEMU lacks": (machine_spec(access, machineType="no-such-machine"), "MachineTypeNotSupported",
                                      "machineType 'no-such-machine': the QEMU of host"),
    }
    with access.host.connect() as conn:
        foreign = conn.defineXML(foreign_domain_xml("someone-elses-vm", network, foreign_mac))
    try:
        async with namespace_of_a_tenant(api_client, control_plane, "shared-net-") as first, \
                namespace_of_a_tenant(api_client, control_plane, "shared-net-") as second:
            holder = await make(api_client, first, on_network(static={"addresses": [f"{taken}/24"]},
                                                              macAddress=their_mac))
            _, held = await condition(api_client, first, holder, "ImageNotFound")  # through every check: it holds them
            # The machine that asked first holds an address: creationTimestamp has one-second resolution and a tie
            # goes by name, so the others are made in a later second than the holder (else half of them, by their
            # random names, would count as first and the holder as the later one).
            await after_the_second_of(held["metadata"]["creationTimestamp"])
            names = {case: await make(api_client, second, spec) for case, (spec, _, _) in cases.items()}
            allowed = await make(api_client, second, on_network(static={"addresses": [f"{free}/24"]}))
            for case, name in names.items():
                _, reason, words = cases[case]
                found, _ = await condition(api_client, second, name, reason)
                assert words in found["message"], (case, found["message"])
                print(f"\n[addresses] {case}: {reason}: {found['message']}")
            await condition(api_client, second, allowed, "ImageNotFound")
            assert on_host(access, second) == [] and on_host(access, first) == []
    finally:
        with access.host.connect() as conn:
            conn.lookupByUUIDString(foreign.UUIDString()).undefine()
