"""The two things timed, round by round: the operator making and removing N machines, and the floor, the same
libvirt work done by a plain script with one connection and a fixed number of threads.

A round of ours: create N bootstrap Secrets, Machines and LibvirtMachines (as Cluster API does) -> all N domains
running on the host -> all N provisioned (an address in status) -> delete the N LibvirtMachines -> all gone and the
host clean. The floor's round: overlay, NoCloud ISO upload, define, start for each -> all running -> all N MACs hold
a DHCP lease -> destroy, undefine, delete the volumes -> host clean.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import io
import time
import uuid
import xml.etree.ElementTree as ET

import libvirt
from kubernetes_asyncio import client, config, watch

from bench import measure, testbed
from capi_libvirt.api import meta, v1alpha1
from capi_libvirt.core import cloud_init, domain_owner, domain_xml, naming, nocloud, volume_xml
from devenv import base_image

ROUND_TIMEOUT_S = 900.0
PROVISION_TIMEOUT_S = 180.0  # a guest whose DHCP never succeeded must not hang the run: the round says so instead
USER_DATA = "#cloud-config\n{}\n"


@dataclasses.dataclass
class Round:
    n: int
    running_s: float
    provisioned_s: float | None  # None: not all N provisioned within PROVISION_TIMEOUT_S (see `unprovisioned`)
    delete_s: float
    cpu_s: float | None = None  # the operator's, over the whole round
    rss_mb: float | None = None  # the operator's, once all N were provisioned
    api: dict | None = None  # the operator's requests: {"verb resource": count}
    libvirt_operations: float | None = None
    idle: dict | None = None  # the operator idling over the N provisioned machines (see idle_cost)
    unprovisioned: int = 0
    # Why, for each machine not provisioned in time: its AddressesDiscovered condition and whether the host's network
    # leased its MAC (no lease: the guest's DHCP never completed; a lease: the provider did not publish it).
    unprovisioned_why: list[str] = dataclasses.field(default_factory=list)


async def idle_cost(bed: testbed.Bed, seconds: float) -> dict:
    """The operator's CPU seconds, RSS and API requests over `seconds` of doing nothing asked of it."""
    assert bed.operator is not None
    before_api = measure.api_requests(await asyncio.to_thread(bed.apiserver_metrics))
    before = measure.process_sample(bed.operator.pid)
    await asyncio.sleep(seconds)
    after = measure.process_sample(bed.operator.pid)
    after_api = measure.api_requests(await asyncio.to_thread(bed.apiserver_metrics))
    requests = measure.difference(after_api, before_api, {})
    return {"seconds": seconds, "cpu_s": after.cpu_s - before.cpu_s, "rss_mb": after.rss_mb,
            "cpu_percent_of_core": 100 * (after.cpu_s - before.cpu_s) / seconds,
            "api": {f"{verb} {resource}": count for (verb, resource), count in sorted(requests.items())},
            "api_totals": measure.split(requests)}


def started_running(bed: testbed.Bed, domain_prefix: str, n: int, started_wall: float, seen_s: float) -> float:
    """Seconds from the round's start until libvirtd started the last of its N domains (their QEMU logs,
    measure.last_start); `seen_s`, the contender's own view, when the logs do not say."""
    last = measure.last_start(bed.workdir / "libvirt-logs" / "qemu", domain_prefix, n, started_wall)
    return seen_s if last is None else last - started_wall


class Ours:
    """Rounds through the operator: the bench plays Cluster API with its own API client, counting its requests."""

    def __init__(self, bed: testbed.Bed) -> None:
        self.bed = bed
        self.own: dict[measure.Key, int] = {}
        self.round = 0

    def _count(self, verb: str, resource: str, times: int = 1) -> None:
        self.own[(verb, resource)] = self.own.get((verb, resource), 0) + times

    async def run(self, n: int, idle_s: float = 0) -> Round:
        """One round; with `idle_s`, the operator also idles that long over the N provisioned machines (measured)."""
        self.round += 1
        prefix = f"r{self.round}-"
        assert self.bed.plane is not None and self.bed.operator is not None
        configuration = client.Configuration()
        await config.load_kube_config(config_file=str(self.bed.plane.kubeconfig_path), client_configuration=configuration)
        conn = await asyncio.to_thread(libvirt.open, self.bed.tls_uri)
        async with client.ApiClient(configuration) as api:
            objects = client.CustomObjectsApi(api)
            self.own = {}
            before_api = measure.api_requests(await asyncio.to_thread(self.bed.apiserver_metrics))
            before_ops = measure.operator_operations(self.bed.operator_metrics())
            before_cpu = measure.process_sample(self.bed.operator.pid)
            listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, testbed.NAMESPACE,
                                                                 "libvirtmachines")
            self._count("LIST", "libvirtmachines")
            tracker = Tracker(prefix)
            watching = asyncio.create_task(self._watch(objects, listed["metadata"]["resourceVersion"], tracker))
            try:
                started, started_wall = time.monotonic(), time.time()
                await asyncio.gather(*(self._create(api, f"{prefix}{i}") for i in range(n)))
                domain_prefix = f"{naming.PREFIX}-{testbed.NAMESPACE}-{prefix}"  # capi-bench-rK-
                running = await asyncio.to_thread(measure.wait_until, lambda: measure.running_domains(
                    conn, domain_prefix) >= n, ROUND_TIMEOUT_S)
                try:
                    provisioned: float | None = await tracker.wait(lambda: tracker.provisioned >= n,
                                                                   PROVISION_TIMEOUT_S)
                except TimeoutError:
                    provisioned = None
                unprovisioned = n - tracker.provisioned
                why = await self._why_unprovisioned(objects, conn, tracker, prefix, n) if unprovisioned else []
                rss = measure.process_sample(self.bed.operator.pid).rss_mb
                idle = await idle_cost(self.bed, idle_s) if idle_s else None
                deleting = time.monotonic()
                await asyncio.gather(*(self._delete(objects, f"{prefix}{i}") for i in range(n)))
                await tracker.wait(lambda: tracker.gone >= n)
                done = await asyncio.to_thread(measure.wait_until, lambda: measure.host_clean(
                    conn, self.bed.host.pool_name, {testbed.BASE_VOLUME}), ROUND_TIMEOUT_S)
            finally:
                watching.cancel()
            after_cpu = measure.process_sample(self.bed.operator.pid)
            after_ops = measure.operator_operations(self.bed.operator_metrics())
            after_api = measure.api_requests(await asyncio.to_thread(self.bed.apiserver_metrics))
            operator_api = measure.difference(after_api, before_api, self.own)
            await self._remove_the_rest(api, prefix, n)
        await asyncio.to_thread(conn.close)
        return Round(n=n, running_s=started_running(self.bed, domain_prefix, n, started_wall, running - started),
                     provisioned_s=provisioned and provisioned - started,
                     unprovisioned=unprovisioned, unprovisioned_why=why, delete_s=done - deleting, cpu_s=after_cpu.cpu_s - before_cpu.cpu_s,
                     rss_mb=rss,
                     api={f"{verb} {resource}": count for (verb, resource), count in sorted(operator_api.items())},
                     libvirt_operations=after_ops - before_ops, idle=idle)

    async def _create(self, api: client.ApiClient, name: str) -> None:
        core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
        labels = {meta.CLUSTER_NAME_LABEL: testbed.CLUSTER}
        await core.create_namespaced_secret(testbed.NAMESPACE, client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, labels=labels), type="cluster.x-k8s.io/secret",
            data={"value": base64.b64encode(USER_DATA.encode()).decode(),
                  "format": base64.b64encode(b"cloud-config").decode()}))
        machine = await objects.create_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, testbed.NAMESPACE,
                                                                "machines", {
            "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine",
            "metadata": {"name": name, "labels": labels},
            "spec": {"clusterName": testbed.CLUSTER, "bootstrap": {"dataSecretName": name},
                     "infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtMachine", "name": name}}})
        await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, testbed.NAMESPACE, "libvirtmachines", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtMachine",
            "metadata": {"name": name, "labels": labels, "ownerReferences": [{
                "apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Machine", "name": name,
                "uid": machine["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": testbed.machine_spec(self.bed.host.pool_name, self.bed.host.network_name)})
        for resource in ("secrets", "machines", "libvirtmachines"):
            self._count("POST", resource)

    async def _why_unprovisioned(self, objects: client.CustomObjectsApi, conn: libvirt.virConnect, tracker: Tracker,
                                 prefix: str, n: int) -> list[str]:
        leased = await asyncio.to_thread(measure.leased_macs, conn, self.bed.host.network_name or "")
        why = []
        for name in (f"{prefix}{i}" for i in range(n)):
            if name in tracker.done:
                continue
            body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, testbed.NAMESPACE,
                                                              "libvirtmachines", name)
            self._count("GET", "libvirtmachines")
            found = {c["type"]: f"{c.get('reason')}: {c.get('message')}"
                     for c in (body.get("status") or {}).get("conditions") or []}
            mac = naming.mac_address(body["metadata"]["uid"], 0)
            why.append(f"{name}: {'leased' if mac in leased else 'no lease for'} {mac}; "
                       f"AddressesDiscovered {found.get('AddressesDiscovered')}; Ready {found.get('Ready')}")
        return why

    async def _delete(self, objects: client.CustomObjectsApi, name: str) -> None:
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, testbed.NAMESPACE, "libvirtmachines",
                                                      name)
        self._count("DELETE", "libvirtmachines")

    async def _watch(self, objects: client.CustomObjectsApi, resource_version: str, tracker: Tracker) -> None:
        while True:
            self._count("WATCH", "libvirtmachines")
            stream = watch.Watch().stream(objects.list_namespaced_custom_object, meta.GROUP, meta.VERSION,
                                          testbed.NAMESPACE, "libvirtmachines", resource_version=resource_version,
                                          timeout_seconds=3600)
            async for event in stream:
                body = event["object"]
                resource_version = body["metadata"]["resourceVersion"]
                tracker.see(event["type"], body)

    async def _remove_the_rest(self, api: client.ApiClient, prefix: str, n: int) -> None:
        """The Machines and Secrets (no Cluster API controller here to collect them), after the measurement."""
        core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
        for i in range(n):
            await objects.delete_namespaced_custom_object(meta.CAPI_GROUP, meta.CAPI_VERSION, testbed.NAMESPACE,
                                                          "machines", f"{prefix}{i}")
            await core.delete_namespaced_secret(f"{prefix}{i}", testbed.NAMESPACE)


class Tracker:
    """What the watch saw of this round's machines."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.done: set[str] = set()
        self.deleted: set[str] = set()
        self.changed = asyncio.Event()

    @property
    def provisioned(self) -> int:
        return len(self.done)

    @property
    def gone(self) -> int:
        return len(self.deleted)

    def see(self, kind: str, body: dict) -> None:
        name = body["metadata"]["name"]
        if not name.startswith(self.prefix):
            return
        if kind == "DELETED":
            self.deleted.add(name)
        elif (body.get("status") or {}).get("initialization", {}).get("provisioned"):
            self.done.add(name)
        self.changed.set()

    async def wait(self, predicate, timeout: float = ROUND_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout
        while not predicate():
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"round {self.prefix}: {self.provisioned} provisioned, {self.gone} gone")
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                pass
        return time.monotonic()


class Floor:
    """The same libvirt work without the operator: what the provider's rounds cannot go below."""

    def __init__(self, bed: testbed.Bed, concurrency: int) -> None:
        self.bed, self.concurrency = bed, concurrency
        self.round = 0

    def run(self, n: int) -> Round:
        self.round += 1
        host = self.bed.host
        spec = v1alpha1.LibvirtMachineSpec.model_validate(testbed.machine_spec(host.pool_name, host.network_name))
        uids = [str(uuid.uuid4()) for _ in range(n)]
        names = [f"f{self.round}-{i}" for i in range(n)]
        with self.bed.connect() as conn, concurrent.futures.ThreadPoolExecutor(self.concurrency) as threads:
            pool = conn.storagePoolLookupByName(host.pool_name)
            pool_dir = ET.fromstring(pool.XMLDesc()).findtext("./target/path")
            base = pool.storageVolLookupByName(testbed.BASE_VOLUME)
            started, started_wall = time.monotonic(), time.time()
            macs = list(threads.map(lambda args: self._create(conn, pool, pool_dir, base, spec, *args),
                                    zip(names, uids, strict=True)))
            running = time.monotonic()
            try:
                provisioned: float | None = measure.wait_until(
                    lambda: set(macs) <= measure.leased_macs(conn, host.network_name), PROVISION_TIMEOUT_S)
            except TimeoutError:
                provisioned = None
            unleased = sorted(set(macs) - measure.leased_macs(conn, host.network_name))
            deleting = time.monotonic()
            list(threads.map(lambda args: self._delete(conn, *args), zip(names, uids, strict=True)))
            done = measure.wait_until(lambda: measure.host_clean(conn, host.pool_name, {testbed.BASE_VOLUME}),
                                      ROUND_TIMEOUT_S)
        domain_prefix = f"{naming.PREFIX}-{testbed.NAMESPACE}-f{self.round}-"
        return Round(n=n, running_s=started_running(self.bed, domain_prefix, n, started_wall, running - started),
                     provisioned_s=provisioned and provisioned - started, unprovisioned=len(unleased), unprovisioned_why=[f"no lease for {mac}" for mac in unleased],
                     delete_s=done - deleting)

    @staticmethod
    def _create(conn: libvirt.virConnect, pool: libvirt.virStoragePool, pool_dir: str, base: libvirt.virStorageVol,
                spec: v1alpha1.LibvirtMachineSpec, name: str, uid: str) -> str:
        ns = testbed.NAMESPACE
        overlay, iso_name = naming.overlay_volume_name(ns, name, uid), naming.nocloud_volume_name(ns, name, uid)
        capacity = max(spec.disk_gib * 1024**3, base.info()[1])
        pool.createXML(volume_xml.overlay_volume_xml(overlay, capacity, base.path(), "qcow2"), 0)
        config_ = domain_xml.from_spec(spec, name=naming.domain_name(ns, name, uid), uuid=naming.domain_uuid(uid),
                                       disk_path=f"{pool_dir}/{overlay}", iso_path=f"{pool_dir}/{iso_name}",
                                       serial_log_path=f"{pool_dir}/{naming.serial_log_file_name(ns, name, uid)}",
                                       owner=domain_owner.Owner(namespace=ns, name=name, uid=uid))
        iso = nocloud.build_nocloud_iso(USER_DATA.encode(), cloud_init.meta_data(naming.domain_uuid(uid), name, "x"),
                                        cloud_init.network_config(spec.interfaces, [config_.interfaces[0].mac]))
        volume = pool.createXML(volume_xml.raw_volume_xml(iso_name, len(iso)), 0)
        base_image.upload(conn, volume, io.BytesIO(iso), len(iso))
        conn.defineXML(domain_xml.domain_xml(config_)).create()
        return config_.interfaces[0].mac

    def _delete(self, conn: libvirt.virConnect, name: str, uid: str) -> None:
        ns = testbed.NAMESPACE
        domain = conn.lookupByUUIDString(naming.domain_uuid(uid))
        domain.destroy()
        domain.undefine()
        pool = conn.storagePoolLookupByName(self.bed.host.pool_name)
        for volume in (naming.overlay_volume_name(ns, name, uid), naming.nocloud_volume_name(ns, name, uid),
                       naming.serial_log_file_name(ns, name, uid)):
            try:
                pool.storageVolLookupByName(volume).delete(0)
            except libvirt.libvirtError:
                pool.refresh(0)  # the serial log is a file the pool has not seen yet
                try:
                    pool.storageVolLookupByName(volume).delete(0)
                except libvirt.libvirtError as error:
                    if error.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
                        raise
