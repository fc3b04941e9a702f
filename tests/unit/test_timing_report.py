"""The CPU seconds of `make test`'s timing report (tests/timing_report.py): setup.tsv's CPU column read beside the
wall seconds (and files without it still read), the modules' CPU by kind in the report, the kinds of program the
sampler tells apart, whose processes it counts, and its reading of /proc on this very process."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import time

import pytest

import timing_report
from devenv import paths

pytestmark = pytest.mark.unit


def burn_cpu(seconds: float) -> None:
    """Keep this thread busy for `seconds` of its own CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_setup_steps_are_read_with_their_cpu_and_without_it_from_older_files(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing_report, "TIMING_DIR", tmp_path)
    (tmp_path / "setup.tsv").write_text("upstream/kubernetes\t412\tbuilt\t790.4\n"
                                        "upstream-kubernetes\t430.2\tok\t801.9\n"
                                        "venv\t76.0\tok\t60.4\n"
                                        "minimal-image\t207.0\tfailed\n")  # written before the CPU column
    assert timing_report.read_setup() == [
        timing_report.SetupStep("upstream/kubernetes", 412.0, "built", 790.4),
        timing_report.SetupStep("upstream-kubernetes", 430.2, "ok", 801.9),
        timing_report.SetupStep("venv", 76.0, "ok", 60.4),
        timing_report.SetupStep("minimal-image", 207.0, "failed", None)]
    report = timing_report.write_report(ended=time.time(), commit="abc1234")
    assert "(713 s of steps, side by side; 862 CPU s)" in report.summary[0]  # the builds inside a step not twice
    assert "| upstream-kubernetes | 430 | 802 | ok |" in report.markdown
    assert "| minimal-image | 207 | - | failed |" in report.markdown
    assert "  set-up venv: 76 s, 60 CPU s (ok)" in report.summary


def test_modules_cpu_by_kind_and_in_all(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing_report, "TIMING_DIR", tmp_path)
    guests = timing_report.ModuleTiming("tests/e2e/test_guest_boot.py", "gw0", started=1000.0, ended=1100.0,
                                        tests=2, cpu_seconds={"qemu": 150.2, "pytest": 9.6, "libvirt": 0.2})
    older = {"module": "tests/unit/test_ipam.py", "worker": "gw1", "started": 1000.0, "ended": 1010.0, "tests": 9,
             "failed": 0, "test_seconds": 10.0, "guests": {}, "guest_seconds": {}, "peak_linux_guests": 0}
    for worker, module in (("gw0", dataclasses.asdict(guests)), ("gw1", older)):
        (tmp_path / f"tests-{worker}.json").write_text(json.dumps(
            {"worker": worker, "started": 1000.0, "ended": 1100.0, "peak_linux_guests": 0, "modules": [module]}))
    report = timing_report.write_report(ended=1100.0, commit="abc1234")
    cores = os.cpu_count()
    assert f"160 CPU s of the {cores * 100} its {cores} cores had (qemu 150, pytest 10)" in report.summary[0]
    assert "| tests/e2e/test_guest_boot.py | gw0 | 100 | 160 | qemu 150, pytest 10 | 2 |" in report.markdown
    assert "| tests/unit/test_ipam.py | gw1 | 10 | 0 | - | 9 |" in report.markdown  # a file without CPU
    assert "     100 s    160 CPU s  tests/e2e/test_guest_boot.py [gw0] (-)" in report.summary


def test_the_kind_of_each_program_as_the_test_bed_starts_it() -> None:
    def kind(*argv: object) -> str:
        return timing_report.cpu_kind([str(arg) for arg in argv])

    assert kind("/usr/bin/qemu-system-x86_64", "-name", "guest=m1") == "qemu"
    assert kind(paths.kube_apiserver_binary(), "--etcd-servers=http://127.0.0.1:2379") == "kube-apiserver"
    assert kind(paths.etcd_binary(), "--data-dir", "/tmp/etcd") == "etcd"
    assert kind(sys.executable, "-m", "capi_libvirt", "run", "--standalone") == "operator"  # devenv/operator_process.py
    assert kind("/usr/bin/python3", "/work/.venv/bin/capi-libvirt", "run") == "operator"  # its console script
    assert kind("/usr/sbin/libvirtd", "--daemon") == "libvirt"
    assert kind("/usr/sbin/virtlogd", "--daemon") == "libvirt"
    for program in (paths.cluster_api_manager_binary(), paths.cluster_autoscaler_binary(),
                    paths.cert_manager_binary("webhook"), paths.cluster_api_operator_binary()):
        assert kind(program, "--leader-elect=false") == "capi"
    assert kind("/usr/sbin/dnsmasq", "--conf-file=x") == "other"
    assert kind(sys.executable, "-m", "pytest") == "other"
    assert kind("") == "other"  # a kernel thread: no command line


def test_ours_by_environment_or_by_our_libvirtd_namespace() -> None:
    def process(started_by: str | None, netns: int) -> timing_report.SeenProcess:
        stat = timing_report.ProcessStat(program="qemu-system-x86", started=1, cpu_ticks=0)
        return timing_report.SeenProcess(stat=stat, kind="qemu", guest="node", libvirtd=False, netns=netns,
                                         started_by=started_by)

    ours_netns = {4026532001}
    assert timing_report.belongs(process("gw0", 4026531840), "gw0", ours_netns)  # its environment names us
    assert timing_report.belongs(process(None, 4026532001), "gw0", ours_netns)  # a QEMU of our libvirtd
    assert not timing_report.belongs(process(None, 4026532002), "gw0", ours_netns)  # another worker's libvirtd's
    assert not timing_report.belongs(process("gw1", 4026531840), "gw0", ours_netns)
    assert not timing_report.belongs(process(None, 0), "gw0", {0})  # a namespace not readable is nobody's


def test_this_process_stat_as_proc_gives_it() -> None:
    before = timing_report.process_stat(os.getpid())
    burn_cpu(0.3)
    after = timing_report.process_stat(os.getpid())
    assert before.program == after.program == pathlib.Path("/proc/self/comm").read_text().strip()
    assert before.started == after.started
    assert 0.25 <= (after.cpu_ticks - before.cpu_ticks) / timing_report.CLOCK_TICKS_PER_S < 5
    seen = timing_report.look_at(os.getpid(), after)
    assert seen.kind == "other" and seen.guest is None and not seen.libvirtd
    assert seen.netns == os.stat("/proc/self/ns/net").st_ino


def test_the_sampler_charges_this_process_cpu_to_the_module_running() -> None:
    module = "tests/unit/test_timing_report.py"
    timings = {module: timing_report.ModuleTiming(module, timing_report.worker_id())}
    sampler = timing_report.ProcessSampler(timings)
    sampler.sample()  # before any module: nothing charged
    assert timings[module].cpu_seconds == {}
    sampler.current = module
    sampler.sample()
    charged = timings[module].cpu_seconds.get("pytest", 0.0)
    burn_cpu(0.3)
    sampler.sample()
    assert 0.25 <= timings[module].cpu_seconds["pytest"] - charged < 5
    assert os.getpid() not in sampler.seen  # charged by getrusage, not as a process of its own
    assert os.getppid() in sampler.seen


def test_a_process_that_execs_another_program_is_looked_at_again_its_charged_cpu_kept() -> None:
    sampler = timing_report.ProcessSampler({})
    pid, stat = os.getpid(), timing_report.process_stat(os.getpid())
    assert sampler.look_at_new({pid: stat}) == {pid}
    sampler.seen[pid].cpu_ticks = stat.cpu_ticks
    assert sampler.look_at_new({pid: stat}) == set()  # the same program: not read again
    execed = timing_report.ProcessStat(program="another", started=stat.started, cpu_ticks=stat.cpu_ticks + 1)
    assert sampler.look_at_new({pid: execed}) == {pid}
    assert sampler.seen[pid].cpu_ticks == stat.cpu_ticks
    assert sampler.look_at_new({}) == set() and sampler.seen == {}  # ended: forgotten


def test_a_guest_is_counted_in_the_module_it_appeared_in_its_cpu_where_it_was_spent() -> None:
    first, second = "tests/e2e/test_a.py", "tests/e2e/test_b.py"
    timings = {name: timing_report.ModuleTiming(name, "gw0") for name in (first, second)}
    sampler = timing_report.ProcessSampler(timings)
    guest = timing_report.SeenProcess(stat=timing_report.ProcessStat("qemu-system-x86", 1, 0), kind="qemu",
                                      guest="node", libvirtd=False, netns=1, started_by=None, ours=True)
    clock_ticks = timing_report.CLOCK_TICKS_PER_S
    sampler.charge(guest, timing_report.ProcessStat("qemu-system-x86", 1, 2 * clock_ticks), first, is_new=True)
    sampler.charge(guest, timing_report.ProcessStat("qemu-system-x86", 1, 5 * clock_ticks), second, is_new=False)
    sampler.charge(guest, timing_report.ProcessStat("qemu-system-x86", 1, 9 * clock_ticks), None, is_new=False)
    assert (timings[first].guests, timings[second].guests) == ({"node": 1}, {})
    assert (timings[first].guest_seconds, timings[second].guest_seconds) == ({"node": 3.0}, {})  # its lifetime
    assert (timings[first].cpu_seconds, timings[second].cpu_seconds) == ({"qemu": 2.0}, {"qemu": 3.0})
    assert guest.cpu_ticks == 9 * clock_ticks  # before any module: not charged, and not later either
