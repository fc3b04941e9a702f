"""Orphans on a real libvirt host reached over qemu+tls, with the operator running as its RBAC user against a real
API server: a LibvirtMachine whose finalizer is force-removed leaves its domain and volumes; the orphan collector
reports them (LibvirtHost status, the capi_libvirt_orphans gauge, a Warning event) and removes them once the grace
period is over. Beside it, nothing that is not provably this management cluster's orphan is touched: a foreign
domain and volume, a domain and volumes with look-alike names, a domain of another management cluster, one of an
older release (no management cluster in its metadata), a live machine's domain, and the domain of a machine that
clusterctl move deleted here (delete-for-move), whose owner metadata is released and then rewritten by the adopting
copy in place: same domain, same ID, never restarted.

The domains need not boot: an empty disk is enough (they sit in the firmware)."""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import libvirt
import pytest
from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from capi_libvirt.api import meta
from capi_libvirt.core import domain_owner, domain_xml, naming, provider_id
from capi_libvirt.operator import config as operator_config
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv import capi_objects
from devenv.libvirt_host import LibvirtHost
from devenv.remote_access import RemoteAccess

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require
from waiting import CONVERGENCE_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SUBNET, LINK = "192.168.174.0/24", 174
GRACE_S = 10.0  # short here (an hour by default); long enough to see the report before the removal
BASE = "orphans-base.qcow2"
MERGE = {"_content_type": "application/merge-patch+json"}
DEADLINE_S = CONVERGENCE_S
FOREIGN_METADATA = "<metadata><x:machine xmlns:x='https://example.com/machine/v1'><x:uid>{uid}</x:uid>" \
    "</x:machine></metadata>"


def qcow2_volume_xml(name: str, capacity: int = 16 * 1024 * 1024) -> str:
    return f"<volume><name>{name}</name><capacity unit='bytes'>{capacity}</capacity>" \
        "<target><format type='qcow2'/></target></volume>"


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteAccess]:
    require_libvirt_host_prerequisites()
    for program in ("sshd", "ssh-keygen", "openssl", "nsenter"):
        require(__import__("shutil").which(program) is not None, f"{program} on PATH (apt packages of make deps)")
    host = LibvirtHost("orphans", SUBNET, log_dir=tmp_path_factory.mktemp("orphans-host-logs"))
    with RemoteAccess(host, link_index=LINK) as access:
        with host.connect() as conn:
            conn.storagePoolLookupByName(host.pool_name).createXML(qcow2_volume_xml(BASE), 0)
        yield access


@pytest.fixture(scope="module")
async def operator(control_plane, api_client, remote: RemoteAccess) -> AsyncIterator[None]:
    """The operator (short grace period, a round a second) with the host as a LibvirtHost over qemu+tls."""
    core, objects = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    secret = f"orphans-tls-{uuid.uuid4().hex[:6]}"  # host credentials live in the provider's namespace
    folder = remote.client_dir
    await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret), data={key: base64.b64encode((folder / file).read_bytes()).decode()
                                                         for key, file in (("ca.crt", "cacert.pem"),
                                                                           ("tls.crt", "clientcert.pem"),
                                                                           ("tls.key", "clientkey.pem"))}))
    config = operator_config.OperatorConfig(hosts={}, orphan_grace_s=GRACE_S, orphan_interval_s=1.0)
    async with operator_running(control_plane, {}, config):
        await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": remote.host.name},
            "spec": {"uri": f"qemu+tls://{remote.address}/system", "storagePool": remote.host.pool_name,
                     "credentialsSecretRef": {"name": secret, "namespace": PROVIDER_NAMESPACE},
                     "access": {"networks": [remote.host.network_name], "images": [BASE]}}})

        async def reachable():
            return (await host_status(api_client, remote.host.name)).get("reachable")
        await wait_until("the LibvirtHost to be reachable", reachable, DEADLINE_S)
        try:
            yield
        finally:
            await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", remote.host.name)

            async def host_gone():
                try:
                    await objects.get_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts",
                                                            remote.host.name)
                except client.exceptions.ApiException as error:
                    return error.status == 404
                return False
            try:
                await wait_until("the LibvirtHost to be gone", host_gone, 30)
            except AssertionError:  # machines left placed on it by a failed test: do not leave it to later tests
                await objects.patch_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", remote.host.name,
                                                          {"metadata": {"finalizers": []}}, **MERGE)
    await core.delete_namespaced_secret(secret, PROVIDER_NAMESPACE)


async def host_status(api_client, name: str) -> dict:
    body = await client.CustomObjectsApi(api_client).get_cluster_custom_object(meta.GROUP, meta.VERSION,
                                                                               "libvirthosts", name)
    return body.get("status") or {}


async def host_events(api_client, name: str) -> list[tuple[str, str, str]]:
    listed = await client.CoreV1Api(api_client).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name},involvedObject.kind=LibvirtHost")
    return [(e.type, e.reason, e.message) for e in listed.items]


def spec(remote: RemoteAccess) -> dict:
    return {"image": {"volume": BASE}, "storagePool": remote.host.pool_name, "domainType": "qemu", "cpus": 1,
            "memoryMiB": 128, "diskGiB": 1, "guestAgent": False, "host": remote.host.name,
            "interfaces": [{"network": remote.host.network_name}]}


def domain(conn: libvirt.virConnect, uid: str) -> libvirt.virDomain | None:
    try:
        return conn.lookupByUUIDString(naming.domain_uuid(uid))
    except libvirt.libvirtError as error:
        if error.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def volumes(conn: libvirt.virConnect, pool_name: str) -> set[str]:
    pool = conn.storagePoolLookupByName(pool_name)
    pool.refresh(0)
    return set(pool.listVolumes())


def machine_volumes(namespace: str, name: str, uid: str) -> set[str]:
    return {naming.overlay_volume_name(namespace, name, uid), naming.nocloud_volume_name(namespace, name, uid),
            naming.serial_log_file_name(namespace, name, uid)}


def define_plain(conn: libvirt.virConnect, name: str, disk: str, metadata: str = "") -> None:
    """A domain someone else made: no owner metadata of ours (or another tool's), one disk."""
    conn.defineXML(f"<domain type='qemu'><name>{name}</name>{metadata}<memory unit='MiB'>64</memory><vcpu>1</vcpu>"
                   "<os><type arch='x86_64' machine='q35'>hvm</type></os><devices><disk type='file' device='disk'>"
                   f"<driver name='qemu' type='qcow2'/><source file='{disk}'/><target dev='vda' bus='virtio'/></disk>"
                   "</devices></domain>")


def define_ours(conn: libvirt.virConnect, pool_dir: str, owner: domain_owner.Owner) -> str:
    """A domain as an operator of this provider defines it (of another management cluster, or an older release)."""
    overlay = naming.overlay_volume_name(owner.namespace, owner.name, owner.uid)
    config = domain_xml.DomainConfig(name=naming.domain_name(owner.namespace, owner.name, owner.uid),
                                     uuid=naming.domain_uuid(owner.uid), vcpus=1, memory_mib=64,
                                     disk_path=f"{pool_dir}/{overlay}", owner=owner, domain_type="qemu",
                                     guest_agent=False)
    conn.defineXML(domain_xml.domain_xml(config))
    return overlay


async def test_an_orphan_is_reported_then_removed_and_nothing_else_is_touched(
        api_client, namespace, remote: RemoteAccess, operator) -> None:
    started = time.monotonic()
    objects, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    management = (await core.read_namespace("kube-system")).metadata.uid
    host, pool = remote.host.name, remote.host.pool_name
    await capi_objects.create_cluster(api_client, namespace, "demo")
    uids = {}
    for name in ("keep", "gone", "moved"):
        await capi_objects.create_machine(api_client, namespace, "demo", name, "#cloud-config\n", spec(remote))

    async def machine(name: str) -> dict | None:
        try:
            return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                              name)
        except client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise

    async def all_running():
        for name in ("keep", "gone", "moved"):
            body = await machine(name)
            if not (body and (body.get("status") or {}).get("state") == "running"):
                return None
            uids[name] = naming.identity_uid(body)
        return True
    await wait_until("three machines' domains to run", all_running, DEADLINE_S)

    with remote.host.connect() as conn:
        pool_dir = conn.storagePoolLookupByName(pool).XMLDesc().split("<path>")[1].split("</path>")[0]
        owner = domain_owner.parse_owner(domain(conn, uids["gone"]).XMLDesc(0))
        assert owner is not None and owner.management_cluster == management  # the kube-system Namespace's UID
        gone_domain = naming.domain_name(namespace, "gone", uids["gone"])
        # What is not ours, or not provably this management cluster's orphan:
        look_alike = f"capi-{namespace}-gone-0badc0de"  # our naming scheme, someone else's domain
        stray = naming.overlay_volume_name(namespace, "stray", str(uuid.uuid4()))  # exact scheme, no domain
        lookalike_of_orphan = naming.overlay_volume_name(namespace, "gone", uids["gone"]) + ".bak"
        other_owner = domain_owner.Owner(namespace, "elsewhere", str(uuid.uuid4()), "demo", str(uuid.uuid4()))
        older_owner = domain_owner.Owner(namespace, "older", str(uuid.uuid4()), "demo", None)
        storage = conn.storagePoolLookupByName(pool)
        foreign_volumes = ["foreign-disk.qcow2", f"{look_alike}.qcow2", stray, lookalike_of_orphan]
        foreign_volumes += [define_ours(conn, pool_dir, other_owner), define_ours(conn, pool_dir, older_owner)]
        for name in foreign_volumes:
            storage.createXML(qcow2_volume_xml(name), 0)
        define_plain(conn, "foreign-vm", f"{pool_dir}/foreign-disk.qcow2")
        define_plain(conn, look_alike, f"{pool_dir}/{look_alike}.qcow2", FOREIGN_METADATA.format(uid=uids["gone"]))
        foreign_domains = ["foreign-vm", look_alike, naming.domain_name(namespace, "elsewhere", other_owner.uid),
                           naming.domain_name(namespace, "older", older_owner.uid)]
        moved_id = domain(conn, uids["moved"]).ID()

    # clusterctl move deletes the source copy: annotate, delete, strip the finalizers.
    await objects.patch_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "moved", {
        "metadata": {"annotations": {machine_reconcile.DELETE_FOR_MOVE_ANNOTATION: ""}}}, **MERGE)
    await force_delete(objects, namespace, "moved")

    def released():
        with remote.host.connect() as conn:
            owner = domain_owner.parse_owner(domain(conn, uids["moved"]).XMLDesc(0))
            return owner is not None and owner.management_cluster is None
    await wait_until("the moved-away domain's owner metadata to be released", async_(released), DEADLINE_S)

    # A finalizer force-removed while the operator did not tear the machine down (paused here, so it waits).
    await objects.patch_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "gone", {
        "metadata": {"annotations": {meta.PAUSED_ANNOTATION: ""}}}, **MERGE)
    await force_delete(objects, namespace, "gone")

    async def reported():
        orphans = (await host_status(api_client, host)).get("orphans") or {}
        pending = REGISTRY.get_sample_value("capi_libvirt_orphans", {"host": host, "state": "pending"})
        with remote.host.connect() as conn:
            present = domain(conn, uids["gone"]) is not None  # reported, not removed yet
        return orphans if gone_domain in orphans.get("domains", []) and pending == 1 and present else None
    report = await wait_until("the orphan in LibvirtHost status and the gauge, still on the host", reported,
                              DEADLINE_S, interval=0.2)
    assert report["count"] == 1 and report["gracePeriodSeconds"] == int(GRACE_S)

    def removed():
        with remote.host.connect() as conn:
            left = machine_volumes(namespace, "gone", uids["gone"]) & volumes(conn, pool)
            return domain(conn, uids["gone"]) is None and not left
    await wait_until("the orphan's domain and volumes to be removed", async_(removed), DEADLINE_S)

    async def settled():
        orphans = (await host_status(api_client, host)).get("orphans") or {}
        return orphans if orphans.get("count") == 0 and orphans.get("removed") == 1 else None
    final = await wait_until("the status to show the removal", settled, DEADLINE_S)

    async def both_events():  # posted in the background, so perhaps a moment after what they tell
        events = await host_events(api_client, host)
        found = any(t == "Warning" and r == "OrphanFound" and gone_domain in m for t, r, m in events)
        return events if found and any(r == "OrphanRemoved" for _, r, _ in events) else None
    events = await wait_until("the OrphanFound and OrphanRemoved events", both_events, DEADLINE_S)
    removal = [m for t, r, m in events if t == "Warning" and r == "OrphanRemoved"]
    assert len(removal) == 1 and f"{namespace}/gone" in removal[0] and gone_domain in removal[0]
    removed_domains = REGISTRY.get_sample_value("capi_libvirt_orphans_removed_total", {"host": host, "kind": "domain"})
    removed_volumes = REGISTRY.get_sample_value("capi_libvirt_orphans_removed_total", {"host": host, "kind": "volume"})
    assert (removed_domains, removed_volumes) == (1, 3)  # overlay, NoCloud ISO, serial log

    # Everything else is still there, untouched.
    with remote.host.connect() as conn:
        names = {d.name() for d in conn.listAllDomains()}
        assert set(foreign_domains) <= names
        present = volumes(conn, pool)
        assert set(foreign_volumes) <= present
        keep, moved = domain(conn, uids["keep"]), domain(conn, uids["moved"])
        assert keep is not None and keep.isActive() and machine_volumes(namespace, "keep", uids["keep"]) <= present
        assert moved is not None and moved.ID() == moved_id  # the grace period passed: a moved-away domain stays
        assert machine_volumes(namespace, "moved", uids["moved"]) <= present
    kept = set(final["kept"])
    assert {f"{foreign_domains[2]} (OtherManagementCluster)", f"{foreign_domains[3]} (NoProof)",
            f"{naming.domain_name(namespace, 'moved', uids['moved'])} (MovedAway)"} <= kept, kept
    assert final["strayVolumes"] == 1  # `stray`; the look-alikes are another domain's disk or not in our scheme

    # The move target's copy adopts the domain: its owner metadata is rewritten in place, the domain keeps running.
    copy = await adopting_copy(api_client, namespace, "moved", uids["moved"], host, spec(remote))
    assert copy["metadata"]["uid"] != uids["moved"]

    def adopted():
        with remote.host.connect() as conn:
            owner = domain_owner.parse_owner(domain(conn, uids["moved"]).XMLDesc(0))
            return owner is not None and owner.management_cluster == management
    await wait_until("the adopting copy to record this management cluster", async_(adopted), DEADLINE_S)
    with remote.host.connect() as conn:
        moved = domain(conn, uids["moved"])
        assert moved.isActive() and moved.ID() == moved_id  # neither redefined nor restarted
        inactive = domain_owner.parse_owner(moved.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        assert inactive is not None and inactive.management_cluster == management  # the persistent definition too

    async def owner_recorded_event():
        listed = await core.list_namespaced_event(namespace,
                                                  field_selector=f"involvedObject.uid={copy['metadata']['uid']}")
        return "OwnerRecorded" in [e.reason for e in listed.items]
    await wait_until("the OwnerRecorded event on the adopting copy", owner_recorded_event, DEADLINE_S)

    for name in ("keep", "moved"):  # torn down by the operator as usual
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    async def all_gone():
        return all([await machine(name) is None for name in ("keep", "moved")])
    await wait_until("the remaining machines to be deleted", all_gone, DEADLINE_S)
    with remote.host.connect() as conn:
        assert set(foreign_domains) <= {d.name() for d in conn.listAllDomains()}
        assert set(foreign_volumes) <= volumes(conn, pool)
    print(f"\n[orphans] found 1 domain + 3 volumes (reported in status, gauge and a Warning event), removed "
          f"{removed_domains:.0f} domain + {removed_volumes:.0f} volumes after the {GRACE_S:.0f}s grace period; "
          f"untouched: {len(foreign_domains)} foreign/other-cluster/older-release domains, {len(foreign_volumes)} "
          f"foreign or look-alike volumes, 1 live machine, 1 moved-away domain (then adopted in place, same ID); "
          f"{time.monotonic() - started:.1f}s")


def async_(probe):
    """A synchronous probe for wait_until."""
    async def run():
        return probe()
    return run


async def force_delete(objects: client.CustomObjectsApi, namespace: str, name: str) -> None:
    """Delete, then strip the finalizers (as clusterctl move does, and as a user forcing a deletion does)."""
    await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)
    with contextlib.suppress(client.exceptions.ApiException):  # 404: the operator released it already
        await objects.patch_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name,
                                                     {"metadata": {"finalizers": []}}, **MERGE)

    async def gone():
        try:
            await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)
        except client.exceptions.ApiException as error:
            return error.status == 404
        return False
    await wait_until(f"LibvirtMachine {name} to be gone", gone, DEADLINE_S)


async def adopting_copy(api_client, namespace: str, name: str, identity: str, host: str, libvirt_spec: dict) -> dict:
    """The LibvirtMachine as clusterctl move creates it on the target: same name and spec, the providerID, the identity
    annotation and the finalizer, a new UID, no status; owned by the (still present) Machine."""
    objects = client.CustomObjectsApi(api_client)
    owner = await objects.get_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "machines",
                                                       name)
    return await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine",
        "metadata": {"name": name, "labels": {meta.CLUSTER_NAME_LABEL: "demo"},
                     "annotations": {naming.IDENTITY_ANNOTATION: identity},
                     "finalizers": [machine_reconcile.FINALIZER],
                     "ownerReferences": [{"apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine",
                                          "name": name, "uid": owner["metadata"]["uid"], "controller": True}]},
        "spec": {**libvirt_spec, "providerID": provider_id.format_provider_id(host, naming.domain_uuid(identity))}})
