"""The clusterctl release artifacts: infrastructure-components.yaml, metadata.yaml and the cluster templates.

`python -m capi_libvirt.api.release` writes them with nothing but Python, pydantic and pyyaml installed (`make
release-manifests`, `make templates`); `capi-libvirt release-manifests` and `capi-libvirt templates` are the same.
Laid out as a clusterctl local repository, `<out>/infrastructure-libvirt/<version>/`, so
`providers: [{name: libvirt, type: InfrastructureProvider, url: file://<out>/infrastructure-libvirt/<version>/
infrastructure-components.yaml}]` in clusterctl.yaml serves them. Every document is built as a Python dict and dumped
by pyyaml; clusterctl's variables (`${VAR}`, `${VAR:=default}`) are plain string values in them.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from collections.abc import Iterable
from typing import Any

import yaml

from capi_libvirt.api import manifests, quoting, templates

PROVIDER_LABEL = "infrastructure-libvirt"  # clusterctl's name for the provider: <type>-<name>
PROVIDER_LABEL_KEY = "cluster.x-k8s.io/provider"
IMAGE_VARIABLE = "CAPI_LIBVIRT_IMAGE"
IMAGE_REPOSITORY = "ghcr.io/capi-libvirt/capi-libvirt"
CONTRACT = "v1beta2"  # the Cluster API contract the release series implements (Cluster API v1.11 and later)
# Every release series there has been, oldest first, with the contract it implements: metadata.yaml lists them all,
# since `clusterctl upgrade` looks up both the installed release's series and the new one's. A new minor adds a line.
RELEASE_SERIES: tuple[tuple[int, int, str], ...] = (
    (0, 1, CONTRACT),
)

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

def metadata(version: str, series: Iterable[tuple[int, int, str]] = RELEASE_SERIES) -> dict[str, Any]:
    """The release series -> contract map clusterctl reads (and validates: apiVersion, kind, non-empty series): every
    series up to this release's, which must be among them (a release of an unlisted series is refused)."""
    major, minor = parse_version(version)
    known = sorted(series)
    if not any((s_major, s_minor) == (major, minor) for s_major, s_minor, _ in known):
        raise ReleaseError(f"version {version}: its series v{major}.{minor} is not in release.RELEASE_SERIES")
    return {
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [{"major": s_major, "minor": s_minor, "contract": contract}
                          for s_major, s_minor, contract in known if (s_major, s_minor) <= (major, minor)],
    }


# -- writing ---------------------------------------------------------------------------------------------------------

HEADER = "# Generated by `capi-libvirt release-manifests` from config/ and src/capi_libvirt/api; do not edit.\n"


def _dump_all(documents: Iterable[dict[str, Any]]) -> str:
    return HEADER + yaml.dump_all(list(documents), Dumper=quoting.Dumper, sort_keys=False, width=120, explicit_start=True)


def rendered_templates() -> dict[str, str]:
    """File name -> YAML text of the cluster templates (one per flavor) and the ClusterClasses: the same in every
    release of this code, and committed under templates/ (`make templates`; a test fails when they drift)."""
    return {
        **{templates.file_name(flavor): _dump_all(build()) for flavor, build in templates.FLAVORS.items()},
        **{templates.cluster_class_file_name(name): _dump_all(build())
           for name, build in templates.CLUSTER_CLASSES.items()},
    }


def rendered(config_dir: pathlib.Path, version: str) -> dict[str, str]:
    """File name -> YAML text of the release's files."""
    return {
        COMPONENTS: _dump_all(components(config_dir, version)),
        METADATA: HEADER + yaml.safe_dump(metadata(version), sort_keys=False),
        **rendered_templates(),
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



def stale_templates(directory: pathlib.Path) -> list[str]:
    """The files of `directory` that differ from, are missing from or are not among the rendered templates."""
    files = rendered_templates()
    stale = [name for name, text in files.items()
             if not (directory / name).is_file() or (directory / name).read_text() != text]
    return sorted(stale + [path.name for path in directory.glob("*.yaml") if path.name not in files])


def write_templates(directory: pathlib.Path) -> list[pathlib.Path]:
    """Write the rendered templates into `directory`, removing YAML files no flavor renders any more."""
    files = rendered_templates()
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.glob("*.yaml"):
        if path.name not in files:
            path.unlink()
    for name, text in files.items():
        (directory / name).write_text(text)
    return [directory / name for name in files]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capi_libvirt.api.release", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write_ = sub.add_parser("write", help="the release, as a clusterctl local repository")
    write_.add_argument("--out", default="out", help="output folder (default: out); the files go to "
                        "OUT/infrastructure-libvirt/VERSION/, a clusterctl local repository")
    write_.add_argument("--version", required=True, help="release version, e.g. v0.1.0")
    write_.add_argument("--config", default="config", help="the config/ folder (default: config)")
    templates_ = sub.add_parser("templates", help="the cluster templates and ClusterClasses alone")
    templates_.add_argument("--dir", default="templates", help="output folder (default: templates)")
    templates_.add_argument("--check", action="store_true", help="only report whether the folder is current")
    args = parser.parse_args(argv)
    if args.command == "templates":
        directory = pathlib.Path(args.dir)
        if args.check:
            stale = stale_templates(directory)
            print(f"cluster templates are out of date in {directory}: {', '.join(stale)}; run `make templates`"
                  if stale else f"{directory}: up to date")
            return 1 if stale else 0
        written = write_templates(directory)
    else:
        config_dir = pathlib.Path(args.config)
        stale = manifests.differences(config_dir / "crd")
        if stale:
            print(f"generated manifests are out of date in {config_dir / 'crd'}: {', '.join(stale)}; "
                  "run `make manifests`")
            return 1
        try:
            written = write(pathlib.Path(args.out), args.version, config_dir)
        except ReleaseError as error:
            print(f"release-manifests: {error}")
            return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
