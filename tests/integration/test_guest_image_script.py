"""hack/build-guest-image.sh and guest_image.py agree on every flavor's folder (the script computes the hashes in
bash), and the node flavor stops at once, naming what is missing, when the Kubernetes commands, etcd or CoreDNS have not been
built. Runs
the script itself (bash, no build, no root needed)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from devenv import guest_image as gi
from devenv import paths

pytestmark = pytest.mark.integration


def run_script(cache: pathlib.Path, *args: str, kubernetes: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CAPI_LIBVIRT_CACHE": str(cache), "KUBERNETES_VERSION": kubernetes or paths.KUBERNETES_VERSION}
    return subprocess.run(["bash", str(gi.build_script()), *args], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flavor", gi.FLAVORS)
def test_script_and_python_agree_on_the_folder(flavor: str, tmp_path: pathlib.Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPI_LIBVIRT_CACHE", str(tmp_path))
    result = run_script(tmp_path, "--folder", flavor)
    assert result.returncode == 0, result.stderr
    assert pathlib.Path(result.stdout.strip()) == gi.image_folder(flavor=flavor)
    assert not (tmp_path / "images").exists()  # --folder builds nothing


def test_default_flavor_is_minimal(tmp_path: pathlib.Path) -> None:
    assert run_script(tmp_path, "--folder").stdout == run_script(tmp_path, "--folder", "minimal").stdout


def test_node_folder_follows_the_kubernetes_version(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPI_LIBVIRT_CACHE", str(tmp_path))
    monkeypatch.setattr(paths, "KUBERNETES_VERSION", "v1.99.0")
    other = run_script(tmp_path, "--folder", "node", kubernetes="v1.99.0").stdout.strip()
    assert pathlib.Path(other) == gi.image_folder(flavor=gi.NODE)
    assert other != run_script(tmp_path, "--folder", "node", kubernetes="v1.35.4").stdout.strip()
    # The minimal image does not depend on it.
    assert run_script(tmp_path, "--folder", kubernetes="v1.99.0").stdout == \
        run_script(tmp_path, "--folder", kubernetes="v1.35.4").stdout


def test_node_build_names_missing_kubernetes_commands_etcd_and_coredns(tmp_path: pathlib.Path) -> None:
    result = run_script(tmp_path, "node", kubernetes="v1.99.0")
    assert result.returncode == 1
    for command in ("kubelet", "kubeadm", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert f"{tmp_path}/bin/{command}-v1.99.0" in result.stderr
    assert f"{tmp_path}/bin/etcd-v3.6.6" in result.stderr and f"{tmp_path}/bin/coredns-v1.13.1" in result.stderr
    assert f"{tmp_path}/kubernetes-v1.99.0/build/pause/linux/pause.c" in result.stderr
    assert not (tmp_path / "images").exists()


def test_unknown_argument_is_refused(tmp_path: pathlib.Path) -> None:
    result = run_script(tmp_path, "fat")
    assert result.returncode == 2 and "usage" in result.stderr
