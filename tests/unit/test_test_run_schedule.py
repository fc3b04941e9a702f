"""How `make test` schedules and reports its own run (tests/conftest.py, tests/guest_slots.py, tests/timing_report.py):
the Linux guests' group first and in its order, the one-guest modules last; a module takes all the guest slots it asks
for or none; the whole cluster's run, appended to the first run's files, gives one report covering both."""

from __future__ import annotations

import fcntl
import json
import os
import pathlib

import pytest

import conftest
import guest_slots
import timing_report

pytestmark = pytest.mark.unit


def test_the_group_comes_first_in_its_order_and_one_guest_modules_last() -> None:
    nodeids = ["tests/e2e/test_machine_shape.py::test_a", "tests/integration/test_tenants.py::test_b",
               "tests/e2e/test_clusterctl_move.py::test_c", "tests/unit/test_ipam.py::test_d",
               "tests/e2e/test_remote_hosts.py::test_e", "tests/e2e/test_autoscaler.py::test_f"]
    ordered = sorted(nodeids, key=conftest.first_scopes_first)
    assert [n.split("::")[0].rsplit("/", 1)[1] for n in ordered] == [
        "test_autoscaler.py", "test_remote_hosts.py", "test_clusterctl_move.py",  # the group, in LINUX_GROUP_ORDER
        "test_tenants.py", "test_ipam.py",  # the rest, in the collection's order
        "test_machine_shape.py"]  # a one-guest module, last
    assert {conftest.xdist_scope(n) for n in ordered[:3]} == {conftest.LINUX_GUESTS_GROUP}


def test_a_module_takes_all_its_slots_or_none(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guest_slots, "SLOT_DIR", tmp_path)
    elsewhere = guest_slots._lock("slot-0", fcntl.LOCK_EX)  # another worker's one-guest module
    assert elsewhere is not None
    try:
        assert guest_slots._try_take(2) == []
        free = guest_slots._lock("slot-1", fcntl.LOCK_EX)
        assert free is not None, "a failed take of 2 still held slot-1"
        os.close(free)
    finally:
        os.close(elsewhere)
    both = guest_slots._try_take(2)
    assert len(both) == 2
    guest_slots._release(both)


def test_the_whole_cluster_run_appended_gives_one_report(tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing_report, "TIMING_DIR", tmp_path)
    monkeypatch.setenv("CAPI_LIBVIRT_SETUP_STARTED", "900")

    def module(name: str, worker: str, started: float, ended: float) -> dict:
        return {"module": name, "worker": worker, "started": started, "ended": ended, "tests": 1, "failed": 0,
                "test_seconds": ended - started, "guests": {"node": 1}, "guest_seconds": {"node": 10.0},
                "peak_linux_guests": 1}

    first = {"worker": "gw0", "started": 1000.0, "ended": 2000.0, "peak_linux_guests": 2,
             "modules": [module("tests/e2e/test_autoscaler.py", "gw0", 1000.0, 1400.0)]}
    alone = {"worker": "main", "started": 2010.0, "ended": 2900.0, "peak_linux_guests": 2,
             "modules": [module("tests/e2e/test_whole_cluster.py", "main", 2010.0, 2900.0)]}
    (tmp_path / "tests-gw0.json").write_text(json.dumps(first))
    (tmp_path / "tests-main.json").write_text(json.dumps(alone))
    report = timing_report.write_report(ended=2905.0, commit="abc1234")
    assert "Set-up: 100 s wall" in report.summary[0]
    assert "tests: 1905 s wall on 2 pytest process(es)" in report.summary[0]
    assert report.markdown.index("test_whole_cluster.py") < report.markdown.index("test_autoscaler.py")  # longest
    assert (tmp_path / "report.md").read_text() == report.markdown
