"""The cached Debian guest image that hack/build-guest-image.sh builds: where it is, and building it when missing.

The script keeps each image under paths.guest_image_dir()/<recipe-hash>/, the hash being the start of the sha256 of
the script itself; this module hashes the same file, so both agree on which image belongs to the current recipe.
The script is found through $CAPI_LIBVIRT_GUEST_IMAGE_SCRIPT, else at hack/build-guest-image.sh of the source tree
this package is loaded from (an editable install or a checkout on PYTHONPATH).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import subprocess

from capi_libvirt.devenv import paths

log = logging.getLogger(__name__)

SCRIPT_ENV = "CAPI_LIBVIRT_GUEST_IMAGE_SCRIPT"
SCRIPT_IN_REPO = pathlib.Path("hack") / "build-guest-image.sh"
MARKER = "READY"  # the script writes it last; a folder without it is not an image
HASH_LENGTH = 16  # hex digits; the script cuts its sha256sum to the same length


@dataclasses.dataclass(frozen=True)
class GuestImage:
    """A finished image: a qcow2 root file system (ext4 on the whole disk, /dev/vda) and its kernel and initrd."""

    folder: pathlib.Path
    disk: pathlib.Path
    kernel: pathlib.Path
    initrd: pathlib.Path

    @classmethod
    def in_folder(cls, folder: pathlib.Path) -> GuestImage:
        return cls(folder=folder, disk=folder / "disk.qcow2", kernel=folder / "vmlinuz", initrd=folder / "initrd.img")

    @property
    def kernel_cmdline(self) -> str:
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


def recipe_hash(script: pathlib.Path) -> str:
    """The same hash the script computes of itself: `sha256sum SCRIPT | cut -c1-16`."""
    return hashlib.sha256(script.read_bytes()).hexdigest()[:HASH_LENGTH]


def image_folder(script: pathlib.Path | None = None) -> pathlib.Path:
    return paths.guest_image_dir() / recipe_hash(script or build_script())


def find_guest_image() -> GuestImage | None:
    """The finished image of the current recipe, or None when it has not been built (or the script is not found)."""
    try:
        folder = image_folder()
    except GuestImageError as err:
        log.warning("no guest image: %s", err)
        return None
    if not (folder / MARKER).is_file():
        return None
    image = GuestImage.in_folder(folder)
    missing = [p for p in (image.disk, image.kernel, image.initrd) if not p.is_file()]
    if missing:
        log.warning("guest image %s is marked finished but lacks %s", folder, ", ".join(map(str, missing)))
        return None
    return image


def ensure_guest_image() -> GuestImage:
    """The current image, building it first when missing (a few minutes, once; blocks meanwhile)."""
    if image := find_guest_image():
        return image
    script = build_script()
    log.info("building the guest image with %s (a few minutes, once)", script)
    env = {**os.environ, "CAPI_LIBVIRT_CACHE": str(paths.cache_dir())}
    result = subprocess.run(["bash", str(script)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        raise GuestImageError(f"{script} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    image = find_guest_image()
    if image is None:
        raise GuestImageError(f"{script} finished but no image of recipe {recipe_hash(script)} is in {paths.guest_image_dir()}")
    log.info("guest image ready: %s", image.folder)
    return image
