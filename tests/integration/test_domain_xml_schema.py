"""The domain XML the core builds is valid for libvirt: checked with libvirt's own schema (virt-xml-validate)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from capi_libvirt.api import v1alpha1
from capi_libvirt.core.domain_xml import Owner, domain_xml, from_spec

from prereq import require

pytestmark = pytest.mark.integration

HOSTILE = "x<y>&z\"q'a]]>b ünï 名前 <!-- -->"
SPECS = {
    "defaults": {},
    "qemu-kernel-boot": {"domainType": "qemu", "kernelBoot": {"kernel": "/k/vmlinuz", "initrd": "/k/initrd.img"}},
    "scsi-bridge-no-extras": {"diskBus": "scsi", "guestAgent": False, "serialLog": False,
                              "interfaces": [{"bridge": "br0", "model": "rtl8139"}]},
    "pc-sata-two-nics": {"machineType": "pc", "diskBus": "sata", "cpuMode": "host-model",
                         "interfaces": [{"network": "default"}, {"bridge": "br0", "static": {"addresses": ["192.0.2.5/24"]}}]},
}


def config_for(name: str, owner: Owner):
    spec = v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}, **SPECS[name]})
    return from_spec(spec, name="capi-ns-m-1a2b3c4d", uuid="5d64ece4-dc73-59e8-9624-de2ce4c5a35e",
                     disk_path="/pool/d.qcow2", iso_path="/pool/d-cidata.iso",
                     serial_log_path="/logs/d.serial.log" if spec.serial_log else None, owner=owner)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("owner", [Owner("default", "worker-0", "uid-1", "demo"), Owner(HOSTILE, HOSTILE, HOSTILE)],
                         ids=["plain-owner", "hostile-owner"])
def test_domain_xml_validates_against_the_libvirt_schema(name: str, owner: Owner, tmp_path: pathlib.Path) -> None:
    # virt-xml-validate (libvirt-clients) is a shell script around xmllint (libxml2-utils).
    require(shutil.which("virt-xml-validate") is not None, "virt-xml-validate (apt: libvirt-clients)")
    require(shutil.which("xmllint") is not None, "xmllint (apt: libxml2-utils)")
    path = tmp_path / f"{name}.xml"
    path.write_text(domain_xml(config_for(name, owner)))
    result = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
