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

import base64
import shutil
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta
from capi_libvirt.core import naming
from devenv import capi_objects
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost

from fixtures_control_plane import OPERATOR_USER, PROVIDER_NAMESPACE, allow_secrets, operator_running
from prereq import require
from waiting import CONVERGENCE_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DEADLINE_S = CONVERGENCE_S
HOST_A, HOST_B = "tenant-kvm-a", "tenant-kvm-b"  # two LibvirtHosts of one hypervisor, with different access rules
BASE = "tenant-base.qcow2"  # listed on host A, and absent: an allowed machine gets as far as the host (ImageNotFound)
KERNELS = "/var/lib/capi-libvirt-kernels/"
USER_DATA = "#cloud-config\n# token: s3cr3t-tenant-bootstrap\n"


@pytest.fixture(scope="module")
def tls_host():
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost("tenants-tls", "192.168.176.0/24"), link_index=176) as access:
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
    async with operator_running(control_plane, {}):
        for name, access in ((HOST_A, access_a), (HOST_B, access_b)):
            await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
                "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
                "spec": {**common, "access": access}})
        for name in (HOST_A, HOST_B):
            async def reachable(name=name):
                return (await host_status(objects, name)).get("reachable")
            await wait_until(f"{name} reachable", reachable, DEADLINE_S)
        try:
            yield {"access": tls_host, "objects": objects}
        finally:
            for name in (HOST_A, HOST_B):
                await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)

            async def gone():
                listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
                return not {HOST_A, HOST_B} & {h["metadata"]["name"] for h in listed["items"]}
            await wait_until("the LibvirtHosts released", gone, DEADLINE_S)
            await core.delete_namespaced_secret(secret, PROVIDER_NAMESPACE)


@pytest.fixture
async def tenant(api_client, control_plane) -> AsyncIterator[str]:
    """Tenant A's namespace (tenant-a-*: host A allows it), its Secrets readable by the operator (allow_secrets)."""
    name = f"tenant-a-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    allow_secrets(control_plane, name)
    await capi_objects.create_cluster(api_client, name, "demo")
    yield name
    await delete_all_machines(api_client, name)
    await core.delete_namespace(name)


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
