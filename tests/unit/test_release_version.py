"""One version everywhere: pyproject.toml, the package, the manager image in config/manager and the release's image."""

from __future__ import annotations

import pathlib
import tomllib

import pytest
import yaml

import capi_libvirt
from capi_libvirt.api import release

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_package_the_manager_image_and_the_release_agree_on_the_version():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capi_libvirt.__version__ == version
    deployment = next(d for d in yaml.safe_load_all((REPO / "config/manager/manager.yaml").read_text())
                      if d and d["kind"] == "Deployment")
    manager = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager")
    assert manager["image"] == release.image(f"v{version}")
    assert release.parse_version(f"v{version}")
