"""The CRDs are generated from the API models, and what is committed under config/crd is what they generate."""

from __future__ import annotations

import json
import pathlib

import pytest

from capi_libvirt.api import crd, kinds, manifests, v1alpha1

pytestmark = pytest.mark.unit
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_committed_crds_match_what_the_models_generate():
    assert manifests.differences(REPO / "config" / "crd") == [], "run `make manifests` and commit config/crd"


def test_every_kind_carries_the_v1beta2_contract_label_only_and_the_cluster_api_category():
    for definition in crd.all_definitions():
        labels = definition["metadata"]["labels"]
        assert {k: v for k, v in labels.items() if k.startswith("cluster.x-k8s.io/v")} == {
            "cluster.x-k8s.io/v1beta2": "v1alpha1"}
        assert "cluster-api" in definition["spec"]["names"]["categories"]
        assert definition["spec"]["names"]["shortNames"]


def test_machine_template_plural_is_what_cluster_autoscaler_derives_from_the_kind():
    definition = crd.custom_resource_definition(kinds.LIBVIRT_MACHINE_TEMPLATE)
    names = definition["spec"]["names"]
    assert names["plural"] == names["kind"].lower() + "s" == "libvirtmachinetemplates"


def test_schemas_are_structural_no_refs_no_unions_no_titles():
    text = json.dumps(crd.all_definitions())
    for forbidden in ('"$ref"', '"anyOf"', '"allOf"', '"oneOf"', '"title"', '"$defs"', "null"):
        assert forbidden not in text, forbidden

    def walk(node, where):
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("type") == "object", where
                assert "additionalProperties" not in node, where
            for key, value in node.items():
                if key not in ("default", "enum", "x-kubernetes-validations"):
                    walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    walk(crd.all_definitions(), "crds")


def test_machine_schema_carries_validation_defaults_and_status_subresource():
    definition = crd.custom_resource_definition(kinds.LIBVIRT_MACHINE)
    version = definition["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["image"]
    assert spec["properties"]["memoryMiB"]["minimum"] == 128
    assert spec["properties"]["domainType"]["enum"] == ["kvm", "qemu"]
    assert spec["properties"]["domainType"]["default"] == "kvm"
    assert spec["properties"]["providerID"]["maxLength"] == 512
    assert spec["properties"]["interfaces"]["default"] == [{"network": "default", "model": "virtio"}]
    rules = spec["properties"]["interfaces"]["items"]["x-kubernetes-validations"]
    assert rules[0]["rule"] == "has(self.network) != has(self.bridge)"
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns[:5] == ["Cluster", "Host", "State", "ProviderID", "Address"]


def test_template_capacity_is_a_map_of_strings():
    status = crd.custom_resource_definition(kinds.LIBVIRT_MACHINE_TEMPLATE)["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["capacity"]["additionalProperties"] == {"type": "string"}


def test_python_models_refuse_what_the_schema_refuses():
    with pytest.raises(ValueError, match="exactly one of network or bridge"):
        v1alpha1.NetworkInterface(network="default", bridge="br0")
    with pytest.raises(ValueError, match="memoryMiB"):
        v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}, "memoryMiB": -1})
    spec = v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}})
    assert spec.to_api()["interfaces"] == [{"network": "default", "model": "virtio"}]


def test_exclusive_bounds_use_the_openapi_v3_boolean_form():
    host = crd.custom_resource_definition(kinds.LIBVIRT_HOST)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    cpu = host["properties"]["spec"]["properties"]["overcommit"]["properties"]["cpu"]
    assert (cpu["minimum"], cpu["exclusiveMinimum"]) == (0, True)


def test_clusterctl_move_lists_every_kind_and_copies_hosts_without_deleting_them_from_the_source():
    """clusterctl move lists only kinds whose CRD carries `clusterctl.cluster.x-k8s.io`; move-hierarchy on the
    cluster-scoped LibvirtHost makes it (and a Secret it owns) copied, never deleted from the source. The namespaced
    kinds move through their owners, so they get no move label of their own."""
    for definition in crd.all_definitions():
        labels = definition["metadata"]["labels"]
        assert labels["clusterctl.cluster.x-k8s.io"] == ""
        moves_hierarchy = "clusterctl.cluster.x-k8s.io/move-hierarchy" in labels
        assert moves_hierarchy == (definition["spec"]["names"]["kind"] == kinds.LIBVIRT_HOST.kind)
        assert "clusterctl.cluster.x-k8s.io/move" not in labels
    assert crd.crd_labels(kinds.LIBVIRT_HOST)["clusterctl.cluster.x-k8s.io/move-hierarchy"] == ""
