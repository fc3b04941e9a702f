"""The cached Debian guest images that hack/build-guest-image.sh builds: where they are, and building them when missing.

Two flavors. `minimal`: a qcow2 whose whole disk is the ext4 root (/dev/vda), booted with the kernel and initrd kept
beside it (direct kernel boot). `node`: a Kubernetes node image (containerd, kubelet and kubeadm, configured for
`kubeadm join`) on a partitioned qcow2 that boots itself through extlinux, so a machine needs no kernelBoot.

The script keeps the minimal image under paths.guest_image_dir()/<recipe-hash>/, the hash being the start of the
sha256 of the script itself and hack/debian-root.sh (the root both flavors start from), and the node image under
node-<recipe-hash>/, whose hash also covers the Kubernetes version (the script's, hack/debian-root.sh's,
hack/image-archive.py's bytes, then `flannel=<version> <image> <CNI plugin image>` as api/pod_network.py names them,
`flavor=node` and `kubernetes=<version>` lines). This
module hashes the same way, so
both agree on which image belongs to the current recipe. The script is found through $CAPI_LIBVIRT_GUEST_IMAGE_SCRIPT,
else at hack/build-guest-image.sh of the source tree this package is loaded from (an editable install or a checkout on
PYTHONPATH).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import subprocess

from capi_libvirt.api import pod_network
from devenv import paths

log = logging.getLogger(__name__)

SCRIPT_ENV = "CAPI_LIBVIRT_GUEST_IMAGE_SCRIPT"
SCRIPT_IN_REPO = pathlib.Path("hack") / "build-guest-image.sh"
ROOT_SCRIPT = "debian-root.sh"  # beside the script: the Debian root both flavors start from
MARKER = "READY"  # the script writes it last; a folder without it is not an image
HASH_LENGTH = 16  # hex digits; the script cuts its sha256sum to the same length
MINIMAL = "minimal"
NODE = "node"
FLAVORS = (MINIMAL, NODE)


@dataclasses.dataclass(frozen=True)
class GuestImage:
    """A finished image. minimal: the qcow2 root file system (ext4 on the whole disk, /dev/vda) and its kernel and
    initrd for direct kernel boot. node: the qcow2 of a disk that boots on its own (MBR, extlinux, root=LABEL=root);
    kernel and initrd are None."""

    folder: pathlib.Path
    disk: pathlib.Path
    kernel: pathlib.Path | None
    initrd: pathlib.Path | None
    flavor: str = MINIMAL

    @classmethod
    def in_folder(cls, folder: pathlib.Path, flavor: str = MINIMAL) -> GuestImage:
        check_flavor(flavor)
        if flavor == NODE:
            return cls(folder=folder, disk=folder / "disk.qcow2", kernel=None, initrd=None, flavor=NODE)
        return cls(folder=folder, disk=folder / "disk.qcow2", kernel=folder / "vmlinuz", initrd=folder / "initrd.img")

    @property
    def files(self) -> list[pathlib.Path]:
        """What a finished image of this flavor has beside its marker."""
        return [p for p in (self.disk, self.kernel, self.initrd) if p is not None]

    @property
    def kernel_cmdline(self) -> str:
        """The command line for direct kernel boot (minimal only; the node image's bootloader has its own)."""
        if self.flavor != MINIMAL:
            raise ValueError(f"the {self.flavor} image boots from its own disk; it has no kernel command line to pass")
        return "root=/dev/vda rw console=ttyS0"


class GuestImageError(RuntimeError):
    pass


def build_script() -> pathlib.Path:
    """The build script: $CAPI_LIBVIRT_GUEST_IMAGE_SCRIPT, else the one in the source tree above this package."""
    if override := os.environ.get(SCRIPT_ENV):
        script = pathlib.Path(override)
        if not script.is_file():
            raise GuestImageError(f"${SCRIPT_ENV} names {script}, which is not a file")
        return script.resolve()
    for parent in pathlib.Path(__file__).resolve().parents:
        candidate = parent / SCRIPT_IN_REPO
        if candidate.is_file():
            return candidate
    raise GuestImageError(f"cannot find {SCRIPT_IN_REPO} above {__file__}; set ${SCRIPT_ENV}")


def check_flavor(flavor: str) -> None:
    if flavor not in FLAVORS:
        raise ValueError(f"unknown guest image flavor {flavor!r}; one of {', '.join(FLAVORS)}")


def recipe_hash(script: pathlib.Path, flavor: str = MINIMAL, kubernetes_version: str | None = None) -> str:
    """The same hash the script computes: `cat SCRIPT debian-root.sh | sha256sum | cut -c1-16` for minimal (the
    debian-root.sh beside it); for node, of those two and the image-archive.py beside them, followed by
    `flannel=VERSION IMAGE CNI_PLUGIN_IMAGE` (the pod network's image references, api/pod_network.py's), `flavor=node`
    and `kubernetes=VERSION` lines (default: paths.KUBERNETES_VERSION, as the script's)."""
    check_flavor(flavor)
    data = script.read_bytes() + (script.parent / ROOT_SCRIPT).read_bytes()
    if flavor == NODE:
        data += (script.parent / "image-archive.py").read_bytes()
        data += (f"flannel={pod_network.FLANNEL_VERSION} {pod_network.FLANNEL_IMAGE} {pod_network.CNI_PLUGIN_IMAGE}\n"
                 f"flavor=node\nkubernetes={kubernetes_version or paths.KUBERNETES_VERSION}\n").encode()
    return hashlib.sha256(data).hexdigest()[:HASH_LENGTH]


def folder_name(recipe: str, flavor: str = MINIMAL) -> str:
    check_flavor(flavor)
    return recipe if flavor == MINIMAL else f"{flavor}-{recipe}"


def image_folder(script: pathlib.Path | None = None, flavor: str = MINIMAL) -> pathlib.Path:
    """Where the image of the current recipe of `flavor` is (or would be)."""
    return paths.guest_image_dir() / folder_name(recipe_hash(script or build_script(), flavor), flavor)


def find_guest_image(flavor: str = MINIMAL) -> GuestImage | None:
    """The finished image of the current recipe, or None when it has not been built (or the script is not found)."""
    try:
        folder = image_folder(flavor=flavor)
    except GuestImageError as err:
        log.warning("no %s guest image: %s", flavor, err)
        return None
    if not (folder / MARKER).is_file():
        return None
    image = GuestImage.in_folder(folder, flavor)
    missing = [p for p in image.files if not p.is_file()]
    if missing:
        log.warning("guest image %s is marked finished but lacks %s", folder, ", ".join(map(str, missing)))
        return None
    return image


def find_node_image() -> GuestImage | None:
    return find_guest_image(NODE)


def ensure_guest_image(flavor: str = MINIMAL) -> GuestImage:
    """The current image, building it first when missing (a few minutes, once; blocks meanwhile). The node flavor needs
    kubelet and kubeadm of paths.KUBERNETES_VERSION in paths.bin_dir() (hack/build-upstream.sh)."""
    if image := find_guest_image(flavor):
        return image
    script = build_script()
    log.info("building the %s guest image with %s (a few minutes, once)", flavor, script)
    env = {**os.environ, "CAPI_LIBVIRT_CACHE": str(paths.cache_dir()), "KUBERNETES_VERSION": paths.KUBERNETES_VERSION}
    result = subprocess.run(
        ["bash", str(script), flavor], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise GuestImageError(f"{script} {flavor} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    image = find_guest_image(flavor)
    if image is None:
        raise GuestImageError(
            f"{script} {flavor} finished but no image of recipe {recipe_hash(script, flavor)} is in "
            f"{paths.guest_image_dir()}"
        )
    log.info("%s guest image ready: %s", flavor, image.folder)
    return image
