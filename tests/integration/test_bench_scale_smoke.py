"""`make bench-scale` keeps working: one small round (N = 12 machines over H = 3 in-memory hosts) of the real operator
process against a fresh kube-apiserver, restarted once over the machines, writing its results. Numbers are not judged here (speed is measured by the
bench, never asserted in tests); that each one was measured and is sane, and that placement spread the machines, is."""

from __future__ import annotations

import json
import pathlib

import pytest

from bench import scale

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_small_scale_round_provisions_and_deletes_every_machine_and_measures_its_cost(tmp_path: pathlib.Path):
    results = scale.run(scale.Settings(machines=(12,), hosts=(3,), latency_s=0.002, idle_s=2.0, out=tmp_path,
                                       name="smoke"))
    (run,) = results["runs"]
    assert (run["machines"], run["hosts"]) == (12, 3)
    assert 0 < run["latency_p50_s"] <= run["latency_p99_s"] <= run["provisioned_s"], run
    assert run["deleted_s"] > 0 and run["rss_mb"] > 20 and run["cpu_s_per_machine"] > 0, run
    # Each machine's lifecycle cost the operator API writes (placement, status) and host operations (the probe aside).
    assert run["api_per_machine"]["writes"] >= 2 and run["host_operations_per_machine"] >= 5, run
    # and watch events: at least its LibvirtMachine's and its Machine's creation and deletion.
    assert run["watch_events_per_machine"] >= 4 and run["restart"]["watch_events"] >= 12, run
    assert sorted(run["machines_per_host"]) == ["mem0", "mem1", "mem2"], run  # placement spread them
    assert len(run["queue_depth_each_second"]) >= 2 and run["max_queue_depth"] >= 0, run  # sampled through the round
    assert sum(run["machines_per_host"].values()) == 12
    assert run["idle"]["seconds"] == 2.0 and run["idle"]["cpu_percent_of_core"] >= 0, run
    # A restart found the hosts as they were: every machine passed over (its LIST of each kind counted), nothing
    # written. The API server's own identity Lease, renewed every 10 s, may fall in the window (the operator runs
    # --standalone here: no Lease of its own).
    restart = run["restart"]
    assert 0 < restart["hosts_answer_s"] <= restart["all_confirmed_s"] and restart["cpu_s"] > 0, restart
    assert restart["api_by_request"].get("LIST libvirtmachines", 0) >= 1, restart["api_by_request"]
    written = {request: count for request, count in restart["api_by_request"].items()
               if request.split()[0] in ("POST", "PUT", "PATCH", "DELETE") and request != "PUT leases"}
    assert written == {}, restart["api_by_request"]
    assert json.loads((tmp_path / "smoke.json").read_text())["runs"] == results["runs"]
    assert "| 3 | 12 |" in (tmp_path / "smoke.md").read_text()


def test_a_small_chaos_at_scale_run_converges_and_its_checks_hold(tmp_path: pathlib.Path):
    """`python -m bench.scale_chaos` keeps working: 20 machines over 3 journaled in-memory hosts, the operator SIGKILLed
    5 times and kube-apiserver twice; its checks (one domain per live machine, nothing leaked or defined twice, no
    finalizer stuck, every host empty at the end) found nothing."""
    from bench import scale_chaos

    result = scale_chaos.run(machines=20, hosts=3, kills=5, seed=7, latency_s=0.002, out=tmp_path, name="chaos")
    assert scale_chaos.failures(result) == [], result
    assert (result["operator_kills"], result["apiserver_restarts"]) == (5, 2), result
    assert result["live_after_storm"] == 20 - result["deleted_mid_create"] - result["deleted_later"] > 0, result
    assert result["domains_created"] >= result["live_after_storm"], result  # every live machine's domain was made
    assert "| 7 | 3 | 20 | 5 | 2 |" in (tmp_path / "chaos.md").read_text()
