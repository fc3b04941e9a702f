"""Where the guest images of each flavor are: the recipe hashes (the node one also covers the Kubernetes version), the
folder names, and which files make a finished image. Pure: temporary files only."""

from __future__ import annotations

import hashlib
import pathlib
import re

import pytest

from capi_libvirt.api import pod_network
from devenv import guest_image as gi
from devenv import paths

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "build-guest-image.sh"


@pytest.fixture
def cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """An empty cache and a recipe script (and its root and image tool) of our own, so the folders are known and nothing
    real is touched."""
    script = tmp_path / "build-guest-image.sh"
    script.write_text("#!/usr/bin/env bash\n# a recipe\n")
    (tmp_path / gi.ROOT_SCRIPT).write_text("#!/usr/bin/env bash\n# its root\n")
    (tmp_path / "image-archive.py").write_text("# its image tool\n")
    monkeypatch.setenv("CAPI_LIBVIRT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(gi.SCRIPT_ENV, str(script))
    return tmp_path / "cache"


def finish(folder: pathlib.Path, *files: str) -> None:
    folder.mkdir(parents=True)
    for name in (*files, gi.MARKER):
        (folder / name).write_bytes(b"x")


def test_minimal_hash_is_the_sha256_of_the_script_and_its_root() -> None:
    root = SCRIPT.parent / "debian-root.sh"
    assert gi.recipe_hash(SCRIPT) == hashlib.sha256(SCRIPT.read_bytes() + root.read_bytes()).hexdigest()[:16]
    assert gi.recipe_hash(SCRIPT, gi.MINIMAL) == gi.recipe_hash(SCRIPT)


def test_node_hash_covers_the_script_its_root_its_image_tool_the_pod_network_images_and_the_kubernetes_version() -> None:
    root = SCRIPT.parent / "debian-root.sh"
    tool = SCRIPT.parent / "image-archive.py"
    images = f"flannel={pod_network.FLANNEL_VERSION} {pod_network.FLANNEL_IMAGE} {pod_network.CNI_PLUGIN_IMAGE}\n"
    expected = hashlib.sha256(SCRIPT.read_bytes() + root.read_bytes() + tool.read_bytes() + images.encode()
                              + b"flavor=node\nkubernetes=v1.35.4\n").hexdigest()[:16]
    assert gi.recipe_hash(SCRIPT, gi.NODE, "v1.35.4") == expected
    assert gi.recipe_hash(SCRIPT, gi.NODE, "v1.35.5") != expected
    assert gi.recipe_hash(SCRIPT, gi.NODE, "v1.35.4") != gi.recipe_hash(SCRIPT)
    assert gi.recipe_hash(SCRIPT, gi.NODE) == gi.recipe_hash(SCRIPT, gi.NODE, paths.KUBERNETES_VERSION)


def test_node_hash_follows_kubernetes_version_of_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "KUBERNETES_VERSION", "v9.9.9")
    assert gi.recipe_hash(SCRIPT, gi.NODE) == gi.recipe_hash(SCRIPT, gi.NODE, "v9.9.9")


@pytest.mark.parametrize("variable", ["ETCD_VERSION", "COREDNS_VERSION"])
def test_script_and_upstream_build_agree_on_the_control_plane_images_versions(variable: str) -> None:
    pattern = re.compile(r'^: "\$\{' + variable + r':=(v[0-9.]+)\}"', re.M)
    assert pattern.search(SCRIPT.read_text()).group(1) == \
        pattern.search((REPO / "hack" / "build-upstream.sh").read_text()).group(1)


def test_script_python_and_upstream_build_default_to_one_kubernetes_version() -> None:
    pattern = re.compile(r'^: "\$\{KUBERNETES_VERSION:=(v[0-9.]+)\}"', re.M)
    image_default = pattern.search(SCRIPT.read_text()).group(1)
    upstream_default = pattern.search((REPO / "hack" / "build-upstream.sh").read_text()).group(1)
    paths_default = re.search(r'"KUBERNETES_VERSION", "(v[0-9.]+)"', (REPO / "devenv/paths.py")
                              .read_text()).group(1)
    assert image_default == upstream_default == paths_default


def test_folders_per_flavor(cache: pathlib.Path) -> None:
    script = pathlib.Path(gi.build_script())
    assert gi.image_folder() == cache / "images" / gi.recipe_hash(script)
    assert gi.image_folder(flavor=gi.NODE) == cache / "images" / f"node-{gi.recipe_hash(script, gi.NODE)}"


def test_minimal_image_needs_disk_kernel_and_initrd(cache: pathlib.Path) -> None:
    folder = gi.image_folder()
    finish(folder, "disk.qcow2", "vmlinuz")
    assert gi.find_guest_image() is None  # no initrd
    (folder / "initrd.img").write_bytes(b"x")
    image = gi.find_guest_image()
    assert image == gi.GuestImage(folder, folder / "disk.qcow2", folder / "vmlinuz", folder / "initrd.img")
    assert image.flavor == gi.MINIMAL and image.kernel_cmdline == "root=/dev/vda rw console=ttyS0"
    assert gi.find_guest_image(gi.NODE) is None  # the minimal image is not the node one


def test_node_image_is_its_disk_alone(cache: pathlib.Path) -> None:
    folder = gi.image_folder(flavor=gi.NODE)
    folder.mkdir(parents=True)
    (folder / "disk.qcow2").write_bytes(b"x")
    assert gi.find_guest_image(gi.NODE) is None  # not marked finished
    (folder / gi.MARKER).write_bytes(b"x")
    image = gi.find_guest_image(gi.NODE)
    assert image is not None and image == gi.find_node_image()
    assert (image.folder, image.disk, image.kernel, image.initrd, image.flavor) == (
        folder, folder / "disk.qcow2", None, None, gi.NODE)
    assert image.files == [folder / "disk.qcow2"]
    with pytest.raises(ValueError, match="boots from its own disk"):
        _ = image.kernel_cmdline
    assert gi.find_guest_image() is None


def test_unknown_flavor_is_refused(cache: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="unknown guest image flavor"):
        gi.find_guest_image("fat")
