"""The clusterctl release artifacts: infrastructure-components.yaml, metadata.yaml and the cluster templates.

Laid out as a clusterctl local repository, `<out>/infrastructure-libvirt/<version>/`, so
`providers: [{name: libvirt, type: InfrastructureProvider, url: file://<out>/infrastructure-libvirt/<version>/
infrastructure-components.yaml}]` in clusterctl.yaml serves them. Every document is built as a Python dict and dumped
by pyyaml; clusterctl's variables (`${VAR}`, `${VAR:=default}`) are plain string values in them.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterable
from typing import Any

import yaml

from capi_libvirt.api import quoting, templates

PROVIDER_LABEL = "infrastructure-libvirt"  # clusterctl's name for the provider: <type>-<name>
PROVIDER_LABEL_KEY = "cluster.x-k8s.io/provider"
IMAGE_VARIABLE = "CAPI_LIBVIRT_IMAGE"
IMAGE_REPOSITORY = "ghcr.io/capi-libvirt/capi-libvirt"
CONTRACT = "v1beta2"  # the Cluster API contract the release series implements (Cluster API v1.11 and later)

COMPONENTS = "infrastructure-components.yaml"
METADATA = "metadata.yaml"
CLUSTER_TEMPLATE = "cluster-template.yaml"

VERSION = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$")


class ReleaseError(ValueError):
    """The release cannot be written: a bad version, or config/ is not what it should be."""


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a release version `vMAJOR.MINOR.PATCH[-PRE]`, as clusterctl's local repository wants it."""
    match = VERSION.match(version)
    if not match:
        raise ReleaseError(f"version {version!r} is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE]")
    return int(match.group(1)), int(match.group(2))


def image(version: str) -> str:
    """This release's manager image."""
    return f"{IMAGE_REPOSITORY}:{version}"


def image_variable(version: str) -> str:
    """The manager's image in the components: a clusterctl variable defaulting to this release's image.

    `clusterctl init` substitutes it before anything parses the image, so both ways of moving the image work there:
    the variable and clusterctl's own `images:` override. (clusterctl 1.12's `generate provider --describe` and
    `--raw` apply the image override to the unsubstituted text and fail to parse it; plain `generate provider`
    works.)"""
    return f"${{{IMAGE_VARIABLE}:={image(version)}}}"


# -- infrastructure-components.yaml ----------------------------------------------------------------------------------

# Kinds kustomize's `namespace:` leaves alone (cluster-scoped); custom kinds count as namespaced, as in kustomize.
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}


def _load_resource(folder: pathlib.Path, resource: str) -> list[dict[str, Any]]:
    path = folder / resource
    if path.is_dir():
        return kustomize(path)
    if not path.is_file():
        raise ReleaseError(f"{folder / 'kustomization.yaml'} lists {resource}, which is neither a file nor a folder")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _set_namespace(document: dict[str, Any], namespace: str) -> None:
    """kustomize's namespace transformer: namespaced objects move, and so do ServiceAccount subjects of bindings."""
    if document.get("kind") not in CLUSTER_SCOPED:
        document.setdefault("metadata", {})["namespace"] = namespace
    for subject in document.get("subjects") or []:
        if subject.get("kind") == "ServiceAccount":
            subject["namespace"] = namespace


def kustomize(folder: pathlib.Path) -> list[dict[str, Any]]:
    """The objects `kustomize build <folder>` gives, for the subset of kustomize config/ uses: `resources` (files and
    folders), `namespace`, and `labels` without selectors. Anything else in a kustomization.yaml is refused, so
    config/ cannot drift into what this reader would silently ignore (a test compares it with the real kustomize)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - {"apiVersion", "kind", "resources", "namespace", "labels"}
    if unknown:
        raise ReleaseError(f"{folder / 'kustomization.yaml'} uses {sorted(unknown)}, which release.py does not read")
    documents = [d for resource in kustomization.get("resources", []) for d in _load_resource(folder, resource)]
    for label_set in kustomization.get("labels", []):
        if label_set.get("includeSelectors"):
            raise ReleaseError(f"{folder / 'kustomization.yaml'}: labels with includeSelectors are not read")
        for document in documents:
            document.setdefault("metadata", {}).setdefault("labels", {}).update(label_set["pairs"])
    if "namespace" in kustomization:
        for document in documents:
            _set_namespace(document, kustomization["namespace"])
    return documents


def components(config_dir: pathlib.Path, version: str) -> list[dict[str, Any]]:
    """The provider's objects, config/default as kustomize builds it: CRDs, RBAC, the Namespace and the controller
    Deployment, each labelled as clusterctl wants; the manager's image is `${CAPI_LIBVIRT_IMAGE:=<this release's>}`.
    The Namespace keeps its name (clusterctl moves everything to `--target-namespace` itself)."""
    parse_version(version)
    documents = kustomize(config_dir / "default")
    namespaces = [d for d in documents if d.get("kind") == "Namespace"]
    if len(namespaces) != 1:
        raise ReleaseError(f"clusterctl wants exactly one Namespace in the components, config/ has {len(namespaces)}")
    managers = [c for d in documents if d.get("kind") == "Deployment"
                for c in d["spec"]["template"]["spec"]["containers"] if c.get("name") == "manager"]
    if len(managers) != 1:
        raise ReleaseError(f"clusterctl wants one controller container named `manager`, config/ has {len(managers)}")
    managers[0]["image"] = image_variable(version)
    for document in documents:
        if document["metadata"].get("labels", {}).get(PROVIDER_LABEL_KEY) != PROVIDER_LABEL:
            raise ReleaseError(f"{document['kind']} {document['metadata']['name']} lacks the provider label")
    # Namespace first, then CRDs, then the rest (as in config/): what clusterctl and kubectl apply expect.
    order = {"Namespace": 0, "CustomResourceDefinition": 1}
    return sorted(documents, key=lambda d: order.get(d["kind"], 2))


# -- metadata.yaml ---------------------------------------------------------------------------------------------------

def metadata(version: str) -> dict[str, Any]:
    """The release series -> contract map clusterctl reads (and validates: apiVersion, kind, non-empty series)."""
    major, minor = parse_version(version)
    return {
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [{"major": major, "minor": minor, "contract": CONTRACT}],
    }


# -- writing ---------------------------------------------------------------------------------------------------------

HEADER = "# Generated by `capi-libvirt release-manifests` from config/ and src/capi_libvirt/api; do not edit.\n"


def _dump_all(documents: Iterable[dict[str, Any]]) -> str:
    return HEADER + yaml.dump_all(list(documents), Dumper=quoting.Dumper, sort_keys=False, width=120, explicit_start=True)


def rendered(config_dir: pathlib.Path, version: str) -> dict[str, str]:
    """File name -> YAML text of the release's files."""
    return {
        COMPONENTS: _dump_all(components(config_dir, version)),
        METADATA: HEADER + yaml.safe_dump(metadata(version), sort_keys=False),
        **{templates.file_name(flavor): _dump_all(build()) for flavor, build in templates.FLAVORS.items()},
        **{templates.cluster_class_file_name(name): _dump_all(build())
           for name, build in templates.CLUSTER_CLASSES.items()},
    }


def release_dir(out: pathlib.Path, version: str) -> pathlib.Path:
    """Where clusterctl's local repository layout wants the files: {basepath}/{provider-label}/{version}/."""
    return out / PROVIDER_LABEL / version


def write(out: pathlib.Path, version: str, config_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write the release under `out/infrastructure-libvirt/<version>/`; returns the files written."""
    files = rendered(config_dir, version)
    directory = release_dir(out, version)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written

