"""The product runs on what the image installs (requirements.lock) and nothing of the test extra: every module of
capi_libvirt imports with the generated Kubernetes client made unimportable, and the image's lock does not hold it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
IMPORT_ALL = """
import importlib, pkgutil, sys
sys.modules["kubernetes_asyncio"] = None
import capi_libvirt
names = [m.name for m in pkgutil.walk_packages(capi_libvirt.__path__, "capi_libvirt.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
assert not any(n.startswith("kubernetes_asyncio.") for n in sys.modules), "something imported it"
print(len(names))
"""


def test_every_module_imports_without_the_generated_client():
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.strip()) > 50  # every module, not an empty walk


def test_the_images_lock_leaves_out_the_test_extra():
    pinned = {line.split("==")[0] for line in (REPO / "requirements.lock").read_text().splitlines()
              if line and line[0].isalpha()}
    assert "kubernetes-asyncio" not in pinned and "pytest" not in pinned
    assert {"kopf", "aiohttp", "yarl", "libvirt-python"} <= pinned
