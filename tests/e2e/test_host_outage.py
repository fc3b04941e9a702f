"""Host outages and lost hosts, on real parts: two libvirt hosts reached over qemu+tls through veth links into their
network namespaces (devenv.remote_access), cut off by setting the link down, iPXE guests (devenv.ipxe_image) that boot
in seconds, the real API server, and in the second test the real Cluster API core controller with a real
MachineHealthCheck.

0. A busy host is not a lost one: its libvirtd paused for 3 s out of every 3 (SIGSTOP, a millisecond's run between)
   answers every call late, a probe included, while libvirt's keepalive still gets its answers; the host stays
   reachable (its Ready condition says ProbeSlow, never HostUnreachable) and takes the machine created meanwhile, which
   is provisioned there once the daemon runs freely again.
1. A host cut off mid-provision (its link down right after a domain was defined there): that machine waits with
   HostUnreachable and is never moved (a domain of it may run there), however long the outage; a machine on the same
   host with no domain yet is placed on the other host once the outage outlasts the re-placement timeout; when the
   link comes back, the first machine converges on its host, and what the moved one left there is removed.
2. A host lost for good under a provisioned machine of a MachineDeployment: the machine reports HostUnreachable,
   Cluster API's MachineHealthCheck finds its Machine unhealthy and remediates it; the deletion waits on the host until
   the LibvirtHost is marked `decommissioned`, which releases it with a Warning naming the domain and volumes left
   there; the MachineSet's replacement runs on the live host, and the old Machine is gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time

import libvirt
import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import naming, provider_id
from capi_libvirt.reconcile import machine as machine_reconcile
from devenv import capi_objects, ipxe_image, workload_cluster
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost, run
from guests import host_objects, provider_objects

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from prereq import require
from waiting import events_posted, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

HOSTS = (("outage-a", "192.168.171.0/24", 171), ("outage-b", "192.168.172.0/24", 172))
BASE = "outage-ipxe.qcow2"  # on both hosts
ONLY_ON_B = "outage-ipxe-b.qcow2"  # on the second host only: a machine of it placed on the first cannot be made there
PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 4.0  # the operator's --host-probe-timeout in the busy-host test (20 s by default)
PAUSED_S, RUNNING_S = 3.0, 0.001  # the busy host's libvirtd: paused, then running, over and over
REPLACE_AFTER_S = 20.0
DEADLINE_S = 180.0
MERGE = {"_content_type": "application/merge-patch+json"}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    require(ipxe_image.IPXE_ISO.exists(), f"{ipxe_image.IPXE_ISO} (Debian's ipxe package, make system-deps)")
    image = ipxe_image.ipxe_qcow2(tmp_path_factory.mktemp("ipxe"), BASE)
    with contextlib.ExitStack() as stack:
        accesses = []
        for name, subnet, link in HOSTS:
            access = stack.enter_context(ra.RemoteAccess(LibvirtHost(name, subnet, dnsmasq_options=["no-ping"]), link))
            with access.host.connect() as conn:
                ipxe_image.upload_base(conn, access.host.pool_name, image, BASE)
                if name == HOSTS[1][0]:
                    ipxe_image.upload_base(conn, access.host.pool_name, image, ONLY_ON_B)
            accesses.append(access)
        yield accesses
        for access in accesses:
            set_link(access, up=True)  # a failed test may have left one down


def set_link(access: ra.RemoteAccess, *, up: bool) -> None:
    """The host's link as the operator sees it. Down: the link's addresses get an `unreachable` route, so connections
    fail at once and nothing for them leaves by the default route (without it they would: 198.18.0.0/15 is not
    private, and something out there answered TLS on it); calls in flight hang until libvirt's keepalive gives up."""
    if up:
        run(["ip", "route", "del", "unreachable", str(access.link_network)], check=False)
        run(["ip", "link", "set", access.root_link, "up"])
    else:
        run(["ip", "link", "set", access.root_link, "down"])
        run(["ip", "route", "replace", "unreachable", str(access.link_network)])


def left_on(access: ra.RemoteAccess) -> list[str]:
    """Every domain and volume on the host but the base images."""
    return [thing for thing in provider_objects(access.host, BASE) if thing != f"volume {ONLY_ON_B}"]


def of_machine(access: ra.RemoteAccess, namespace: str, name: str, uid: str) -> list[str]:
    """What of one machine is on the host: its domain, overlay, NoCloud ISO, serial log."""
    return host_objects(access.host, naming.domain_uuid(uid), [
        naming.overlay_volume_name(namespace, name, uid), naming.nocloud_volume_name(namespace, name, uid),
        naming.serial_log_file_name(namespace, name, uid)])


async def add_host(api_client, namespace: str, name: str, access: ra.RemoteAccess, **spec) -> None:
    """A LibvirtHost over qemu+tls and its credentials Secret (in the provider's namespace, the only one host
    credentials may live in); its access rules allow the test's namespace both base images and the host's network."""
    folder = access.client_dir
    data = {"ca.crt": folder / "cacert.pem", "tls.crt": folder / "clientcert.pem", "tls.key": folder / "clientkey.pem"}
    await client.CoreV1Api(api_client).create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=name),
        data={key: base64.b64encode(path.read_bytes()).decode() for key, path in data.items()}))
    await client.CustomObjectsApi(api_client).create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
        "spec": {"uri": f"qemu+tls://{access.address}/system", "storagePool": access.host.pool_name,
                 "credentialsSecretRef": {"name": name, "namespace": PROVIDER_NAMESPACE},
                 "access": {"namespaces": [namespace], "images": [BASE, ONLY_ON_B],
                            "networks": [access.host.network_name]}, **spec}})


async def patch_host(api_client, name: str, spec: dict) -> None:
    await client.CustomObjectsApi(api_client).patch_cluster_custom_object(
        meta.GROUP, meta.VERSION, "libvirthosts", name, {"spec": spec}, **MERGE)


async def delete_hosts(api_client, names) -> None:
    objects = client.CustomObjectsApi(api_client)
    for name in names:
        with contextlib.suppress(client.exceptions.ApiException):
            await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)
        with contextlib.suppress(client.exceptions.ApiException):
            await client.CoreV1Api(api_client).delete_namespaced_secret(name, PROVIDER_NAMESPACE)

    async def gone():
        listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
        return not [h for h in listed["items"] if h["metadata"]["name"] in names]
    await wait_until("the LibvirtHosts gone", gone, 60)


class Machines:
    """LibvirtMachines of one namespace, read from the API."""

    def __init__(self, api_client, namespace: str) -> None:
        self.objects, self.core, self.namespace = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client), \
            namespace

    async def get(self, name: str) -> dict | None:
        try:
            return await self.objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, self.namespace,
                                                                   "libvirtmachines", name)
        except client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise

    async def provisioned(self, name: str, what: str) -> dict:
        """The LibvirtMachine `name` once provisioned (`what` names the wait)."""
        async def done():
            body = await self.get(name)
            return body if provisioned(body) else None
        return await wait_until(what, done, DEADLINE_S)

    async def all(self) -> list[dict]:
        return (await self.objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, self.namespace,
                                                                 "libvirtmachines"))["items"]


def condition(body: dict | None, type_: str) -> dict:
    return next((c for c in ((body or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def host_of(body: dict) -> str:
    return provider_id.parse_provider_id(body["spec"]["providerID"]).host


def provisioned(body: dict | None) -> bool:
    return bool(((body or {}).get("status") or {}).get("initialization", {}).get("provisioned"))


def domains_of(access: ra.RemoteAccess, uid: str) -> list[str]:
    """The domain of this machine identity on the host, if any (over the host's local socket)."""
    with access.host.connect() as conn:
        try:
            return [conn.lookupByUUIDString(naming.domain_uuid(uid)).name()]
        except libvirt.libvirtError:
            return []


class Clock:
    def __init__(self) -> None:
        self.start, self.marks = time.monotonic(), []

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic() - self.start, what))

    def report(self) -> str:
        return "\n".join(f"  {at:6.1f} s  {what}" for at, what in self.marks)


async def libvirt_host_ready(api_client, name: str) -> dict:
    body = await client.CustomObjectsApi(api_client).get_cluster_custom_object(meta.GROUP, meta.VERSION,
                                                                              "libvirthosts", name)
    return condition(body, "Ready")


async def test_a_busy_host_stays_reachable_and_takes_the_machine_made_meanwhile(
        control_plane, api_client, namespace, hosts):
    a, _b = hosts
    machines = Machines(api_client, namespace)
    await add_host(api_client, namespace, "busy-a", a)
    await capi_objects.create_cluster(api_client, namespace, "busy", infrastructure_kind="ProxmoxCluster")
    clock = Clock()
    async with operator_running(control_plane, {}, probe_interval_s=PROBE_INTERVAL_S, probe_timeout_s=PROBE_TIMEOUT_S,
                                replace_after_s=REPLACE_AFTER_S):
        try:
            async def reachable():
                ready = await libvirt_host_ready(api_client, "busy-a")
                return ready if ready.get("reason") == "Reachable" else None
            await wait_until("busy-a reachable", reachable, 60)
            seen: list[tuple[float, str, str]] = []  # (when, Ready status, reason) at each change

            async def watch_ready() -> None:
                while True:
                    ready = await libvirt_host_ready(api_client, "busy-a")
                    if not seen or seen[-1][1:] != (ready.get("status"), ready.get("reason")):
                        seen.append((time.monotonic() - clock.start, ready.get("status"), ready.get("reason")))
                    await asyncio.sleep(0.5)
            watcher = asyncio.ensure_future(watch_ready())
            try:
                with a.host.answering_slowly(PAUSED_S, RUNNING_S):
                    clock.mark("busy-a's libvirtd paused now and then")

                    async def slow():
                        ready = await libvirt_host_ready(api_client, "busy-a")
                        return ready if ready.get("reason") == "ProbeSlow" else None
                    ready = await wait_until("busy-a's probe reported slow", slow, 90)
                    clock.mark("busy-a's probe reported slow")
                    assert ready["status"] == "True" and "connection is" in ready["message"], ready
                    await capi_objects.create_machine(api_client, namespace, "busy", "busy-0", "#cloud-config\n",
                                                      ipxe_image.machine_spec(a.host.pool_name, a.host.network_name,
                                                                              BASE))

                    async def placed():  # the placement's record: the providerID names the host
                        body = await machines.get("busy-0")
                        return body if ((body or {}).get("spec") or {}).get("providerID") and \
                            host_of(body) == "busy-a" else None
                    await wait_until("the machine placed on the busy host", placed, 90)
                    clock.mark("the machine made meanwhile placed on busy-a")
                    assert (await libvirt_host_ready(api_client, "busy-a"))["reason"] == "ProbeSlow", \
                        "placed while the host's probe was late"
                    await asyncio.sleep(4 * PROBE_TIMEOUT_S)  # more late probes while the machine is being made
                clock.mark("busy-a's libvirtd runs freely again")

                body = await machines.provisioned("busy-0", "the machine provisioned on busy-a")
                clock.mark("the machine provisioned on busy-a")
                assert host_of(body) == "busy-a"
                await wait_until("busy-a reachable again", reachable, 60)
                assert not watcher.done(), watcher  # it watched all along (an error of its own would end it)
            finally:
                watcher.cancel()
            reasons_seen = {reason for _at, _status, reason in seen}
            assert "ProbeSlow" in reasons_seen and reasons_seen <= {"Reachable", "ProbeSlow"}, seen
            assert {status for _at, status, _reason in seen} == {"True"}, seen
            machine_reasons = {e.reason for e in (await machines.core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=busy-0")).items}
            assert "HostUnreachable" not in machine_reasons, machine_reasons
            await machines.objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                                   "libvirtmachines", "busy-0")

            async def gone():
                return not await machines.all()
            await wait_until("the machine deleted", gone, 120)
        finally:
            await delete_hosts(api_client, ["busy-a"])
    assert left_on(a) == [], "nothing left on the host"
    print(f"\n[numbers] busy host (libvirtd paused {PAUSED_S:g} s of every {PAUSED_S + RUNNING_S:g} s, probe "
          f"timeout {PROBE_TIMEOUT_S:g} s):\n{clock.report()}\n  its Ready condition: "
          + ", ".join(f"{reason} at {at:.0f} s" for at, _status, reason in seen))


async def test_a_host_cut_off_mid_provision_keeps_its_machine_and_a_machine_without_domain_moves(
        control_plane, api_client, namespace, hosts):
    a, b = hosts
    machines = Machines(api_client, namespace)
    await add_host(api_client, namespace, "outage-a", a)
    await add_host(api_client, namespace, "outage-b", b, unschedulable=True)  # until both machines are on outage-a
    await capi_objects.create_cluster(api_client, namespace, "outage", infrastructure_kind="ProxmoxCluster")
    clock = Clock()
    async with operator_running(control_plane, {}, probe_interval_s=PROBE_INTERVAL_S,
                                replace_after_s=REPLACE_AFTER_S) as memo:
        try:
            # A machine placed on outage-a that cannot be made there (its base image is on outage-b only): no domain.
            stranded = await capi_objects.create_machine(
                api_client, namespace, "outage", "stranded", "#cloud-config\n",
                ipxe_image.machine_spec(a.host.pool_name, a.host.network_name, ONLY_ON_B))

            async def stranded_on_a():
                body = await machines.get("stranded")
                return body if condition(body, "Provisioned").get("reason") == "ImageNotFound" else None
            body = await wait_until("the stranded machine placed on outage-a, its image missing", stranded_on_a, 60)
            assert host_of(body) == "outage-a"
            assert body["metadata"]["annotations"][machine_reconcile.DOMAIN_RECORD_ANNOTATION] == ""

            # The link goes down right after the next domain is defined: mid-provision, before it is started. The
            # fault comes through the host the running operator uses (no hook in production code): its define
            # returns, then the link is cut.
            cut = []
            host_a = memo.runtime.deps.hosts.get("outage-a")
            real_define = host_a.define_domain

            async def cut_after_define(uuid: str, xml: str):
                result = await real_define(uuid, xml)
                if not cut:
                    set_link(a, up=False)
                    cut.append(time.monotonic())
                    clock.mark("outage-a cut off right after a domain was defined there")
                return result
            host_a.define_domain = cut_after_define
            await capi_objects.create_machine(api_client, namespace, "outage", "midway", "#cloud-config\n",
                                              ipxe_image.machine_spec(a.host.pool_name, a.host.network_name, BASE))

            async def midway_unreachable():
                body = await machines.get("midway")
                return body if condition(body, "Provisioned").get("reason") == "HostUnreachable" else None
            body = await wait_until("the cut-off machine waiting with HostUnreachable", midway_unreachable, DEADLINE_S)
            clock.mark("the cut-off machine reports HostUnreachable")
            assert cut and host_of(body) == "outage-a"
            assert body["metadata"]["annotations"][machine_reconcile.DOMAIN_RECORD_ANNOTATION] == "outage-a"
            assert condition(body, "Ready")["status"] == "False"
            midway_uid = body["metadata"]["uid"]
            assert domains_of(a, midway_uid), "the domain was defined before the cut"

            await patch_host(api_client, "outage-b", {"unschedulable": False})

            async def stranded_moved():
                body = await machines.get("stranded")
                return body if provisioned(body) and host_of(body) == "outage-b" else None
            body = await wait_until("the machine without domain placed on outage-b and provisioned", stranded_moved,
                                    DEADLINE_S)
            clock.mark("the machine without domain re-placed on outage-b and provisioned there")
            moved_after = time.monotonic() - cut[0]
            assert moved_after >= REPLACE_AFTER_S, "moved before the re-placement timeout"
            assert body["metadata"]["annotations"][machine_reconcile.FORMER_HOSTS_ANNOTATION] == "outage-a"
            assert body["status"]["host"] == "outage-b"
            assert [a_["address"] for a_ in body["status"]["addresses"] if a_["type"] == "InternalIP"][0] \
                .startswith("192.168.172.")
            replaced = await events_posted(machines.core, machines.namespace, "Replaced",
                                           "involvedObject.name=stranded")
            assert replaced[0].type == "Warning" and "outage-a" in replaced[0].message
            stranded_uid = body["metadata"]["uid"]

            # The outage has lasted longer than the timeout: the machine with a domain on outage-a did not move.
            body = await machines.get("midway")
            assert host_of(body) == "outage-a" and body["status"]["host"] == "outage-a"
            assert condition(body, "Provisioned")["reason"] == "HostUnreachable"
            assert not domains_of(b, midway_uid), "never a second domain"

            set_link(a, up=True)
            clock.mark("outage-a's link up again")

            body = await machines.provisioned("midway", "the cut-off machine provisioned on its host")
            clock.mark("the cut-off machine provisioned on outage-a")
            assert host_of(body) == "outage-a" and body["status"]["state"] == "running"
            assert domains_of(a, midway_uid) and not domains_of(b, midway_uid)

            async def former_host_cleaned():
                body = await machines.get("stranded")
                return body if machine_reconcile.FORMER_HOSTS_ANNOTATION not in body["metadata"]["annotations"] \
                    else None
            await wait_until("what the moved machine left on outage-a removed", former_host_cleaned, 60)
            assert of_machine(a, namespace, "stranded", stranded_uid) == []
            assert domains_of(b, stranded_uid) and not domains_of(a, stranded_uid)

            objects = client.CustomObjectsApi(api_client)
            for made in (stranded.libvirt_machine, "midway"):
                await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace,
                                                              "libvirtmachines", made)

            async def all_gone():
                return not await machines.all()
            await wait_until("both machines deleted", all_gone, 120)
        finally:
            set_link(a, up=True)
            await delete_hosts(api_client, ["outage-a", "outage-b"])
    assert left_on(a) == [] and left_on(b) == [], "nothing left on either host"
    print(f"\n[numbers] host outage (probe every {PROBE_INTERVAL_S:g} s, re-placement after {REPLACE_AFTER_S:g} s):\n"
          f"{clock.report()}")


CLUSTER, DEPLOYMENT = "lost", "lost-workers"
MHC_TIMEOUT_S = 20
CAPI = f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"


async def test_a_machine_health_check_replaces_a_machine_on_a_lost_host_once_the_host_is_decommissioned(
        control_plane, capi_controller, api_client, namespace, hosts):
    a, b = hosts
    machines = Machines(api_client, namespace)
    objects = client.CustomObjectsApi(api_client)
    workload_cluster.install(control_plane)
    await add_host(api_client, namespace, "lost-a", a)
    await add_host(api_client, namespace, "lost-b", b, unschedulable=True)  # until the first machine is on lost-a
    clock = Clock()
    async with operator_running(control_plane, {}, probe_interval_s=PROBE_INTERVAL_S,
                                replace_after_s=REPLACE_AFTER_S):
        try:
            cluster = await workload_cluster.create_worker_cluster(api_client, control_plane, namespace, CLUSTER)
            await capi_objects.create_bootstrap_secret(api_client, namespace, CLUSTER, "lost-bootstrap",
                                                       "#cloud-config\n")
            await objects.create_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                          "machinehealthchecks", {
                "apiVersion": CAPI, "kind": "MachineHealthCheck", "metadata": {"name": DEPLOYMENT},
                "spec": {"clusterName": CLUSTER,
                         "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": DEPLOYMENT}},
                         # No kubelet in these guests: no Node check; the infrastructure's Ready, mirrored by Cluster
                         # API as the Machine's InfrastructureReady, is what says the machine is gone.
                         "checks": {"nodeStartupTimeoutSeconds": 0, "unhealthyMachineConditions": [
                             {"type": "InfrastructureReady", "status": "False", "timeoutSeconds": MHC_TIMEOUT_S}]}}})
            await workload_cluster.create_machine_deployment(
                api_client, cluster, DEPLOYMENT, ipxe_image.machine_spec(a.host.pool_name, a.host.network_name, BASE),
                "lost-bootstrap", replicas=1)

            async def one_provisioned():
                listed = [m for m in await machines.all() if provisioned(m)]
                return listed[0] if listed else None
            old = await wait_until("the first machine provisioned", one_provisioned, DEADLINE_S)
            assert host_of(old) == "lost-a"
            old_name, old_uid = old["metadata"]["name"], old["metadata"]["uid"]
            old_machine = next(r["name"] for r in old["metadata"]["ownerReferences"] if r["kind"] == "Machine")
            clock.mark("the first machine provisioned on lost-a")

            set_link(a, up=False)  # lost for good, as far as the operator can tell
            await patch_host(api_client, "lost-b", {"unschedulable": False})
            clock.mark("lost-a cut off for good")

            async def reports_unreachable():
                body = await machines.get(old_name)
                return body if condition(body, "Ready").get("reason") == "HostUnreachable" else None
            await wait_until("the machine on the lost host reports HostUnreachable", reports_unreachable, DEADLINE_S)
            clock.mark("its LibvirtMachine reports HostUnreachable")

            async def machine(name):
                try:
                    return await objects.get_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                                      "machines", name)
                except client.exceptions.ApiException as error:
                    if error.status == 404:
                        return None
                    raise

            async def remediated():
                body = await machine(old_machine)
                return body if body is not None and body["metadata"].get("deletionTimestamp") else None
            body = await wait_until("the MachineHealthCheck remediating the Machine", remediated, DEADLINE_S)
            health = condition(body, "HealthCheckSucceeded")
            assert health.get("status") == "False" and "InfrastructureReady" in health.get("message", ""), health
            clock.mark("the MachineHealthCheck marked the Machine unhealthy; Cluster API deletes it")

            async def deletion_waits():
                body = await machines.get(old_name)
                return body if condition(body, "Deleting").get("reason") == "HostUnreachable" else None
            await wait_until("the deletion waiting on the unreachable host", deletion_waits, DEADLINE_S)
            clock.mark("the deletion waits on the host (finalizer kept)")

            await patch_host(api_client, "lost-a", {"decommissioned": True})
            clock.mark("lost-a marked decommissioned")

            async def old_machine_gone():
                return await machine(old_machine) is None and await machines.get(old_name) is None
            await wait_until("the old Machine and LibvirtMachine gone", old_machine_gone, DEADLINE_S)
            clock.mark("the old Machine gone")
            warnings = await events_posted(machines.core, machines.namespace, "HostDecommissioned",
                                           f"involvedObject.name={old_name}")
            domain = naming.domain_name(namespace, old_name, old_uid)
            assert warnings[0].type == "Warning", warnings[0]
            assert f"domain {domain}" in warnings[0].message
            assert naming.overlay_volume_name(namespace, old_name, old_uid) in warnings[0].message
            assert domains_of(a, old_uid) == [domain], "what the Warning names is what remains on the lost host"

            async def replacement_running():
                listed = [m for m in await machines.all() if provisioned(m) and m["metadata"]["name"] != old_name]
                return listed[0] if listed else None
            replacement = await wait_until("the replacement provisioned", replacement_running, DEADLINE_S)
            clock.mark("the replacement provisioned on lost-b")
            assert host_of(replacement) == "lost-b" and replacement["status"]["host"] == "lost-b"
            assert domains_of(b, replacement["metadata"]["uid"])

            # Scale to nothing; what the lost host kept is the operator's to forget and the admin's to clear.
            await workload_cluster.scale(api_client, cluster, DEPLOYMENT, 0)

            async def none_left():
                return not await machines.all()
            await wait_until("the MachineDeployment at 0", none_left, 120)
            await objects.delete_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                          "clusters", CLUSTER)

            async def cluster_gone():
                return not (await objects.list_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, namespace,
                                                                        "clusters"))["items"]
            await wait_until("the Cluster gone", cluster_gone, 120)
        finally:
            await delete_hosts(api_client, ["lost-a", "lost-b"])  # no machine left on them: both can go
            set_link(a, up=True)
    assert left_on(b) == [], "nothing left on the live host"
    with a.host.connect() as conn:  # the admin's part on the lost host, once it is reachable again
        leftovers = clear_machine(conn, a.host.pool_name, namespace, old_name, old_uid)
    assert leftovers and left_on(a) == []
    print(f"\n[numbers] MachineHealthCheck remediation of a machine on a lost host (probe every "
          f"{PROBE_INTERVAL_S:g} s, MHC timeout {MHC_TIMEOUT_S} s):\n{clock.report()}")


def clear_machine(conn: libvirt.virConnect, pool_name: str, namespace: str, name: str, uid: str) -> list[str]:
    """Remove one machine's domain and volumes by hand (what an admin does on a host that comes back); their names."""
    removed = []
    with contextlib.suppress(libvirt.libvirtError):
        domain = conn.lookupByUUIDString(naming.domain_uuid(uid))
        with contextlib.suppress(libvirt.libvirtError):
            domain.destroy()
        domain.undefine()
        removed.append(f"domain {naming.domain_name(namespace, name, uid)}")
    pool = conn.storagePoolLookupByName(pool_name)
    pool.refresh(0)
    for volume in (naming.overlay_volume_name(namespace, name, uid), naming.nocloud_volume_name(namespace, name, uid),
                   naming.serial_log_file_name(namespace, name, uid)):
        with contextlib.suppress(libvirt.libvirtError):
            pool.storageVolLookupByName(volume).delete(0)
            removed.append(f"volume {volume}")
    return removed
