"""Hostile input through admission on the real kube-apiserver: generated LibvirtMachines, LibvirtMachineTemplates,
LibvirtHosts and bootstrap Secrets, each sent as a server-side dry-run create (strict field validation).

The oracle is the product's own reading: the API models (what the reconcile validates stored specs with) and
Kubernetes' rules for object names, labels and Secrets. For every object, admission and the oracle agree; a refusal is
a 4xx naming what is wrong (never a 5xx); every accepted machine spec, read back as stored (defaults applied), passes
the model again and becomes a domain XML that libvirt's own schema (domain.rng, as virt-xml-validate uses) accepts;
every accepted bootstrap value rides the NoCloud ISO byte for byte. Deterministic: tests/hostile_inputs.py.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import shutil
import subprocess
import uuid
from typing import Any

import pycdlib
import pydantic
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from capi_libvirt.api import meta, v1alpha1, v1alpha1_host
from capi_libvirt.core import cloud_init, domain_owner, domain_xml, naming, nocloud
from devenv.control_plane import ControlPlaneError, LocalControlPlane

from hostile_inputs import COUNTS, SECRET_LIMIT, bootstrap_secret_data, host_spec, machine_spec, object_metadata
from prereq import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
DOMAIN_SCHEMA = pathlib.Path("/usr/share/libvirt/schemas/domain.rng")
DRY_RUN = "?dryRun=All&fieldValidation=Strict"


def hostile(examples: int) -> settings:
    return settings(settings.get_profile("hostile"), max_examples=examples)


# -- the oracle ---------------------------------------------------------------------------------------------------
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def name_ok(name: str, limit: int = 253) -> bool:
    return len(name) <= limit and DNS_SUBDOMAIN.fullmatch(name) is not None


def label_ok(key: str, value: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if "/" in key and not name_ok(prefix):
        return False
    return len(name) <= 63 and bool(LABEL_NAME.fullmatch(name)) and \
        len(value) <= 63 and (value == "" or bool(LABEL_NAME.fullmatch(value)))


def metadata_ok(metadata: dict[str, Any]) -> bool:
    return name_ok(metadata["name"]) and all(label_ok(k, v) for k, v in (metadata.get("labels") or {}).items())


def without_nulls(value: Any) -> Any:
    """What the API server stores: a null field is pruned (it reads as unset) before defaulting and validation."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def model_accepts(model: type[pydantic.BaseModel], spec: Any) -> bool:
    try:
        model.model_validate_json(json.dumps(without_nulls(spec)), strict=True)
        return True
    except pydantic.ValidationError:
        return False


def dry_run(plane: LocalControlPlane, collection: str, body: dict[str, Any]) -> tuple[bool, Any]:
    """(accepted, the object as it would be stored) or (refused, the API server's message)."""
    try:
        return True, plane.request("POST", collection + DRY_RUN, body)
    except ControlPlaneError as error:
        assert error.status is not None and 400 <= error.status < 500, f"not a clean refusal: {error}"[:2000]
        return False, str(error)


def check_verdict(accepted: bool, expected: bool, body: Any, answer: Any) -> None:
    what = json.dumps(body, ensure_ascii=True)[:1500]
    assert accepted == expected, (
        f"admission {'accepted' if accepted else 'refused'} what the model {'refuses' if accepted else 'accepts'}:"
        f" {what}\nAPI server: {str(answer)[:1500]}")


def machine_collection(namespace: str, plural: str = "libvirtmachines") -> str:
    return f"/apis/{meta.GROUP}/{meta.VERSION}/namespaces/{namespace}/{plural}"


def validate_with_libvirt_schema(folder: pathlib.Path) -> int:
    """Every *.xml in `folder` against libvirt's domain schema, in one xmllint run; how many there were."""
    files = sorted(folder.glob("*.xml"))
    if files:
        result = subprocess.run(["xmllint", "--noout", "--relaxng", str(DOMAIN_SCHEMA), *map(str, files)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
    return len(files)


def domain_of(stored: dict[str, Any], namespace: str) -> str:
    spec = v1alpha1.LibvirtMachineSpec.model_validate(stored["spec"])  # as the reconcile reads the stored object
    name, uid = stored["metadata"]["name"], stored["metadata"].get("uid") or str(uuid.uuid4())
    owner = domain_owner.Owner(namespace, name, uid, (stored["metadata"].get("labels") or {}).get(meta.CLUSTER_NAME_LABEL))
    return domain_xml.domain_xml(domain_xml.from_spec(
        spec, name=naming.domain_name(namespace, name, uid), uuid=naming.domain_uuid(uid),
        disk_path=f"/pool/{naming.overlay_volume_name(namespace, name, uid)}",
        iso_path=f"/pool/{naming.nocloud_volume_name(namespace, name, uid)}",
        serial_log_path=f"/pool/{naming.serial_log_file_name(namespace, name, uid)}", owner=owner,
        data_disk_paths=tuple(f"/pool/{naming.data_disk_volume_name(namespace, name, uid, index)}"
                              for index in range(len(spec.data_disks)))))


@pytest.fixture
def schema_tools() -> None:
    require(shutil.which("xmllint") is not None and DOMAIN_SCHEMA.exists(),
            "xmllint and libvirt's schemas (apt: libxml2-utils, libvirt-clients)")


# -- the tests ----------------------------------------------------------------------------------------------------
def test_generated_machines_are_admitted_exactly_when_the_model_accepts_them(
        control_plane, plain_namespace, schema_tools, tmp_path):
    namespace, collection = plain_namespace, machine_collection(plain_namespace)

    @hostile(300)
    @given(object_metadata(), machine_spec())
    @example({"name": "m"}, {"image": {"volume": "b"}, "kernelBoot": {"kernel": "/k", "cmdline": "a\x00b"}})  # bug 1
    @example({"name": "m"}, {"image": {"volume": "b"}, "kernelBoot": {"kernel": "/k\x1b", "cmdline": "a\rb"}})  # bug 1
    @example({"name": "m"}, {"image": {"volume": "b"}, "interfaces": [{"network": "n", "macAddress":
                                                                      "01:00:5e:00:00:01"}]})  # bug 2
    @example({"name": "m"}, {"image": {"volume": "b"}, "interfaces": [{"network": "n", "static": {
        "addresses": ["999.1.1.1/99"], "gateway": "::::", "nameservers": ["1.2.3"]}}]})  # bug 3
    @example({"name": "m"}, {"image": {"volume": "b"}, "machineType": "pc+1", "interfaces": [{"bridge": "br+0"}]})  # bug 4
    @example({"name": "m"}, {"image": {"volume": "b"}, "cpuMode": "host-passthrough", "domainType": "qemu"})  # bug 7
    @example({"name": "m"}, {"image": {"volume": "b"}, "interfaces": [
        {"network": "n", "macAddress": "52:00:00:00:00:0a"}, {"bridge": "b", "macAddress": "52:00:00:00:00:0A"}]})  # 8
    @example({"name": "m" * 253, "labels": {"a" * 253 + "/" + "n" * 63: "v" * 63}}, {"image": {"volume": "v" * 255}})
    def one(metadata: dict[str, Any], spec: dict[str, Any]) -> None:
        COUNTS["admission: LibvirtMachines"] += 1
        body = {"apiVersion": meta.API_VERSION, "kind": "LibvirtMachine", "metadata": metadata, "spec": spec}
        accepted, answer = dry_run(control_plane, collection, body)
        check_verdict(accepted, metadata_ok(metadata) and model_accepts(v1alpha1.LibvirtMachineSpec, spec),
                      body, answer)
        if accepted:
            COUNTS["admission: LibvirtMachines accepted"] += 1
            xml = domain_of(answer, namespace)
            (tmp_path / f"{COUNTS['admission: LibvirtMachines accepted']}.xml").write_text(xml)
        else:
            assert "spec" in answer or "metadata" in answer or "name" in answer, answer[:500]

    before = COUNTS["admission: LibvirtMachines"]
    one()
    assert COUNTS["admission: LibvirtMachines"] - before >= 300
    COUNTS["admission: accepted domains validated with domain.rng"] += validate_with_libvirt_schema(tmp_path)


def test_generated_machine_templates_are_admitted_exactly_when_the_model_accepts_them(control_plane, plain_namespace):
    collection = machine_collection(plain_namespace, "libvirtmachinetemplates")

    @hostile(50)
    @given(object_metadata(), machine_spec())
    def one(metadata: dict[str, Any], spec: dict[str, Any]) -> None:
        COUNTS["admission: LibvirtMachineTemplates"] += 1
        template = {"template": {"spec": spec}}
        body = {"apiVersion": meta.API_VERSION, "kind": "LibvirtMachineTemplate", "metadata": metadata,
                "spec": template}
        accepted, answer = dry_run(control_plane, collection, body)
        check_verdict(accepted, metadata_ok(metadata) and model_accepts(v1alpha1.LibvirtMachineTemplateSpec, template),
                      body, answer)

    before = COUNTS["admission: LibvirtMachineTemplates"]
    one()
    assert COUNTS["admission: LibvirtMachineTemplates"] - before >= 50


def test_generated_hosts_are_admitted_exactly_when_the_model_accepts_them(control_plane):
    collection = f"/apis/{meta.GROUP}/{meta.VERSION}/libvirthosts"

    @hostile(75)
    @given(object_metadata(), host_spec())
    def one(metadata: dict[str, Any], spec: dict[str, Any]) -> None:
        COUNTS["admission: LibvirtHosts"] += 1
        body = {"apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": metadata, "spec": spec}
        accepted, answer = dry_run(control_plane, collection, body)
        check_verdict(accepted, metadata_ok(metadata) and model_accepts(v1alpha1_host.LibvirtHostSpec, spec), body, answer)

    before = COUNTS["admission: LibvirtHosts"]
    one()
    assert COUNTS["admission: LibvirtHosts"] - before >= 75


def secret_ok(data: dict[str, bytes]) -> bool:
    keys_ok = all(len(k) <= 253 and SECRET_KEY.fullmatch(k) and k not in (".", "..") for k in data)
    return keys_ok and sum(len(v) for v in data.values()) <= SECRET_LIMIT


def read_user_data(image: bytes) -> bytes:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    out = io.BytesIO()
    iso.get_file_from_iso_fp(out, rr_path="/user-data")
    iso.close()
    return out.getvalue()


def test_generated_bootstrap_secrets_are_admitted_by_size_and_keys_and_ride_the_iso_unchanged(
        control_plane, plain_namespace):
    import base64
    collection = f"/api/v1/namespaces/{plain_namespace}/secrets"

    @hostile(75)
    @given(st.sampled_from(["m", "m" * 253]), bootstrap_secret_data())
    @example("m", {"value": b"\x00" * SECRET_LIMIT})
    @example("m", {"value": b"\x00" * SECRET_LIMIT, "format": b"cloud-config"})  # one byte per key over: refused
    def one(name: str, data: dict[str, bytes]) -> None:
        COUNTS["admission: bootstrap Secrets"] += 1
        body = {"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                "metadata": {"name": name, "labels": {meta.CLUSTER_NAME_LABEL: "demo"}},
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
        accepted, answer = dry_run(control_plane, collection, body)
        check_verdict(accepted, secret_ok(data), {"name": name, "sizes": {k: len(v) for k, v in data.items()}}, answer)
        if accepted and data.get("value"):
            meta_data = cloud_init.meta_data("i", "h", "libvirt://h/u")
            assert read_user_data(nocloud.build_nocloud_iso(data["value"], meta_data)) == data["value"]

    before = COUNTS["admission: bootstrap Secrets"]
    one()
    assert COUNTS["admission: bootstrap Secrets"] - before >= 75
