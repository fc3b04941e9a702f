"""Base images imported by URL and sha256, on a real libvirtd reached over qemu+tls through a LibvirtHost, with the
operator running as its RBAC user against a real API server, and an HTTP server of images on loopback in the
machine's own namespace (where the operator runs; the host gets the bytes through libvirt's upload stream).

The image is Debian's iPXE disk (bench/testbed.py's guest: it boots in a second or two), so a machine made from the
imported image really runs. Two machines wanting it at once make one download (counted at the server) and one image
volume, both overlays backed by it; a third machine later makes none; the image volume stays while machines use it
(and after: the provider never deletes an image), and the orphan collector counts it as no stray. A bad checksum, a
404, a pool too small for the Content-Length, an image that fits the pool's free space but not what placement may
still promise there (the tiny pool's storage overcommit is 0.5; that check comes first, so it answers the too-big
image too), a pool that fills while an image without Content-Length streams in, a redirect out of the allowed prefix
and a URL not under it each end in a clear condition, with nothing half-written left in any pool. The small pool is a
`dir` pool on a 1 MiB tmpfs, mounted in the host's daemons' mount namespace.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import random
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from capi_libvirt.core import images, naming
from capi_libvirt.operator import config as operator_config
from devenv import base_image, capi_objects, ipxe_image
from devenv.image_server import ImageServer, Served
from devenv.libvirt_host import LibvirtHost, dir_pool_xml
from devenv.remote_access import RemoteAccess

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require
from waiting import CONVERGENCE_S, Pending, wait_until

# Above the longest test's waits (four machines brought up one after another, each within DEADLINE_S), so a machine
# that does not converge fails with its own wait's message (its Provisioned condition), not pytest-timeout's.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(5 * CONVERGENCE_S)]

HOST, SUBNET, LINK = "image-kvm", "192.168.186.0/24", 186
TINY_POOL, TINY_MIB = "image-tiny", 1  # smaller than the 3 MiB raw image (the iPXE qcow2, 0.9 MiB, fits)
TINY_OVERCOMMIT = 0.5  # placement may promise half of the tiny pool: 512 KiB
DEADLINE_S = CONVERGENCE_S
USER_DATA = "#cloud-config\n"
MERGE = {"_content_type": "application/merge-patch+json"}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ImageServer, bytes, bytes, bytes]]:
    """The iPXE image under several paths, 3 MiB of random bytes (a raw image the tiny pool cannot hold), redirects."""
    require(ipxe_image.IPXE_ISO.exists(), f"{ipxe_image.IPXE_ISO} (Debian's ipxe package; make system-deps)")
    ipxe = ipxe_image.ipxe_qcow2(tmp_path_factory.mktemp("image-import")).read_bytes()
    big = random.Random(186).randbytes(3 * 1024 * 1024)
    half = random.Random(187).randbytes(600 * 1024)  # fits the tiny pool's free space, not what may be promised
    routes = {
        "/images/ipxe.qcow2": Served(ipxe),
        "/images/copy.qcow2": Served(ipxe),  # the bad-checksum case's own path (its hits are not the good one's)
        "/images/big.raw": Served(big),
        "/images/half.raw": Served(half),
        "/images/unsized.raw": Served(big[::-1], with_length=False),  # not big's digest: an import of its own
        "/images/escape.qcow2": Served(redirect="/private/ipxe.qcow2"),
        "/private/ipxe.qcow2": Served(ipxe),
    }
    with ImageServer(routes) as server:
        yield server, ipxe, big, half


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteAccess]:
    """The host, with its usual pool and a `dir` pool on a 1 MiB tmpfs (in its daemons' mount namespace)."""
    require_libvirt_host_prerequisites()
    for program in ("/usr/sbin/sshd", "openssl", "nsenter", "mount"):
        require(__import__("shutil").which(program) is not None, f"{program} (make test installs it)")
    host = LibvirtHost(HOST, SUBNET, log_dir=tmp_path_factory.mktemp("image-host-logs"))
    with RemoteAccess(host, link_index=LINK) as access:
        tiny = host.state_dir / "tiny-pool"
        host.mount_tmpfs(tiny, TINY_MIB)
        with host.connect() as conn:
            conn.storagePoolDefineXML(dir_pool_xml(TINY_POOL, tiny), 0).create(0)
        yield access


@pytest.fixture(scope="module")
async def operator(control_plane, api_client, remote: RemoteAccess, served):
    """The operator (orphan rounds every second, report only) and the host as a LibvirtHost over qemu+tls, allowing
    image URLs under the server's /images/ only."""
    server = served[0]
    core, objects = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    secret = f"image-tls-{uuid.uuid4().hex[:6]}"
    folder = remote.client_dir
    await core.create_namespaced_secret(PROVIDER_NAMESPACE, client.V1Secret(
        metadata=client.V1ObjectMeta(name=secret), data={key: base64.b64encode((folder / file).read_bytes()).decode()
                                                         for key, file in (("ca.crt", "cacert.pem"),
                                                                           ("tls.crt", "clientcert.pem"),
                                                                           ("tls.key", "clientkey.pem"))}))
    config = operator_config.OperatorConfig(hosts={}, orphan_grace_s=None, orphan_interval_s=1.0)
    async with operator_running(control_plane, {}, config) as memo:
        await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": HOST},
            "spec": {"uri": f"qemu+tls://{remote.address}/system", "storagePool": remote.host.pool_name,
                     "credentialsSecretRef": {"name": secret, "namespace": PROVIDER_NAMESPACE},
                     "access": {"networks": [remote.host.network_name],
                                "storagePools": [remote.host.pool_name, TINY_POOL],
                                "imageURLPrefixes": [server.url("/images/")]},
                     "overcommit": {"storagePools": {TINY_POOL: TINY_OVERCOMMIT}}}})

        async def reachable():
            return (await host_status(api_client)).get("reachable")
        await wait_until("the LibvirtHost to be reachable", reachable, DEADLINE_S)
        try:
            yield memo
        finally:
            await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", HOST)

            async def host_gone():
                listed = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
                return HOST not in {h["metadata"]["name"] for h in listed["items"]}
            try:
                await wait_until("the LibvirtHost to be gone", host_gone, 30)
            except AssertionError:  # machines left placed on it by a failed test: do not leave it to later tests
                await objects.patch_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", HOST,
                                                          {"metadata": {"finalizers": []}}, **MERGE)
    await core.delete_namespaced_secret(secret, PROVIDER_NAMESPACE)


@pytest.fixture
async def tenant(api_client, namespace) -> AsyncIterator[str]:
    await capi_objects.create_cluster(api_client, namespace, "demo")
    yield namespace
    await delete_machines(api_client, namespace)


async def host_status(api_client) -> dict:
    body = await client.CustomObjectsApi(api_client).get_cluster_custom_object(meta.GROUP, meta.VERSION,
                                                                               "libvirthosts", HOST)
    return body.get("status") or {}


def spec(remote: RemoteAccess, image: dict, pool: str | None = None) -> dict:
    """The iPXE guest (1 vCPU, 128 MiB), its image by URL; `pool`: the image's pool (the machine's disks stay in the
    host's pool: placement counts them against it, and the tiny pool could not hold one)."""
    return ipxe_image.machine_spec(remote.host.pool_name, remote.host.network_name) | {
        "image": image | ({"pool": pool} if pool else {})}


async def make(api_client, namespace: str, libvirt_spec: dict) -> str:
    name = f"m-{uuid.uuid4().hex[:6]}"
    await capi_objects.create_machine(api_client, namespace, "demo", name, USER_DATA, libvirt_spec)
    return name


async def machine(api_client, namespace: str, name: str) -> dict:
    return await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)


async def running(api_client, namespace: str, name: str) -> dict:
    async def probe():
        body = await machine(api_client, namespace, name)
        status = body.get("status") or {}
        if status.get("state") == "running":
            return body
        provisioned = {c["type"]: c for c in status.get("conditions", [])}.get("Provisioned") or {}
        return Pending(state=status.get("state"), provisioned=(provisioned.get("reason"), provisioned.get("message")))
    return await wait_until(f"{namespace}/{name}: its domain running", probe, DEADLINE_S)


async def condition(api_client, namespace: str, name: str, reason: str) -> tuple[dict, dict]:
    """The machine's Provisioned condition once its reason is `reason`, and the machine."""
    seen: list[dict] = []

    async def probe():
        body = await machine(api_client, namespace, name)
        found = {c["type"]: c for c in (body.get("status") or {}).get("conditions", [])}.get("Provisioned")
        seen[:] = [found] if found else []
        return (found, body) if found and found["reason"] == reason else None
    try:
        return await wait_until(f"{namespace}/{name}: Provisioned {reason}", probe, DEADLINE_S)
    except AssertionError as error:
        raise AssertionError(f"{error}; its Provisioned condition: {seen}") from None


async def delete_machines(api_client, namespace: str, names: list[str] | None = None) -> None:
    objects = client.CustomObjectsApi(api_client)
    listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
    names = [item["metadata"]["name"] for item in listed["items"]] if names is None else names
    for name in names:
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    async def gone():
        left = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
        return not {item["metadata"]["name"] for item in left["items"]} & set(names)
    await wait_until(f"LibvirtMachines {names} gone", gone, DEADLINE_S)


def pool_volumes(remote: RemoteAccess, pool_name: str) -> dict[str, str]:
    """Volume name -> its XML, the pool refreshed first (what is really in its folder)."""
    with remote.host.connect() as conn:
        pool = conn.storagePoolLookupByName(pool_name)
        for _attempt in range(50):  # a refresh is refused while an upload into the pool runs
            try:
                pool.refresh(0)
                break
            except Exception:  # noqa: BLE001
                time.sleep(0.1)
        return {name: pool.storageVolLookupByName(name).XMLDesc(0) for name in pool.listVolumes()}


def read_volume(remote: RemoteAccess, pool_name: str, name: str, length: int) -> bytes:
    """The first `length` bytes of a volume, read back through libvirt's download stream."""
    with remote.host.connect() as conn:
        volume = conn.storagePoolLookupByName(pool_name).storageVolLookupByName(name)
        stream = conn.newStream(0)
        volume.download(stream, 0, length, 0)
        chunks = []
        while chunk := stream.recv(1024 * 1024):
            chunks.append(chunk)
        stream.finish()
        return b"".join(chunks)


def backing_path(volume_xml: str) -> str | None:
    return ET.fromstring(volume_xml).findtext("./backingStore/path")


def plant(remote: RemoteAccess, name: str, fmt: str, data: bytes) -> None:
    """A volume as an import that never got its marker leaves it (cut short, or complete)."""
    with remote.host.connect() as conn:
        pool = conn.storagePoolLookupByName(remote.host.pool_name)
        volume = pool.createXML(f"<volume><name>{name}</name><capacity unit='bytes'>{max(len(data), 2**20)}"
                                f"</capacity><target><format type='{fmt}'/></target></volume>", 0)
        base_image.upload(conn, volume, io.BytesIO(data), len(data))


async def test_machines_share_one_import_and_boot_from_it(api_client, remote, served, operator, tenant):
    """Two machines at once: one download, one image volume, both domains running on overlays of it; a third later:
    no download; the image stays while machines use it and after; the orphan collector counts no stray volume.
    An import cut short before (a partial volume, no marker) is never taken for the image: replaced by the download;
    one that was complete but never marked is read back, hashed, marked and used: no download."""
    server, ipxe, big, _half = served
    digest = sha(ipxe)
    image = {"url": server.url("/images/ipxe.qcow2"), "sha256": digest}
    plant(remote, images.image_volume_name(digest), "qcow2", ipxe[:200 * 1024])  # cut short
    plant(remote, images.image_volume_name(sha(big)), "raw", big)  # complete, never marked
    started = time.monotonic()
    first, second = await asyncio.gather(make(api_client, tenant, spec(remote, image)),
                                         make(api_client, tenant, spec(remote, image)))
    bodies = await asyncio.gather(running(api_client, tenant, first), running(api_client, tenant, second))
    both_running_s = time.monotonic() - started
    assert server.hits("/images/ipxe.qcow2") == 1
    assert operator.runtime.deps.images.started == 1

    volumes = pool_volumes(remote, remote.host.pool_name)
    name = images.image_volume_name(digest)
    assert {v for v in volumes if digest in v} == {name, images.verified_marker_name(digest)}  # one image, marked
    image_path = ET.fromstring(volumes[name]).findtext("./target/path")
    for body in bodies:
        uid = naming.identity_uid(body)
        overlay = naming.overlay_volume_name(tenant, body["metadata"]["name"], uid)
        assert backing_path(volumes[overlay]) == image_path, overlay
    assert sha(read_volume(remote, remote.host.pool_name, name, len(ipxe))) == digest  # all of it arrived

    third = await make(api_client, tenant, spec(remote, image))
    await running(api_client, tenant, third)
    assert server.hits("/images/ipxe.qcow2") == 1  # found by its checksum: never fetched twice

    recovered = await make(api_client, tenant, spec(remote, {"url": server.url("/images/big.raw"),
                                                             "sha256": sha(big)}))
    await running(api_client, tenant, recovered)  # random bytes as a raw disk: the domain runs, boots nothing
    assert server.hits("/images/big.raw") == 0
    assert images.verified_marker_name(sha(big)) in pool_volumes(remote, remote.host.pool_name)

    await delete_machines(api_client, tenant, [first, second, recovered])
    assert name in pool_volumes(remote, remote.host.pool_name)  # the third machine's overlay still stands on it
    assert (await machine(api_client, tenant, third))["status"]["state"] == "running"

    async def no_stray():  # a round while a deleted machine's volumes were going counts them; image volumes stay
        orphans = (await host_status(api_client)).get("orphans") or {}
        return orphans if orphans.get("strayVolumes") == 0 and orphans.get("count") == 0 else None
    await wait_until("an orphan round with no stray volume and no orphan, the image volumes there", no_stray,
                     DEADLINE_S)
    assert {name, images.verified_marker_name(digest)} <= set(pool_volumes(remote, remote.host.pool_name))

    await delete_machines(api_client, tenant, [third])
    left = pool_volumes(remote, remote.host.pool_name)
    assert {name, images.verified_marker_name(digest)} <= set(left)  # kept for the next machine
    print(f"\n[numbers] image import: 2 machines at once -> {server.hits('/images/ipxe.qcow2')} download "
          f"({len(ipxe)} bytes), 1 image volume; both domains running {both_running_s:.1f} s after creation; "
          "a third machine -> 0 downloads")


async def test_a_bad_image_ends_in_a_clear_condition_and_leaves_nothing(api_client, remote, served, operator, tenant):
    """A bad checksum, a 404 (retried with backoff), a pool too small for the Content-Length, a pool filling up while
    an image without Content-Length streams in, a redirect out of the allowed prefix, and a URL not under it: each
    its condition, naming what went wrong; no image volume of theirs in any pool."""
    server, ipxe, big, half = served
    zeros, missing, escaped, private = "0" * 64, sha(b"missing"), sha(b"escaped"), sha(b"private")
    cases = {
        "checksum": (spec(remote, {"url": server.url("/images/copy.qcow2"), "sha256": zeros}),
                     "ImageChecksumMismatch", [zeros, sha(ipxe)]),
        "404": (spec(remote, {"url": server.url("/images/missing.qcow2"), "sha256": missing}),
                "ImageDownloadFailed", [server.url("/images/missing.qcow2"), "HTTP 404"]),
        "too big": (spec(remote, {"url": server.url("/images/big.raw"), "sha256": sha(big)}, TINY_POOL),
                    "InsufficientStorage", ["needs 3.0 MiB", f"pool {TINY_POOL}"]),
        "over the room": (spec(remote, {"url": server.url("/images/half.raw"), "sha256": sha(half)}, TINY_POOL),
                          "InsufficientStorage", ["needs 0.6 MiB", "placement may promise only", f"pool {TINY_POOL}"]),
        "fills up": (spec(remote, {"url": server.url("/images/unsized.raw"), "sha256": sha(big[::-1])},
                            TINY_POOL),
                     "InsufficientStorage", ["filled up", "the partial volume was removed"]),
        "redirect out": (spec(remote, {"url": server.url("/images/escape.qcow2"), "sha256": escaped}),
                         "TenantNotAllowed", ["redirects to", server.url("/private/ipxe.qcow2")]),
        "not allowed": (spec(remote, {"url": server.url("/private/ipxe.qcow2"), "sha256": private}),
                        "TenantNotAllowed", ["image.url", "spec.access.imageURLPrefixes"]),
    }
    names = dict(zip(cases, await asyncio.gather(*(make(api_client, tenant, case[0]) for case in cases.values())),
                     strict=True))
    for case, name in names.items():
        _, reason, words = cases[case]
        found, body = await condition(api_client, tenant, name, reason)
        for word in words:
            assert word in found["message"], (case, found["message"])
        print(f"[conditions] {case}: {reason}: {found['message']}")
        if case == "not allowed":  # refused before placement: nothing fetched, nothing placed
            assert not body["metadata"].get("finalizers") and not body["spec"].get("providerID")

    async def retried():  # the 404 is retried with backoff (the machine's own, 5 s doubling)
        return server.hits("/images/missing.qcow2") >= 2
    await wait_until("the 404 retried", retried, DEADLINE_S)
    assert server.hits("/private/ipxe.qcow2") == 0  # neither the redirect nor the URL outside the prefix was fetched

    # The machines retry while they exist (space may be freed), so a retry may be streaming into the tiny pool right
    # now (a warm make test at 91de725 caught one). Once they are deleted, the import running ends, removes its
    # partial volume, and nothing of theirs stays in either pool.
    await delete_machines(api_client, tenant, list(names.values()))

    async def tiny_pool_empty():
        return await asyncio.to_thread(pool_volumes, remote, TINY_POOL) == {}
    await wait_until(f"nothing half-written left in pool {TINY_POOL}", tiny_pool_empty, DEADLINE_S, 1.0)
    main = {v for v in pool_volumes(remote, remote.host.pool_name) if images.is_image_volume(v)}
    for digest in (zeros, missing, escaped, private):
        assert images.image_volume_name(digest) not in main and images.verified_marker_name(digest) not in main
    with remote.host.connect() as conn:  # and its space is back
        _state, capacity, _allocation, available = conn.storagePoolLookupByName(TINY_POOL).info()
        assert available > capacity // 2, (capacity, available)


@pytest.mark.parametrize(("image", "words"), [
    ({"volume": "base.qcow2", "url": "https://images.example.com/x.qcow2", "sha256": "a" * 64},
     "set exactly one of volume or url"),
    ({"url": "https://images.example.com/x.qcow2"}, "url needs sha256"),
    ({"url": "https://images.example.com/x.qcow2", "sha256": "A" * 64}, "sha256"),
])
async def test_the_api_server_refuses_an_image_that_is_not_one_source(api_client, namespace, image, words):
    """The CRD's own rules (CEL and patterns), before the operator ever sees the machine."""
    body = capi_objects.libvirt_machine_body("demo", "refused", str(uuid.uuid4()),
                                             {"image": image, "storagePool": "default"})
    with pytest.raises(client.exceptions.ApiException) as refused:
        await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtmachines", body)
    assert refused.value.status == 422 and words in refused.value.body, refused.value.body
