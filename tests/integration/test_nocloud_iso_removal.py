"""The NoCloud ISO (the bootstrap data) leaves the host once the node joined, on a real libvirtd with the operator
running: three iPXE guests (devenv.ipxe_image: they boot in a second or two, nothing in them reads the ISO, which is
all this needs) are provisioned with their ISOs in; then each Machine gets a status.nodeRef.

Stand-in: the test sets Machine.status.nodeRef itself, in place of Cluster API's Machine controller (which sets it
once a Node with the machine's providerID exists; tests/e2e/test_whole_cluster.py has the real one, with a real
kubelet). Then:
- a machine by default: the ISO is ejected from the running domain and its persistent definition, the volume is
  deleted, status.noCloudISORemoved is true and a Normal event says so; the domain keeps running (same libvirt ID);
- `keepNoCloudISO: true`: the ISO stays in and on the host, status.noCloudISORemoved is false, and its seed has no
  vendor-data (the others' seeds carry the one that keeps cloud-init off once the seed is gone);
- a crash between the two steps: the operator's host connection fails right after the eject (a fault injected into
  the running operator's connection, no hook in production code), the state a crash there leaves (ejected, volume
  still on the host) is checked, and the next pass deletes the volume.
Deleting the machines afterwards leaves the host clean, ISO or no ISO.
"""

from __future__ import annotations

import io

import libvirt
import pycdlib
import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta, reasons
from capi_libvirt.core import cloud_init, domain_xml_edits, naming
from capi_libvirt.hypervisor import errors
from devenv import capi_objects, ipxe_image
from devenv.libvirt_host import LibvirtHost
from guests import provider_objects, refreshed_pool

from fixtures_control_plane import operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require
from waiting import CONVERGENCE_S, events_posted, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HOST_NAME, SUBNET = "iso-int", "192.168.184.0/24"
BASE = "iso-ipxe.qcow2"
CLUSTER = "iso"
DEADLINE_S = CONVERGENCE_S
MERGE = {"_content_type": "application/merge-patch+json"}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    require_libvirt_host_prerequisites()
    require(ipxe_image.IPXE_ISO.exists(), f"{ipxe_image.IPXE_ISO} (Debian's ipxe package, make system-deps)")
    image = ipxe_image.ipxe_qcow2(tmp_path_factory.mktemp("ipxe"), BASE)
    with LibvirtHost(HOST_NAME, SUBNET, dnsmasq_options=["no-ping"],
                     log_dir=tmp_path_factory.mktemp("iso-host-logs")) as started:
        with started.connect() as conn:
            ipxe_image.upload_base(conn, started.pool_name, image, BASE)
        yield started


def iso_state(host: LibvirtHost, namespace: str, name: str, uid: str) -> dict:
    """Where the machine's NoCloud ISO is: in the running domain's CD-ROM, in its persistent definition's, in the
    pool; and the domain's libvirt ID (another one: it was restarted)."""
    return iso_state_of(host, naming.domain_uuid(uid), naming.nocloud_volume_name(namespace, name, uid))


def iso_state_of(host: LibvirtHost, uuid: str, iso: str) -> dict:
    with host.connect() as conn:
        domain = conn.lookupByUUIDString(uuid)
        live = domain_xml_edits.cdrom_sources(domain.XMLDesc(0))
        persistent = domain_xml_edits.cdrom_sources(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        return {"live": any(path.endswith("/" + iso) for path in live),
                "persistent": any(path.endswith("/" + iso) for path in persistent),
                "volume": iso in refreshed_pool(conn, host.pool_name).listVolumes(),
                "id": domain.ID()}


def iso_file(host: LibvirtHost, iso: str, name: str) -> bytes | None:
    """A file of the NoCloud ISO `iso` in the host's pool (a local folder here), by its Rock Ridge name; None if
    absent."""
    image = pycdlib.PyCdlib()
    image.open(str(host.pool_dir / iso))
    try:
        names = {c.rock_ridge.name().decode() for c in image.list_children(rr_path="/") if c.is_file()}
        if name not in names:
            return None
        out = io.BytesIO()
        image.get_file_from_iso_fp(out, rr_path=f"/{name}")
        return out.getvalue()
    finally:
        image.close()


async def test_the_iso_leaves_the_host_once_the_node_joined_unless_kept_and_a_crash_between_eject_and_delete_converges(
        control_plane, api_client, namespace, host):
    objects = client.CustomObjectsApi(api_client)
    await capi_objects.create_cluster(api_client, namespace, CLUSTER)
    spec = ipxe_image.machine_spec(host.pool_name, host.network_name, BASE)
    names = {"dropped": {}, "kept": {"keepNoCloudISO": True}, "crashed": {}}

    async def body(name: str) -> dict:
        return await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    async with operator_running(control_plane, {host.name: host.uri}) as memo:
        # The fault: the operator's own connection to the host fails once, right after the "crashed" machine's eject
        # returned, before the delete; what the host then holds is recorded.
        async def started():
            return "runtime" in memo
        await wait_until("the operator started", started, DEADLINE_S, interval=0.1)
        operated = memo.runtime.deps.hosts.get(host.name)
        real_eject = operated.eject_nocloud
        after_eject: list[dict] = []

        async def fail_after_eject(uuid: str, iso_volume: str):
            result = await real_eject(uuid, iso_volume)
            if "-crashed-" in iso_volume and not after_eject:
                after_eject.append({"ejected": result, **iso_state_of(host, uuid, iso_volume)})
                raise errors.HostUnreachable("connection lost right after the eject (a fault the test injects)",
                                             host.name)
            return result
        operated.eject_nocloud = fail_after_eject

        for name, extra in names.items():
            await capi_objects.create_machine(api_client, namespace, CLUSTER, name, "#cloud-config\n",
                                              {**spec, **extra})

        async def all_provisioned():
            bodies = [await body(name) for name in names]
            done = all((b.get("status") or {}).get("initialization", {}).get("provisioned") for b in bodies)
            return {b["metadata"]["name"]: b for b in bodies} if done else None
        provisioned = await wait_until("3 iPXE machines provisioned", all_provisioned, DEADLINE_S)
        uids = {name: b["metadata"]["uid"] for name, b in provisioned.items()}
        before = {name: iso_state(host, namespace, name, uids[name]) for name in names}
        for name, state in before.items():
            assert (state["live"], state["persistent"], state["volume"]) == (True, True, True), \
                f"{name}: the ISO stays while the node has not joined: {state}"
            assert "noCloudISORemoved" not in provisioned[name]["status"]
            # The seed tells cloud-init to stay off after its first boot unless the ISO is kept (core.cloud_init).
            vendor_data = iso_file(host, naming.nocloud_volume_name(namespace, name, uids[name]), "vendor-data")
            assert vendor_data == (None if name == "kept" else cloud_init.DISABLE_AFTER_FIRST_BOOT), (name, vendor_data)

        # Cluster API's part (stand-in): the Nodes joined.
        for name in names:
            await objects.patch_namespaced_custom_object_status(
                meta.CAPI_GROUP, meta.CAPI_VERSION, namespace, "machines", name,
                {"status": {"nodeRef": {"name": naming.hostname(name)}}}, **MERGE)

        async def all_decided():
            bodies = {name: await body(name) for name in names}
            decided = {name: (b.get("status") or {}).get("noCloudISORemoved") for name, b in bodies.items()}
            return bodies if decided == {"dropped": True, "kept": False, "crashed": True} else None
        bodies = await wait_until("the ISOs removed, and the kept one kept", all_decided, DEADLINE_S)

        after = {name: iso_state(host, namespace, name, uids[name]) for name in names}
        for name in ("dropped", "crashed"):
            assert (after[name]["live"], after[name]["persistent"], after[name]["volume"]) == (False, False, False), \
                f"{name}: ejected from the running domain and its definition, the volume deleted: {after[name]}"
            assert after[name]["id"] == before[name]["id"], f"{name}: the domain was not restarted"
        assert (after["kept"]["live"], after["kept"]["persistent"], after["kept"]["volume"]) == (True, True, True)
        [crash] = after_eject
        assert crash["ejected"] == ["live", "persistent"], crash
        assert (crash["live"], crash["persistent"], crash["volume"]) == (False, False, True), \
            f"what a crash between the two steps leaves: ejected, the volume still there: {crash}"

        core = client.CoreV1Api(api_client)
        for name in names:
            if name == "kept":
                events = (await core.list_namespaced_event(namespace,
                                                           field_selector=f"involvedObject.name={name}")).items
                assert [e for e in events if e.reason == reasons.NOCLOUD_ISO_REMOVED] == []
                continue
            [event] = await events_posted(core, namespace, reasons.NOCLOUD_ISO_REMOVED,
                                          f"involvedObject.name={name}")
            assert event.type == "Normal" and f"volume {naming.nocloud_volume_name(namespace, name, uids[name])} " \
                "deleted" in event.message, event.message
            # The crashed one's eject was in the pass that failed: the event of the pass that finished says delete.
            assert ("ejected from the domain (live and persistent)" in event.message) == (name == "dropped"), \
                event.message
            assert bodies[name]["status"]["ready"] is True
        print(f"\n[numbers] NoCloud ISO removal on iPXE guests: before the nodeRef {before['dropped']}, after "
              f"{after['dropped']}; kept {after['kept']}; crashed between the steps: host after the eject "
              f"{crash}, converged {after['crashed']}")

        # Deleting machines whose ISO is gone (and one whose ISO is there) leaves the host clean.
        for name in names:
            await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

        async def clean():
            listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                 "libvirtmachines")
            return not listed["items"] and provider_objects(host, BASE) == []
        await wait_until("the machines deleted and the host clean", clean, DEADLINE_S)
