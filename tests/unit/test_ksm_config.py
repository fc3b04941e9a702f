"""The kube-state-metrics configuration for our kinds (config/kube-state-metrics) names only fields our CRDs have: every
path of every metric and label resolves in the generated schema, so a renamed field breaks this test, not a user's
dashboard. (kube-state-metrics itself does not run here: what it makes of a valid path is its own business.)"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from capi_libvirt.api import crd, kinds

from fixtures_control_plane import REPO

pytestmark = pytest.mark.unit

CONFIG = yaml.safe_load((REPO / "config" / "kube-state-metrics" / "custom-resource-state.yaml").read_text())
OBJECT_META = {"name", "namespace", "uid", "labels", "annotations"}


def schema_of(gvk: dict[str, str]) -> dict[str, Any]:
    [kind] = [k for k in kinds.ALL if k.kind == gvk["kind"]]
    definition = crd.custom_resource_definition(kind)
    assert (definition["spec"]["group"], definition["spec"]["versions"][0]["name"]) == (gvk["group"], gvk["version"])
    return definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def resolve(schema: dict[str, Any], path: list[str], where: str) -> dict[str, Any]:
    """The schema at `path`; a list's elements are stepped into, a map's values stand for any key."""
    if path[:1] == ["metadata"]:
        assert len(path) >= 2 and path[1] in OBJECT_META, f"{where}: {path}"
        assert len(path) == 2 or path[1] in ("labels", "annotations"), f"{where}: {path}"
        return {"type": "string"}
    node = schema
    for key in path:
        if node.get("type") == "array":
            node = node["items"]
        if key in node.get("properties", {}):
            node = node["properties"][key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            raise AssertionError(f"{where}: {'.'.join(path)} is not a field ({key} unknown)")
    return node


def metrics_of(resource: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    field = {"Gauge": "gauge", "Info": "info", "StateSet": "stateSet"}  # kube-state-metrics' metric types
    return [(metric["name"], metric["each"], metric["each"][field[metric["each"]["type"]]])
            for metric in resource["metrics"]]


@pytest.mark.parametrize("resource", CONFIG["spec"]["resources"], ids=lambda r: r["groupVersionKind"]["kind"])
def test_every_path_is_a_field_of_the_kind(resource: dict[str, Any]) -> None:
    schema = schema_of(resource["groupVersionKind"])
    kind = resource["groupVersionKind"]["kind"]
    for label, path in resource["labelsFromPath"].items():
        resolve(schema, path, f"{kind} label {label}")
    for name, each, body in metrics_of(resource):
        where = f"{kind} metric {name}"
        base = resolve(schema, body["path"], where) if "path" in body else schema
        element = base.get("items", base) if base.get("type") == "array" else base
        for label, path in (body.get("labelsFromPath") or {}).items():
            resolve(element, path, f"{where} label {label}")
        if "valueFrom" in body:
            resolve(element, body["valueFrom"], f"{where} value")
        if each["type"] == "Gauge":
            assert base.get("type") in ("boolean", "integer", "number", "string"), f"{where}: {base}"


def test_every_kind_with_a_status_has_metrics() -> None:
    configured = {r["groupVersionKind"]["kind"] for r in CONFIG["spec"]["resources"]}
    assert configured == {k.kind for k in kinds.ALL if k.status is not None}
    for resource in CONFIG["spec"]["resources"]:
        assert resource["metricNamePrefix"] == f"capi_{resource['groupVersionKind']['kind'].lower()}"
        for _name, _each, body in metrics_of(resource):
            assert body is not None
