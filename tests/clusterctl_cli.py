"""The real clusterctl as the tests run it: on the release written as a local repository, with its own HOME and a
clusterctl.yaml naming only that repository, no version check, and no variable from the caller's environment."""

from __future__ import annotations

import os
import pathlib
import subprocess

import yaml

from capi_libvirt.api import release
from devenv import paths

REPO = pathlib.Path(__file__).resolve().parent.parent
VERSION = "v0.1.0"
CLUSTERCTL = paths.bin_dir() / f"clusterctl-{paths.CLUSTER_API_VERSION}"


def write_repository(out: pathlib.Path) -> pathlib.Path:
    """The release written as a clusterctl local repository: <out>/infrastructure-libvirt/v0.1.0/..."""
    release.write(out, VERSION, REPO / "config")
    return release.release_dir(out, VERSION)


def clusterctl(tmp: pathlib.Path, repository: pathlib.Path, *args: str, config: dict | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """clusterctl with its own HOME (nothing read from or written to ~/.config), a clusterctl.yaml naming only the
    local repository, no version check, and no variable from the caller's environment (nor a KUBECONFIG)."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    config_file = tmp / "clusterctl.yaml"
    config_file.write_text(yaml.safe_dump({
        "providers": [{"name": "libvirt", "type": "InfrastructureProvider",
                       "url": (repository / release.COMPONENTS).as_uri()}],
        **(config or {}),
    }))
    result = subprocess.run(
        [str(CLUSTERCTL), *args, "--config", str(config_file)],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
             "CLUSTERCTL_DISABLE_VERSIONCHECK": "true", **(env or {})},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, f"clusterctl {' '.join(args)} failed:\n{result.stderr}\n{result.stdout}"
    return result


def generate_cluster(tmp: pathlib.Path, repository: pathlib.Path, flavor: str, name: str, namespace: str,
                     variables: dict[str, str], *extra: str) -> list[dict]:
    """`clusterctl generate cluster NAME --infrastructure libvirt:VERSION [--flavor FLAVOR] --target-namespace
    NAMESPACE` from the repository, as a user runs it (for the clusterclass flavor clusterctl adds the class's file
    from the repository: no management cluster answers here, so it has none), its objects."""
    out = clusterctl(tmp, repository, "generate", "cluster", name, *source_arguments(flavor),
                     "--target-namespace", namespace, *extra, env=variables).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def source_arguments(flavor: str) -> list[str]:
    """Where `generate cluster` takes the flavor from: our provider's repository, at this release."""
    return ["--infrastructure", f"libvirt:{VERSION}", *(["--flavor", flavor] if flavor else [])]
