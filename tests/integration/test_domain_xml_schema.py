"""The domain XML the core builds is valid for libvirt: checked with libvirt's own schema (virt-xml-validate)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from capi_libvirt.api import v1alpha1
from capi_libvirt.core.domain_owner import Owner
from capi_libvirt.core.domain_xml import domain_xml, from_spec

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
    # The machine's shape: UEFI, data disks on every bus, a CPU model and topology, Ignition through fw_cfg.
    "uefi-ignition-data-disks-model": {"domainType": "qemu", "firmware": "uefi", "cpus": 4, "cpuModel": "qemu64",
                                       "cpuTopology": {"sockets": 1, "cores": 2, "threads": 2},
                                       "kernelBoot": {"kernel": "/k/vmlinuz"},
                                       "dataDisks": [{"sizeGiB": 1}, {"sizeGiB": 2, "bus": "scsi"},
                                                     {"sizeGiB": 3, "bus": "sata"}]},
    "pc-uefi-topology-mode": {"machineType": "pc", "firmware": "uefi", "cpus": 2, "cpuMode": "host-passthrough",
                              "cpuTopology": {"sockets": 2, "cores": 1, "threads": 1},
                              "dataDisks": [{"sizeGiB": 1, "bus": "scsi"}]},
}
IGNITION = {"uefi-ignition-data-disks-model"}  # bootstrap data of format ignition: fw_cfg, no NoCloud CD-ROM


def config_for(name: str, owner: Owner):
    spec = v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}, **SPECS[name]})
    ignition = name in IGNITION
    return from_spec(spec, name="capi-ns-m-1a2b3c4d", uuid="5d64ece4-dc73-59e8-9624-de2ce4c5a35e",
                     disk_path="/pool/d.qcow2", iso_path=None if ignition else "/pool/d-cidata.iso",
                     serial_log_path="/logs/d.serial.log" if spec.serial_log else None, owner=owner,
                     data_disk_paths=tuple(f"/pool/d-data-{i}.qcow2" for i in range(len(spec.data_disks))),
                     ignition_path="/pool/d.ign" if ignition else None)


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
