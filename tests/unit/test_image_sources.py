"""Base images by URL and sha256, the pure parts: the API's one-source rule, image volume names, which URLs a host's
prefixes allow (and which never), the tenancy refusal, what a qcow2 header may not ask for, that image volumes are
never strays or orphans' volumes, and that machines wanting one image on one host wait for one import."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import types

import pydantic
import pytest

from capi_libvirt import download
from capi_libvirt.api import crd, v1alpha1, v1alpha1_host
from capi_libvirt.core import images, naming, orphans, tenancy
from capi_libvirt.core.domain_owner import Owner
from capi_libvirt.core.orphans import HostDomain
from capi_libvirt.hypervisor import images as host_images
from capi_libvirt.reconcile import images as reconcile_images
from devenv.memory_host import Hold, MemoryHost

pytestmark = pytest.mark.unit

SHA = hashlib.sha256(b"image").hexdigest()
URL = "https://images.example.com/capi/ubuntu-24.04.qcow2"
PREFIX = "https://images.example.com/capi/"


def spec(**image) -> v1alpha1.LibvirtMachineSpec:
    return v1alpha1.LibvirtMachineSpec.model_validate({"image": image})


@pytest.mark.parametrize("image", [
    {"url": URL, "sha256": SHA},
    {"url": URL, "sha256": SHA, "pool": "images"},
    {"volume": "ubuntu.qcow2"},
])
def test_an_image_is_a_volume_or_a_url_with_its_sha256(image):
    assert spec(**image).image.model_dump(exclude_none=True) == image


@pytest.mark.parametrize("image", [
    {},
    {"volume": "ubuntu.qcow2", "url": URL, "sha256": SHA},  # both
    {"url": URL},  # no checksum
    {"volume": "ubuntu.qcow2", "sha256": SHA},  # a checksum for a volume
    {"url": URL, "sha256": SHA.upper()},  # lowercase hex only
    {"url": URL, "sha256": SHA[:63]},
    {"url": "ftp://images.example.com/x.qcow2", "sha256": SHA},
    {"url": "https://user:pw@images.example.com/x.qcow2", "sha256": SHA},
    {"url": "https://images.example.com", "sha256": SHA},  # no path
    {"url": "https://images.example.com/x.qcow2#frag", "sha256": SHA},
])
def test_anything_else_is_refused(image):
    with pytest.raises(pydantic.ValidationError):
        spec(**image)


def test_the_crd_has_the_same_rules_in_cel():
    image = crd.structural(v1alpha1.LibvirtMachineSpec)["properties"]["image"]
    rules = {rule["rule"] for rule in image["x-kubernetes-validations"]}
    assert rules == {"has(self.volume) != has(self.url)", "has(self.url) == has(self.sha256)"}
    assert image["properties"]["sha256"]["pattern"] == v1alpha1.SHA256


def test_an_image_volume_is_named_by_its_checksum_and_marked_apart():
    assert images.image_volume_name(SHA) == f"capi-image-sha256-{SHA}"
    assert images.verified_marker_name(SHA) == f"capi-image-sha256-{SHA}.verified"
    assert images.is_image_volume(images.image_volume_name(SHA)) and images.is_image_volume(
        images.verified_marker_name(SHA))
    for other in ("capi-image-sha256-abc", f"capi-image-sha256-{SHA}.qcow2", "capi-ns-m-0123abcd.qcow2", "base.qcow2"):
        assert not images.is_image_volume(other)
    with pytest.raises(ValueError):
        images.image_volume_name("../etc")


@pytest.mark.parametrize("url", [URL, PREFIX + "sub/dir/image.raw", PREFIX + "image.qcow2?token=abc"])
def test_a_url_under_a_prefix_is_allowed(url):
    assert images.url_allowed(url, [PREFIX])


@pytest.mark.parametrize("url", [
    "https://images.example.com/other/x.qcow2",  # another path
    "https://images.example.com.evil.org/capi/x.qcow2",  # another host (prefixes always end their host with /)
    "http://images.example.com/capi/x.qcow2",  # another scheme
    PREFIX + "../secret/x.qcow2", PREFIX + "a/../../x", PREFIX + "./x.qcow2",  # dot segments escape when resolved
    PREFIX + "%2e%2e/secret", PREFIX + "%2E%2E/secret",  # also percent-encoded
    PREFIX + "a\\..\\..\\x", PREFIX + "a//x", PREFIX + "x#frag",
    "https://user@images.example.com/capi/x.qcow2",
])
def test_a_url_outside_or_escaping_the_prefix_is_not(url):
    assert not images.url_allowed(url, [PREFIX])


def test_no_url_is_allowed_by_default_and_the_refusal_says_where_to_allow_it():
    machine = spec(url=URL, sha256=SHA)
    refused = tenancy.refusal("kvm1", v1alpha1_host.HostAccess(), "default", "team-a", machine)
    assert refused is not None and refused.field == "imageURLPrefixes"
    assert URL in refused.message and "spec.access.imageURLPrefixes" in refused.message and "none" in refused.message
    allowed = v1alpha1_host.HostAccess.model_validate({"imageURLPrefixes": [PREFIX]})
    assert tenancy.refusal("kvm1", allowed, "default", "team-a", machine) is None
    assert tenancy.refusal("kvm1", tenancy.UNRESTRICTED, "default", "team-a", machine) is None  # --host hosts


def test_an_imported_image_is_never_named_as_a_volume():
    """It may be an import in progress: a machine names it by URL and sha256, which waits for the marker."""
    anything = v1alpha1_host.HostAccess.model_validate({"images": ["*"]})
    refused = tenancy.refusal("kvm1", anything, "default", "t", spec(volume=images.image_volume_name(SHA)))
    assert refused is not None and "image.url" in refused.message


@pytest.mark.parametrize("prefix", ["https://images.example.com", "images.example.com/", "https://a@b/", "file:///x/"])
def test_a_prefix_must_fix_the_host(prefix):
    with pytest.raises(pydantic.ValidationError):
        v1alpha1_host.HostAccess.model_validate({"imageURLPrefixes": [prefix]})


def qcow2_header(version: int = 3, backing_offset: int = 0, incompatible: int = 0, size: int = 2**30) -> bytes:
    header = bytearray(images.HEADER_BYTES)
    header[0:4] = images.QCOW2_MAGIC
    header[4:8] = version.to_bytes(4, "big")
    header[8:16] = backing_offset.to_bytes(8, "big")
    header[24:32] = size.to_bytes(8, "big")
    header[72:80] = incompatible.to_bytes(8, "big")
    return bytes(header)


def test_a_qcow2_header_gives_the_format_and_disk_size():
    assert images.inspect_header(qcow2_header(size=5 * 2**30)) == images.ImageFormat("qcow2", 5 * 2**30)
    assert images.inspect_header(qcow2_header(version=2)[:72]).format == "qcow2"
    assert images.inspect_header(b"\x00" * 512).format == "raw"  # anything else is a raw disk, never probed further
    assert images.inspect_header(b"").format == "raw"


@pytest.mark.parametrize(("header", "words"), [
    (qcow2_header(backing_offset=0x200), "backing file"),
    (qcow2_header(incompatible=images.QCOW2_EXTERNAL_DATA_FILE), "external file"),
    (qcow2_header(version=4), "version 4"),
    (qcow2_header()[:40], "truncated"),
])
def test_a_qcow2_with_a_host_file_behind_it_is_refused(header, words):
    with pytest.raises(images.ImageRefused, match=words):
        images.inspect_header(header)


def test_image_volumes_are_never_strays_nor_an_orphans_volumes():
    uid = "0b0e0000-0000-4000-8000-000000000001"
    name = images.image_volume_name(SHA)
    domain = HostDomain(uuid=naming.domain_uuid(uid), name=naming.domain_name("ns", "m", uid), owner=None,
                        paths=frozenset({f"/pool/{naming.overlay_volume_name('ns', 'm', uid)}"}))
    assert orphans.stray_volumes([name, images.verified_marker_name(SHA)], [domain]) == []
    assert name not in orphans.owned_volume_names(Owner("ns", "m", uid, "c", None))


def test_messages_never_show_a_urls_query():
    assert download.shown(URL + "?X-Signature=secret") == URL + "?..."
    assert download.shown(URL) == URL


class Served:
    """The image's download, in memory (download.open_image's stand-in: no server here): `length`, `received` and
    `read` as a download has them; a read waits for `gate` when the test holds it, and raises `error` when set."""

    def __init__(self, data: bytes = b"image") -> None:
        self.data, self.length, self.received = data, len(data), 0
        self.gate: threading.Event | None = None
        self.error: Exception | None = None

    def read(self, size: int = 1 << 20) -> bytes:
        if self.gate is not None:
            self.gate.wait(5)
        if self.error is not None:
            raise self.error
        chunk, self.data = self.data[:size], self.data[size:]
        self.received += len(chunk)
        return chunk

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


@pytest.fixture(autouse=True)
def served(monkeypatch) -> list[Served]:
    """Every download a test's imports open, in order; each serves the image whose sha256 is SHA."""
    opened: list[Served] = []

    def open_image(url: str, allowed) -> Served:
        assert allowed(url), url
        opened.append(Served())
        return opened[-1]
    monkeypatch.setattr(reconcile_images.download, "open_image", open_image)
    return opened


async def imports_finished(imports: reconcile_images.ImageImports) -> None:
    """Every import running now has ended and its done-callback has run (the machines woken, a failure kept): awaited,
    never slept for, since a loaded machine outlasts any fixed sleep (10 ms did not do, on Python 3.12 beside the
    first pytest run)."""
    await asyncio.gather(*(entry.task for entry in list(imports._running.values())), return_exceptions=True)
    await asyncio.sleep(0)  # the done-callbacks, called soon after the tasks end


def importing_host() -> tuple[MemoryHost, Hold]:
    """kvm1 in memory, its next image import held until the test releases it (a download takes its time)."""
    host = MemoryHost("kvm1")
    return host, host.hold("import_image")


async def test_machines_wanting_one_image_on_one_host_wait_for_one_import():
    (host, release), now = importing_host(), [0.0]
    imports = reconcile_images.ImageImports(clock=lambda: now[0])
    image = v1alpha1.ImageSource(url=URL, sha256=SHA)
    woken: list[str] = []
    for _machine in range(3):
        with pytest.raises(reconcile_images.Wait) as waiting:
            await imports.ensure(host, "default", image, [PREFIX], woken.append)
        assert waiting.value.reason == "ImageImporting" and not waiting.value.failure
    await asyncio.sleep(0)
    assert host.operations["import_image"] == 1 and imports.started == 1
    assert woken == []
    release.release()
    await imports_finished(imports)
    assert woken == ["kvm1"]  # the host's machines are queued at once, not at their next recheck
    found = await imports.ensure(host, "default", image, [PREFIX])
    assert found.name == images.image_volume_name(SHA) and host.operations["import_image"] == 1


async def test_machines_asking_at_the_same_moment_start_one_import():
    """Two passes that both look the image up before either started its import (the look-up awaits the host): one
    import, not one each (a race seen under load in the integration tier)."""
    host, release = importing_host()
    imports = reconcile_images.ImageImports()
    image = v1alpha1.ImageSource(url=URL, sha256=SHA)
    answers = await asyncio.gather(*(imports.ensure(host, "default", image, [PREFIX]) for _machine in range(3)),
                                   return_exceptions=True)
    assert all(isinstance(a, reconcile_images.Wait) and a.reason == "ImageImporting" for a in answers), answers
    await asyncio.sleep(0)
    assert host.operations["import_image"] == 1 and imports.started == 1
    release.release()
    await imports.close()


async def test_a_pass_that_looked_while_the_import_finished_looks_again():
    """A pass whose look-up read the pool before any import started, and returned after another pass had started the
    import, it had finished and a third pass had taken its volume: it looks again and finds the image, and starts no
    second import (a race seen under load in CI)."""
    host, release = importing_host()
    imports = reconcile_images.ImageImports()
    image = v1alpha1.ImageSource(url=URL, sha256=SHA)
    late_look = host.hold("find_image", after=True)
    late = asyncio.create_task(imports.ensure(host, "default", image, [PREFIX]))
    await asyncio.wait_for(late_look.reached.wait(), 5)  # the late pass has read an empty pool
    with pytest.raises(reconcile_images.Wait):
        await imports.ensure(host, "default", image, [PREFIX])  # another pass starts the import
    release.release()
    await imports_finished(imports)  # the import finishes
    first = await imports.ensure(host, "default", image, [PREFIX])  # a third pass takes the imported volume
    late_look.release()
    assert (await asyncio.wait_for(late, 5)).name == first.name == images.image_volume_name(SHA)
    assert host.operations["import_image"] == 1 and imports.started == 1


async def test_an_image_gone_from_the_pool_after_its_import_is_imported_again():
    host, release = importing_host()
    imports = reconcile_images.ImageImports()
    image = v1alpha1.ImageSource(url=URL, sha256=SHA)
    release.release()
    with pytest.raises(reconcile_images.Wait):
        await imports.ensure(host, "default", image, [PREFIX])
    await imports_finished(imports)
    assert (await imports.ensure(host, "default", image, [PREFIX])).name == images.image_volume_name(SHA)
    for name in (images.image_volume_name(SHA), images.verified_marker_name(SHA)):
        del host.pools["default"].volumes[name]  # an admin deleted it
    with pytest.raises(reconcile_images.Wait) as importing:
        await imports.ensure(host, "default", image, [PREFIX])
    assert importing.value.reason == "ImageImporting"
    await imports_finished(imports)
    assert host.operations["import_image"] == 2 and imports.started == 2


async def test_a_failed_import_answers_every_waiting_machine_then_one_retries():
    (host, release), now = importing_host(), [0.0]
    imports = reconcile_images.ImageImports(clock=lambda: now[0])
    image = v1alpha1.ImageSource(url=URL, sha256=SHA)
    host.fail("import_image", host_images.ChecksumMismatch(SHA, "f" * 64, 10))
    release.release()
    woken: list[str] = []
    with pytest.raises(reconcile_images.Wait):
        await imports.ensure(host, "default", image, [PREFIX], woken.append)
    await imports_finished(imports)
    assert woken == []  # a failure wakes nobody: the machines' own backoff paces the retries
    for _machine in range(2):
        with pytest.raises(reconcile_images.Wait) as failed:
            await imports.ensure(host, "default", image, [PREFIX])
        assert failed.value.reason == "ImageChecksumMismatch" and failed.value.failure
        assert SHA in failed.value.message and "f" * 64 in failed.value.message
    assert host.operations["import_image"] == 1
    now[0] += reconcile_images.RETRY_AFTER_S
    with pytest.raises(reconcile_images.Wait) as retrying:
        await imports.ensure(host, "default", image, [PREFIX])
    assert retrying.value.reason == "ImageImporting"
    await imports_finished(imports)
    assert host.operations["import_image"] == 2
    with contextlib.suppress(Exception):
        await imports.close()


def test_an_imports_progress_is_in_the_message_the_machines_wait_with():
    progress = reconcile_images.Progress()
    assert progress.text() == "" and progress.received == 0  # not downloading yet
    progress.track(types.SimpleNamespace(received=120 << 20, length=512 << 20))  # type: ignore[arg-type]
    assert progress.text() == ", 120 of 512 MiB received"
    progress.track(types.SimpleNamespace(received=3 << 20, length=None))  # type: ignore[arg-type]
    assert progress.text() == ", 3 MiB received"
    message = reconcile_images._importing(URL, SHA, "default", "kvm1", progress)
    assert message.endswith("into pool default on host kvm1, 3 MiB received")


async def test_every_import_is_observed_with_its_bytes_time_and_outcome(monkeypatch):
    streaming = Served(b"x" * 4096)
    streaming.gate, opened = threading.Event(), threading.Event()

    def open_image(url: str, allowed) -> Served:
        opened.set()  # in the import's thread, as the libvirt import opens it
        return streaming
    monkeypatch.setattr(reconcile_images.download, "open_image", open_image)
    seen: list[tuple[int, bool]] = []
    host, now = MemoryHost("kvm1"), [0.0]
    imports = reconcile_images.ImageImports(clock=lambda: now[0],
                                            observe=lambda received, seconds, ok: seen.append((received, ok)))
    image = v1alpha1.ImageSource(url=URL, sha256=SHA)
    with pytest.raises(reconcile_images.Wait):
        await imports.ensure(host, "default", image, [PREFIX])
    assert await asyncio.to_thread(opened.wait, 5)
    streaming.received = 1024
    with pytest.raises(reconcile_images.Wait) as waiting:
        await imports.ensure(host, "default", image, [PREFIX])
    assert waiting.value.message.endswith(", 0 of 0 MiB received")  # 1 KiB of 4 KiB, in MiB
    streaming.error = RuntimeError("cut short")
    streaming.received = 2048
    streaming.gate.set()
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen == [(2048, False)]
