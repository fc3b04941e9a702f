"""A clusterctl local repository holding everything `clusterctl init` installs in the test bed, and its clusterctl.yaml.

- Cluster API core, kubeadm bootstrap and kubeadm control plane: the components hack/build-upstream.sh kustomized from
  the cached module (what Cluster API's `make release-manifests` makes), with the module's metadata.yaml;
- capi-libvirt: our release (`make release-manifests`, capi_libvirt.api.release.write);
- cert-manager: cert-manager.yaml rendered from its module's chart. clusterctl reads it from
  `<root>/cert-manager/<version>/cert-manager.yaml`: the folder must be named `cert-manager` (the manifest label of
  clusterctl's internal cert-manager provider).

clusterctl.yaml names all of them by file:// URL, so clusterctl never goes to the network.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil

import yaml

from capi_libvirt.api import release
from devenv import paths

REPO = pathlib.Path(__file__).resolve().parents[1]
VERSION = "v0.1.0"  # our release, as the tests' clusterctl repositories carry it
CERT_MANAGER_TIMEOUT = "3m"

# (clusterctl provider name, type, the repository folder, components file)
CLUSTER_API_PROVIDERS = (
    ("cluster-api", "CoreProvider", "cluster-api", "core-components.yaml"),
    ("kubeadm", "BootstrapProvider", "bootstrap-kubeadm", "bootstrap-components.yaml"),
    ("kubeadm", "ControlPlaneProvider", "control-plane-kubeadm", "control-plane-components.yaml"),
)


class RepositoryError(RuntimeError):
    """Something the repository is made of is missing (hack/build-upstream.sh makes it)."""


@dataclasses.dataclass(frozen=True)
class Repository:
    root: pathlib.Path
    config: pathlib.Path  # clusterctl.yaml
    components: tuple[pathlib.Path, ...]  # every file clusterctl init installs, cert-manager.yaml first
    version: str  # ours


def write_repository(out: pathlib.Path, version: str = VERSION, config_dir: pathlib.Path = REPO / "config") -> Repository:
    cluster_api = paths.cluster_api_components_dir()
    cert_manager = paths.cert_manager_manifest()
    for needed in (cluster_api / "metadata.yaml", *(cluster_api / p[3] for p in CLUSTER_API_PROVIDERS), cert_manager):
        if not needed.exists():
            raise RepositoryError(f"{needed} is missing: run `make upstream` (hack/build-upstream.sh)")
    providers, components = [], []
    cm_file = out / "cert-manager" / paths.CERT_MANAGER_VERSION / "cert-manager.yaml"
    cm_file.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cert_manager, cm_file)
    components.append(cm_file)
    for name, kind, folder, file in CLUSTER_API_PROVIDERS:
        target = out / folder / paths.CLUSTER_API_VERSION
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cluster_api / file, target / file)
        shutil.copyfile(cluster_api / "metadata.yaml", target / "metadata.yaml")
        providers.append({"name": name, "type": kind, "url": (target / file).as_uri()})
        components.append(target / file)
    release.write(out, version, config_dir)
    ours = release.release_dir(out, version) / release.COMPONENTS
    providers.append({"name": "libvirt", "type": "InfrastructureProvider", "url": ours.as_uri()})
    components.append(ours)
    config = out / "clusterctl.yaml"
    config.write_text(yaml.safe_dump({
        "providers": providers,
        "cert-manager": {"url": cm_file.as_uri(), "version": paths.CERT_MANAGER_VERSION,
                         "timeout": CERT_MANAGER_TIMEOUT},
    }, sort_keys=False))
    return Repository(root=out, config=config, components=tuple(components), version=version)
