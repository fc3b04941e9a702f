"""`make bench` keeps working: its whole run at N=2, one round, a short idle, on its own test bed (a fresh API
server, a libvirt host over qemu+tls, the iPXE guest), writing its JSON, table and plot. Numbers are not judged
here (speed is measured by the bench, never asserted in tests); that each one was measured, and is sane, is."""

from __future__ import annotations

import json
import pathlib

import pytest

from bench import report, suite, testbed

from fixtures_libvirt import require_libvirt_host_prerequisites
from prereq import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_small_bench_run_measures_everything_and_writes_its_report(tmp_path: pathlib.Path) -> None:
    require_libvirt_host_prerequisites()
    require(testbed.IPXE_ISO.exists(), f"{testbed.IPXE_ISO} (Debian's ipxe package, make system-deps)")
    results = suite.run(suite.Settings(sizes=(2,), rounds=1, idle_s=3.0, out=tmp_path, name="smoke",
                                         smoke=True))

    for label in ("ours", "floor", "floor_serial"):
        (round_,) = results[label]["2"]
        assert round_["provisioned_s"] is not None, (label, round_)  # its unprovisioned_why says which and why
        assert 0 < round_["running_s"] <= round_["provisioned_s"], (label, round_)
        assert round_["delete_s"] > 0
    ours = results["ours"]["2"][0]
    assert ours["cpu_s"] > 0 and ours["rss_mb"] > 20 and ours["libvirt_operations"] >= 2 * 5
    # The operator's own API traffic was seen (placement and status writes, the bootstrap Secret read), and the
    # bench's own creates and deletes were taken out of it.
    assert ours["api"].get("PATCH libvirtmachines/status", 0) >= 2 and ours["api"].get("GET secrets", 0) >= 2
    assert "POST libvirtmachines" not in ours["api"] and "DELETE libvirtmachines" not in ours["api"]
    assert results["idle_empty"]["seconds"] == 3.0
    assert set(results["summary"]["targets"]) == set(report.TARGETS)

    written = json.loads((tmp_path / "smoke.json").read_text())
    assert written["summary"] == results["summary"]
    table = (tmp_path / "smoke.md").read_text()
    assert "| 2 |" in table and "Targets" in table
    assert (tmp_path / "smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
