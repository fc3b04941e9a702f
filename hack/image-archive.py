#!/usr/bin/env python3
"""Write a one-layer container image archive in the `docker save` layout that `ctr images import` reads.

    image-archive.py ARCHIVE REF [--entrypoint JSON] [--cmd JSON] [--user U] [--env K=V ...] [--workdir DIR]
                     [--add SOURCE=DEST[:MODE] ...] [--root ROOT --copy PATH ... [--copy-dir DIR ...]]

--add puts a file of the build machine at DEST. --copy takes PATH from the root file system ROOT (a debootstrapped
node root), with every symbolic link on the way kept as a link, and, when it is an ELF program or library, the shared
libraries `ldd` names for it inside ROOT (and theirs); --copy-dir copies every file of a folder of ROOT that way (the
iptables extensions, which iptables opens at run time). The layer's members are sorted and dated 1970, so the same
inputs give the same image ID. Used by hack/build-guest-image.sh for the node image's sandbox and control-plane
images, all built here from source: nothing is pulled at run time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Layer:
    """The members of the image's one layer, by path (no leading slash)."""

    def __init__(self) -> None:
        self.members: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}

    def _parents(self, name: str) -> None:
        parent = os.path.dirname(name)
        while parent and parent not in self.members:
            info = tarfile.TarInfo(parent)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            self.members[parent] = (info, None)
            parent = os.path.dirname(parent)

    def file(self, name: str, data: bytes, mode: int) -> None:
        name = name.lstrip("/")
        self._parents(name)
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        self.members[name] = (info, data)

    def link(self, name: str, target: str) -> None:
        name = name.lstrip("/")
        self._parents(name)
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self.members[name] = (info, None)

    def tar(self) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name in sorted(self.members):
                info, data = self.members[name]
                info.mtime, info.uid, info.gid = 0, 0, 0
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return out.getvalue()


class RootCopier:
    """Copies paths of a root file system into a layer: links kept, ELF files with the libraries they need."""

    def __init__(self, root: pathlib.Path, layer: Layer) -> None:
        self.root, self.layer = root, layer
        self.done: set[str] = set()

    def copy(self, path: str) -> None:
        while path not in self.done:
            self.done.add(path)
            on_disk = self.root / path.lstrip("/")
            if on_disk.is_symlink():
                target = os.readlink(on_disk)
                self.layer.link(path, target)
                path = os.path.normpath(os.path.join(os.path.dirname(path), target)) if not target.startswith("/") \
                    else target
                continue
            if not on_disk.is_file():
                sys.exit(f"image-archive: {path} is not a file in {self.root}")
            data = on_disk.read_bytes()
            self.layer.file(path, data, on_disk.stat().st_mode & 0o7777)
            if data[:4] == b"\x7fELF":
                for library in self.libraries(path):
                    self.copy(library)

    def copy_dir(self, folder: str) -> None:
        for entry in sorted((self.root / folder.lstrip("/")).iterdir()):
            self.copy(f"{folder.rstrip('/')}/{entry.name}")

    def libraries(self, path: str) -> list[str]:
        """The shared objects `ldd` resolves for PATH inside the root (the dynamic loader among them)."""
        result = subprocess.run(["chroot", str(self.root), "ldd", path], capture_output=True, text=True)
        if result.returncode != 0:  # a static program: "not a dynamic executable"
            return []
        found = []
        for line in result.stdout.splitlines():
            words = line.split()
            if "=>" in words and words[words.index("=>") + 1].startswith("/"):
                found.append(words[words.index("=>") + 1])
            elif words and words[0].startswith("/"):
                found.append(words[0])
        return found


def archive(path: pathlib.Path, ref: str, layer: bytes, config: dict) -> str:
    diff_id = hashlib.sha256(layer).hexdigest()
    config = {"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z", "config": config,
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
              "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hack/image-archive.py"}]}
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    manifest = json.dumps([{"Config": f"{config_id}.json", "RepoTags": [ref], "Layers": [f"{diff_id}/layer.tar"]}])
    members = Layer()
    members.file(f"{config_id}.json", config_bytes, 0o644)
    members.file(f"{diff_id}/layer.tar", layer, 0o644)
    members.file("manifest.json", manifest.encode(), 0o644)
    path.write_bytes(members.tar())
    return config_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=pathlib.Path)
    parser.add_argument("ref")
    parser.add_argument("--entrypoint", type=json.loads)
    parser.add_argument("--cmd", type=json.loads)
    parser.add_argument("--user")
    parser.add_argument("--workdir", default="/")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--add", action="append", default=[], metavar="SOURCE=DEST[:MODE]")
    parser.add_argument("--root", type=pathlib.Path)
    parser.add_argument("--copy", action="append", default=[])
    parser.add_argument("--copy-dir", action="append", default=[])
    args = parser.parse_args()

    layer = Layer()
    for item in args.add:
        source, _, dest = item.partition("=")
        dest, _, mode = dest.partition(":")
        layer.file(dest, pathlib.Path(source).read_bytes(), int(mode or "755", 8))
    if args.copy or args.copy_dir:
        if args.root is None:
            parser.error("--copy and --copy-dir need --root")
        copier = RootCopier(args.root, layer)
        for path in args.copy:
            copier.copy(path)
        for folder in args.copy_dir:
            copier.copy_dir(folder)
    config: dict = {"Env": [f"PATH={DEFAULT_PATH}", *args.env], "WorkingDir": args.workdir}
    if args.entrypoint is not None:
        config["Entrypoint"] = args.entrypoint
    if args.cmd is not None:
        config["Cmd"] = args.cmd
    if args.user:
        config["User"] = args.user
    image_id = archive(args.archive, args.ref, layer.tar(), config)
    print(f"{args.ref} sha256:{image_id} ({args.archive.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
