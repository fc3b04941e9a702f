"""The test hosts' QEMU wrapper (devenv/kvm_as_tcg.py), run with a stand-in for QEMU that prints its arguments: a
domain's `-accel kvm` becomes TCG with the provider's translation cache for its memory, as libvirt 9 and libvirt 11
write `-m`; libvirt's capability probes pass through unchanged."""

from __future__ import annotations

import subprocess

import pytest

from capi_libvirt.core.domain_xml import tcg_tb_cache_mib
from devenv import kvm_as_tcg

pytestmark = pytest.mark.unit

DOMAIN = ["-name", "guest=capi-x,debug-threads=on", "-machine", "pc-q35-7.2,usb=off", "-accel", "kvm", "-cpu",
          "qemu64"]


def run_wrapper(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    real = tmp_path / "qemu"
    real.write_text('#!/bin/sh\nfor arg in "$@"; do printf "%s\\n" "$arg"; done\n')
    real.chmod(0o755)
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(kvm_as_tcg.wrapper_text(real))
    wrapper.chmod(0o755)
    return subprocess.run([str(wrapper), *args], capture_output=True, text=True, check=True)


@pytest.mark.parametrize("memory_mib, written", [(256, "256"), (1024, "size=1048576k"), (2048, "2048"),
                                                 (1280, "size=1310720k"), (8192, "8G"), (128, "128M")])
def test_a_domains_kvm_accelerator_becomes_tcg_with_the_providers_cache(tmp_path, memory_mib, written):
    result = run_wrapper(tmp_path, *DOMAIN, "-m", written, "-display", "a b")
    expected = [*DOMAIN, "-m", written, "-display", "a b"]
    expected[expected.index("kvm")] = f"tcg,tb-size={tcg_tb_cache_mib(memory_mib)}"
    assert result.stdout.splitlines() == expected
    assert "-accel kvm run as -accel tcg" in result.stderr


def test_a_capability_probe_runs_unchanged(tmp_path):
    probe = ["-S", "-no-user-config", "-nodefaults", "-machine", "none", "-accel", "kvm", "-accel", "tcg"]
    result = run_wrapper(tmp_path, *probe)
    assert result.stdout.splitlines() == probe and result.stderr == ""
