"""Generate CustomResourceDefinitions from the API models: pydantic JSON Schema in, structural OpenAPI v3 out.

Kubernetes wants a structural schema: every node typed, no $ref, no anyOf around nullable types, no
`additionalProperties` beside `properties`. Pydantic's JSON Schema is close; `structural` closes the gap.
"""

from __future__ import annotations

import copy
from typing import Any

import pydantic

from capi_libvirt.api import kinds, meta

# The one contract this provider claims: v1beta2, which Cluster API v1.11 introduced (tested here with v1.12.8). No
# v1beta1 label: it would claim managers of the v1beta1 contract (Cluster API v1.10 and older), which are not tested,
# and Cluster API's lookup of the contract of an apiVersion would pick either label at random.
CONTRACT_LABELS = {"cluster.x-k8s.io/v1beta2": meta.VERSION}
# clusterctl move lists only the kinds whose CRD carries this label (`clusterctl init` adds it; a CRD applied from
# config/crd needs it too). The namespaced kinds then move through their ownerReferences (Cluster, Machine).
CLUSTERCTL_LABELS = {"clusterctl.cluster.x-k8s.io": ""}
# LibvirtHosts own nothing and nothing owns them: move-hierarchy makes clusterctl copy every host (and a Secret with an
# ownerReference to one) to the target if absent, and never delete them from the source, where other clusters may
# still use them.
MOVE_HIERARCHY_LABELS = {"clusterctl.cluster.x-k8s.io/move-hierarchy": ""}
# Keywords a CRD schema node may carry; anything else pydantic emits (title, ...) is dropped.
KEPT_KEYWORDS = {
    "type", "description", "properties", "required", "items", "additionalProperties", "enum", "default", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems",
    "maxItems", "uniqueItems", "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
}

# Keywords whose values are data, not sub-schemas: copied as they are.
VERBATIM_KEYWORDS = {"default", "enum", "required", "x-kubernetes-validations", "x-kubernetes-list-map-keys"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline every $ref and fold `anyOf: [X, null]` (pydantic's Optional) into X."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **extra}, defs)
    if "anyOf" in node:
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        if len(variants) != 1:
            raise ValueError(f"unions other than Optional[X] have no structural schema: {node}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", ...) is None:
            del rest["default"]  # an Optional's None default means "absent", not a value to store
        return _resolve({**variants[0], **rest}, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _without_nulls(value: Any) -> Any:
    """A default without its None members: a stored null is not "unset" to the API server."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _prune(node: Any) -> Any:
    """Keep only CRD keywords; drop `additionalProperties: false` (pruning already removes unknown fields)."""
    if isinstance(node, list):
        return [_prune(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in KEPT_KEYWORDS:
            continue
        if key == "properties":
            out[key] = {name: _prune(sub) for name, sub in value.items()}
        elif key in VERBATIM_KEYWORDS:
            out[key] = _without_nulls(value)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _prune(value)
        else:
            out[key] = _prune(value)
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(exclusive), (int, float)) and not isinstance(out.get(exclusive), bool):
            out[bound], out[exclusive] = out[exclusive], True  # JSON Schema 2020 -> OpenAPI v3.0 (boolean flag)
    if "properties" in out:
        out.setdefault("type", "object")
    return out


def structural(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model, as the Kubernetes API accepts it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _prune(_resolve(raw, defs))
    return schema


def _object_schema(kind: kinds.Kind) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string", "description": "Versioned schema of this representation of an object."},
        "kind": {"type": "string", "description": "REST resource this object represents."},
        "metadata": {"type": "object"},
        "spec": structural(kind.spec),
    }
    if kind.spec_validations is not None:
        # After the model's own rules (on its spec model), the kind's (immutability, computed from the schema).
        rules = properties["spec"].pop("x-kubernetes-validations", [])
        properties["spec"]["x-kubernetes-validations"] = rules + kind.spec_validations(properties["spec"])
    if kind.status is not None:
        properties["status"] = structural(kind.status)
    return {"type": "object", "description": kind.description, "properties": properties, "required": ["spec"]}


def crd_labels(kind: kinds.Kind) -> dict[str, str]:
    """The contract label, clusterctl's, and move-hierarchy on the one cluster-scoped kind that move must copy."""
    labels = {**CONTRACT_LABELS, **CLUSTERCTL_LABELS}
    if kind is kinds.LIBVIRT_HOST:
        labels.update(MOVE_HIERARCHY_LABELS)
    return labels


def custom_resource_definition(kind: kinds.Kind) -> dict[str, Any]:
    """The CRD of one kind, with status subresource, printer columns, short names and the contract labels."""
    version: dict[str, Any] = {
        "name": meta.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": _object_schema(kind)},
    }
    if kind.status is not None:
        version["subresources"] = {"status": {}}
    if kind.columns:
        version["additionalPrinterColumns"] = [
            {
                "name": column.name,
                "type": column.type,
                "jsonPath": column.json_path,
                "description": column.description,
                **({"priority": column.priority} if column.priority else {}),
            }
            for column in kind.columns
        ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{meta.GROUP}", "labels": crd_labels(kind)},
        "spec": {
            "group": meta.GROUP,
            "scope": kind.scope,
            "names": {
                "kind": kind.kind,
                "listKind": kind.list_kind,
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": list(kind.categories),
            },
            "versions": [version],
        },
    }


def all_definitions() -> list[dict[str, Any]]:
    return [custom_resource_definition(kind) for kind in kinds.ALL]
