"""Properties of the pure core under hostile input (Hypothesis, deterministic: see tests/hostile_inputs.py).

- Every spec the API model accepts becomes a well-formed domain XML whose values read back as written, with the owner
  recoverable; a spec it refuses is refused with a ValidationError, never another exception.
- Owners (namespace, name, UID, cluster) of any text either read back exactly from the XML or are refused.
- Names derived from any namespace, name and UID are libvirt-, file- and DNS-safe and within their limits.
- The NoCloud ISO carries any user-data (binary, gzip, NULs, metacharacters) byte for byte, read back with pycdlib.
- meta-data and network-config stay the documents they claim to be, whatever the hostname or addresses.
"""

from __future__ import annotations

import io
import ipaddress
import json
import re
import uuid
import xml.etree.ElementTree as ET

import pycdlib
import pydantic
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from capi_libvirt.api import v1alpha1
from capi_libvirt.core import cloud_init, domain_owner, domain_xml, naming, nocloud

from hostile_inputs import COUNTS, hostile_text, machine_spec, user_data

pytestmark = pytest.mark.unit
hostile = settings(settings.get_profile("hostile"), max_examples=400)


def accepted(spec: dict) -> v1alpha1.LibvirtMachineSpec | None:
    """The spec as the API model reads it (strictly, from JSON, as the API server stores it), or None if refused."""
    try:
        return v1alpha1.LibvirtMachineSpec.model_validate_json(json.dumps(spec), strict=True)
    except pydantic.ValidationError:
        return None


OWNER = domain_owner.Owner("ns", "m", "3e1f0c43-2b5e-4f0c-9a38-2a7c9b1c0a11", "demo")


def build(spec: v1alpha1.LibvirtMachineSpec, owner: domain_owner.Owner = OWNER) -> str:
    config = domain_xml.from_spec(spec, name=naming.domain_name(owner.namespace, owner.name, owner.uid),
                                  uuid=naming.domain_uuid(owner.uid), disk_path="/pool/d.qcow2",
                                  iso_path="/pool/d-cidata.iso", serial_log_path="/pool/d.serial.log", owner=owner,
                                  data_disk_paths=tuple(f"/pool/d-data-{i}.qcow2" for i in range(len(spec.data_disks))))
    return domain_xml.domain_xml(config)


@hostile
@given(machine_spec())
@example({"image": {"volume": "b"}, "kernelBoot": {"kernel": "/k", "cmdline": "console=ttyS0\x00"}})  # bug 1
@example({"image": {"volume": "b"}, "kernelBoot": {"kernel": "/k\x1b[2J", "initrd": "/i\x07"}})  # bug 1
@example({"image": {"volume": "b"}, "kernelBoot": {"kernel": "/k", "cmdline": "a\rb"}})  # bug 1 (\r reads back \n)
@example({"image": {"volume": "b"}, "interfaces": [{"network": "n", "macAddress": "01:00:5e:00:00:01"}]})  # bug 2
@example({"image": {"volume": "b"}, "interfaces": [{"network": "n", "macAddress": "52:00:00:00:00:00"},
                                                  {"network": "n", "macAddress": "52:00:00:00:00:00"}]})  # bug 8
@example({"image": {"volume": "b"}, "interfaces": [{"network": "n", "macAddress": "52:00:00:00:00:0a"},
                                                  {"bridge": "b", "macAddress": "52:00:00:00:00:0A"}]})  # bug 8
def test_every_accepted_spec_is_a_well_formed_domain_that_reads_back(spec: dict) -> None:
    COUNTS["unit: machine specs -> domain XML"] += 1
    model = accepted(spec)
    if model is None:
        return
    root = ET.fromstring(build(model))
    assert root.findtext("uuid") == naming.domain_uuid(OWNER.uid)
    assert domain_owner.parse_owner(ET.tostring(root, encoding="unicode")) == OWNER
    assert root.find("os/type").get("machine") == model.machine_type
    if model.kernel_boot is not None:
        assert root.findtext("os/kernel") == model.kernel_boot.kernel
        assert root.findtext("os/cmdline") == model.kernel_boot.cmdline
        assert root.findtext("os/initrd") == model.kernel_boot.initrd
    macs = [element.get("address") for element in root.iterfind("devices/interface/mac")]
    assert len(macs) == len(model.interfaces) == len(set(macs))
    for mac in macs:  # what libvirt accepts: unicast, lowercase
        assert re.fullmatch(r"[0-9a-f][02468ace](:[0-9a-f]{2}){5}", mac), mac


@hostile
@given(hostile_text(), hostile_text(), hostile_text(), st.none() | hostile_text())
@example("ns", "a\rb", "uid", None)  # carriage returns read back as newlines from XML text: refused instead
def test_any_owner_reads_back_exactly_or_is_refused(namespace: str, name: str, uid: str, cluster: str | None) -> None:
    COUNTS["unit: owners -> domain metadata"] += 1
    try:
        owner = domain_owner.Owner(namespace, name, uid, cluster)
    except ValueError:
        return
    xml = domain_xml.domain_xml(domain_xml.DomainConfig(
        name="capi-x-1", uuid=str(uuid.uuid4()), vcpus=1, memory_mib=128, disk_path="/d", owner=owner,
        title=None if "\n" in f"{namespace}/{name}" else f"{namespace}/{name}",
        description=f"machine {namespace}/{name}"))
    assert domain_owner.parse_owner(xml) == domain_owner.Owner(namespace, name, uid, cluster or None)


def test_host_passthrough_on_emulation_is_refused_by_the_model() -> None:
    """Bug 7: libvirt refuses it at every start of a qemu domain; refused once, at admission, instead (the CRD's CEL
    rule says the same: tests/integration/test_hostile_admission.py checks they agree)."""
    assert accepted({"image": {"volume": "b"}, "cpuMode": "host-passthrough", "domainType": "qemu"}) is None
    assert accepted({"image": {"volume": "b"}, "cpuMode": "host-passthrough"}) is not None  # kvm, the default
    assert accepted({"image": {"volume": "b"}, "cpuMode": "maximum", "domainType": "qemu"}) is not None


LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
VOLUME = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")


@settings(settings.get_profile("hostile"), max_examples=1000)
@given(hostile_text(300), hostile_text(300), hostile_text(60).filter(lambda uid: uid.strip() != ""))
@example("n" * 63, "m" * 253, "uid")
@example("ß", "İ" * 100, "\x00")
def test_names_are_libvirt_file_and_dns_safe_and_within_their_limits(namespace: str, name: str, uid: str) -> None:
    COUNTS["unit: names"] += 1
    domain = naming.domain_name(namespace, name, uid)
    assert LABEL.fullmatch(domain) and len(domain) <= naming.DOMAIN_NAME_MAX, domain
    assert domain.startswith("capi-") and domain.endswith("-" + naming.uid_hash(uid))
    for volume in (naming.overlay_volume_name(namespace, name, uid), naming.nocloud_volume_name(namespace, name, uid),
                   naming.serial_log_file_name(namespace, name, uid)):
        assert VOLUME.fullmatch(volume) and len(volume.encode()) <= naming.VOLUME_NAME_MAX, volume
    host = naming.hostname(name)
    assert LABEL.fullmatch(host) and len(host) <= naming.HOSTNAME_MAX, host
    mac = naming.mac_address(uid, 0)
    assert re.fullmatch(r"52:54:00(:[0-9a-f]{2}){3}", mac)
    assert uuid.UUID(naming.domain_uuid(uid)).version == 5


def read_back(image: bytes, **path: str) -> bytes:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    try:
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, **path)
        return out.getvalue()
    finally:
        iso.close()


@settings(settings.get_profile("hostile"), max_examples=150)
@given(user_data(max_size=64 * 1024), hostile_text(300))
@example(user_data=b"", name="m")
@example(user_data=bytes(range(256)) * 4096, name="m" * 253)  # 1 MiB, the Secret limit
def test_nocloud_iso_carries_any_user_data_byte_for_byte(user_data: bytes, name: str) -> None:
    COUNTS["unit: NoCloud ISOs"] += 1
    meta = cloud_init.meta_data("5d64ece4-dc73-59e8-9624-de2ce4c5a35e", naming.hostname(name), "libvirt://h/u")
    image = nocloud.build_nocloud_iso(user_data, meta)
    assert read_back(image, rr_path="/user-data") == user_data
    assert read_back(image, joliet_path="/user-data") == user_data
    assert read_back(image, iso_path=nocloud.iso9660_path("user-data")) == user_data
    assert yaml.safe_load(read_back(image, rr_path="/meta-data")) == {
        "instance-id": "5d64ece4-dc73-59e8-9624-de2ce4c5a35e", "local-hostname": naming.hostname(name),
        "provider-id": "libvirt://h/u"}


@hostile
@given(hostile_text(), hostile_text(), hostile_text())
def test_meta_data_is_three_keys_whatever_the_values(instance: str, host: str, provider: str) -> None:
    COUNTS["unit: meta-data"] += 1
    assert yaml.safe_load(cloud_init.meta_data(instance, host, provider)) == {
        "instance-id": instance, "local-hostname": host, "provider-id": provider}


@hostile
@given(machine_spec())
@example({"image": {"volume": "b"}, "interfaces": [{"network": "n", "static": {
    "addresses": ["999.1.1.1/99", "::::/7"], "gateway": "1.2.3", "nameservers": ["a.b"]}}]})  # bug 3
@example({"image": {"volume": "b"}, "interfaces": [{"network": "n", "static": {"addresses": ["1.2.3.4/33"]}}]})  # bug 3
def test_network_config_of_an_accepted_spec_matches_its_interfaces(spec: dict) -> None:
    COUNTS["unit: network-config"] += 1
    model = accepted(spec)
    if model is None:
        return
    macs = [naming.mac_address("uid", i) for i in range(len(model.interfaces))]
    document = yaml.safe_load(cloud_init.network_config(model.interfaces, macs) or b"{}")
    for index, nic in enumerate(model.interfaces):
        ethernet = document["ethernets"][f"nic{index}"]
        assert ethernet["match"] == {"macaddress": macs[index]}
        if nic.static is not None:  # every address netplan gets is one: admission refused the rest
            assert ethernet["addresses"] == nic.static.addresses
            for address in ethernet["addresses"]:
                ipaddress.ip_interface(address)
            for server in (ethernet.get("nameservers") or {}).get("addresses", []):
                ipaddress.ip_address(server)
            for route in ethernet.get("routes", []):
                ipaddress.ip_address(route["via"])
