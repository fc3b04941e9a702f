"""Where `make test`'s time goes: a pytest plugin that times every test module, counts the guests it booted and the CPU
its processes used, and the report that puts it beside the set-up steps (out/timing/setup.tsv, written by
hack/timed.sh and the build scripts: each step's wall and CPU seconds).

Guests and CPU are measured from the outside, never by the tests themselves: a thread samples /proc once a second.
A process belongs to this pytest process when its environment names the same xdist worker (or, without xdist, a
test of this process), or when it runs in the network namespace of a libvirtd that belongs to it: libvirt daemonizes
QEMU and clears its environment, but each test host's libvirtd has a namespace of its own. The environment, command
line and namespace of a process are read once (again only when it execs another program); its stat every second.

Each QEMU of ours is a guest, classed by its base image: `node` (the Kubernetes node image), `minimal` (the minimal
image), `ipxe` (the near-free iPXE guest) or `other` (mostly the integration tier's domains on empty disks, which boot
nothing). It is counted in the module running when it appeared, and so are its guest-seconds.
The peak of Linux guests (node and minimal) running at once on the machine is kept too: the budget of 2 cores.

CPU seconds (user + system) are charged to the module running when they were spent, by kind of program (cpu_kind):
the growth of each process's utime + stime between two samples, from /proc/<pid>/stat, and this pytest process's own
from getrusage (the operator most tests run in their event loop, and this sampler, included). A process is charged
from its start at the first sample that sees it, so what it spends after the last sample before it ends is lost, and
a process that lives less than a sample (a kubectl, a qemu-img) is not counted at all; nor is a container's process
(the operator image's, a pod of podman's), whose environment is its image's and whose namespace is not a libvirtd's.

What a guest's boot spent, seen from inside, comes from the tests that boot each image anyway: they read
guest_agent.boot_profile from one booted guest and hand it to record_boot_profile (out/timing/boot-<image>.txt).

Progress a person can follow while tests run on xdist workers (whose own output pytest shows only at the end): each
worker appends lines to out/timing/progress.log (a long module starting and ending; waiting.wait_until every
PROGRESS_EVERY_S while it waits), and xdist's controller, at the terminal, prints them as they come (a run without
xdist only keeps them there).

Each pytest process (each xdist worker) writes out/timing/tests-<worker>.json; the process that ends the session
merges them with setup.tsv into out/timing/report.md and prints its summary last. A run with
CAPI_LIBVIRT_TIMING_APPEND=1 (`make test`'s second run, the whole cluster alone after the rest) keeps the earlier
run's files and adds its own, so its report covers both. docs/book/src/development/numbers.md says how to read it.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import pytest

from devenv import base_image, guest_image, paths

REPO = pathlib.Path(__file__).resolve().parent.parent
TIMING_DIR = pathlib.Path(os.environ.get("CAPI_LIBVIRT_TIMING_DIR", REPO / "out" / "timing"))
SAMPLE_S = 1.0
PROGRESS_EVERY_S = 30.0
PROGRESS_LOG = TIMING_DIR / "progress.log"
LONG_MODULE_S = 20.0  # a module that took longer says when it ended
LINUX_KINDS = ("node", "minimal")
APPEND = os.environ.get("CAPI_LIBVIRT_TIMING_APPEND") == "1"  # add to the earlier run's files instead of starting anew
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")  # the unit of /proc/<pid>/stat's times


def record_boot_profile(image: str, text: str) -> None:
    """Keep a guest's boot profile (guest_agent.boot_profile) of `image` (node, minimal) for the report."""
    TIMING_DIR.mkdir(parents=True, exist_ok=True)
    (TIMING_DIR / f"boot-{image}.txt").write_text(text)


_current_module: str | None = None


def progress(message: str) -> None:
    """One progress line (`[tests gw0 12:34:56] module: message`), printed at the terminal as it is written."""
    module = pathlib.PurePath(_current_module).stem if _current_module else "-"
    line = f"[tests {worker_id()} {time.strftime('%H:%M:%S')}] {module}: {message}\n"
    TIMING_DIR.mkdir(parents=True, exist_ok=True)
    with open(PROGRESS_LOG, "a") as log:  # one write per line: lines of two workers never mix
        log.write(line)


def follow_progress(write_line: Callable[[str], None], stop: threading.Event, offset: int = 0) -> None:
    """Print progress.log's lines from byte `offset` as the workers append them, until `stop` (then whatever is
    left)."""
    while True:
        stopping = stop.wait(1.0)
        try:
            with open(PROGRESS_LOG) as log:
                log.seek(offset)
                chunk = log.read()
        except OSError:
            chunk = ""
        complete = chunk[: chunk.rfind("\n") + 1]
        offset += len(complete.encode())
        for line in complete.splitlines():
            write_line(line)
        if stopping:
            return


def worker_id() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@dataclass
class ModuleTiming:
    module: str
    worker: str
    started: float = 0.0  # wall clock, first setup
    ended: float = 0.0  # wall clock, last teardown
    tests: int = 0
    failed: int = 0
    test_seconds: float = 0.0  # setup + call + teardown of its tests
    guests: dict[str, int] = field(default_factory=dict)  # kind -> QEMU processes started
    guest_seconds: dict[str, float] = field(default_factory=dict)  # kind -> their lifetime, sampled
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # CPU kind -> CPU seconds spent while it ran
    peak_linux_guests: int = 0  # on the whole machine, while it ran


NODE_BASE = base_image.BASE_PREFIX + guest_image.folder_name("", guest_image.NODE)  # base-node-<recipe>.qcow2


def guest_kind(cmdline: str) -> str:
    """A QEMU's guest kind, from the base image its command line names (its disk's backing file, or the minimal
    image's kernel)."""
    if "ipxe" in cmdline:
        return "ipxe"
    if NODE_BASE in cmdline:
        return "node"
    if base_image.BASE_PREFIX in cmdline or "vmlinuz" in cmdline:
        return "minimal"
    return "other"


def cpu_kind(argv: list[str]) -> str:
    """The kind of program a process of ours runs, from its command line, for its CPU seconds: `qemu` (the guests),
    `operator` (ours as a process of its own), `kube-apiserver` and `etcd` (the test bed's), `libvirt` (the test hosts'
    libvirtd and virtlogd), `capi` (the other programs of the cache's bin: the Cluster API managers,
    cluster-autoscaler, cert-manager, the Cluster API Operator, clusterctl) or `other`. This pytest process itself is
    `pytest`."""
    program = os.path.basename(argv[0])
    if program.startswith("qemu-system"):
        return "qemu"
    if program.startswith("python") and any(arg == "capi_libvirt" or os.path.basename(arg) in ("capi-libvirt", "kopf")
                                            for arg in argv[1:3]):
        return "operator"  # python -m capi_libvirt, or its console script, or kopf's
    if program.startswith("kube-apiserver"):
        return "kube-apiserver"
    if program == "etcd" or program.startswith("etcd-"):
        return "etcd"
    if program in ("libvirtd", "virtlogd"):
        return "libvirt"
    if argv[0].startswith(f"{paths.bin_dir()}/"):
        return "capi"
    return "other"


@dataclass(frozen=True)
class ProcessStat:
    """What the sampler reads of a process every second: /proc/<pid>/stat."""

    program: str  # its comm: the program it runs, as the kernel names it (an exec changes it)
    started: int  # clock ticks after boot
    cpu_ticks: int  # utime + stime so far


def process_stat(pid: int) -> ProcessStat:
    raw = pathlib.Path(f"/proc/{pid}/stat").read_bytes()
    before, _, after = raw.rpartition(b")")  # the comm may hold spaces and parentheses
    fields = after.split()  # fields[0] is the stat's third field, the state
    return ProcessStat(program=before.partition(b"(")[2].decode(errors="replace"), started=int(fields[19]),
                       cpu_ticks=int(fields[11]) + int(fields[12]))


def started_by(pid: int) -> str | None:
    """The pytest process (its xdist worker, or "main") whose environment the process `pid` inherited, if any."""
    try:
        environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"PYTEST_XDIST_WORKER="):
            return item.split(b"=", 1)[1].decode()
    return "main" if any(item.startswith(b"PYTEST_CURRENT_TEST=") for item in environ) else None


@dataclass
class SeenProcess:
    """One program run by one process, as first seen: what it is and whose; then its CPU at the last sample."""

    stat: ProcessStat
    kind: str  # cpu_kind's
    guest: str | None  # a QEMU's guest kind (guest_kind)
    libvirtd: bool
    netns: int  # its network namespace's inode (0: not readable)
    started_by: str | None
    ours: bool = False
    counted_in: str | None = None  # a guest of ours: the module it was counted in
    cpu_ticks: int = 0  # utime + stime at the last sample


def look_at(pid: int, stat: ProcessStat) -> SeenProcess:
    """What process `pid` runs and who started it (OSError: it has ended)."""
    argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode(errors="replace").split("\0")
    try:
        netns = os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        netns = 0
    kind = cpu_kind(argv)
    return SeenProcess(stat=stat, kind=kind, guest=guest_kind(" ".join(argv)) if kind == "qemu" else None,
                       libvirtd=os.path.basename(argv[0]) == "libvirtd", netns=netns, started_by=started_by(pid))


def belongs(process: SeenProcess, worker: str, libvirtd_netns: set[int]) -> bool:
    """Whether `process` belongs to the pytest process `worker`, whose libvirtds run in the namespaces
    `libvirtd_netns`."""
    return process.started_by == worker or (process.netns != 0 and process.netns in libvirtd_netns)


class ProcessSampler:
    """The once-a-second look at /proc: each new QEMU of ours counted as a guest of the module that runs, the CPU of
    each process of ours charged to it."""

    def __init__(self, timings: dict[str, ModuleTiming]) -> None:
        self.timings = timings
        self.current: str | None = None
        self.seen: dict[int, SeenProcess] = {}  # pid -> what it runs, every process on the machine but this one
        self.own_cpu_s = own_cpu_seconds()
        self.peak_linux = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="timing-report-processes", daemon=True)
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            try:
                self.sample()
            except Exception:  # never let the report break a test run
                pass

    def sample(self) -> None:
        stats = current_stats()
        new = self.look_at_new(stats)
        if new:
            me = worker_id()
            libvirtd_netns = {p.netns for p in self.seen.values() if p.libvirtd and p.started_by == me}
            for pid in new:
                self.seen[pid].ours = belongs(self.seen[pid], me, libvirtd_netns)
        own_cpu_s, self.own_cpu_s = self.own_cpu_s, own_cpu_seconds()
        linux_now = sum(1 for p in self.seen.values() if p.guest in LINUX_KINDS)
        with self.lock:
            self.peak_linux = max(self.peak_linux, linux_now)
            module = self.current
            if module is not None:
                timing = self.timings[module]
                timing.peak_linux_guests = max(timing.peak_linux_guests, linux_now)
                add_cpu(timing.cpu_seconds, "pytest", self.own_cpu_s - own_cpu_s)
            for pid, process in self.seen.items():
                if process.ours:
                    self.charge(process, stats[pid], module, is_new=pid in new)

    def look_at_new(self, stats: dict[int, ProcessStat]) -> set[int]:
        """Forget the processes that ended; look at those that started or exec'd another program since the last
        sample, and return their pids."""
        for pid in self.seen.keys() - stats.keys():
            del self.seen[pid]
        new = set()
        for pid, stat in stats.items():
            known = self.seen.get(pid)
            if known is not None and known.stat.started == stat.started and known.stat.program == stat.program:
                continue
            try:
                process = look_at(pid, stat)
            except OSError:
                continue
            if known is not None and known.stat.started == stat.started:
                process.cpu_ticks = known.cpu_ticks  # the same process exec'd: what it spent before was charged
            self.seen[pid] = process
            new.add(pid)
        return new

    def charge(self, process: SeenProcess, stat: ProcessStat, module: str | None, is_new: bool) -> None:
        """Charge a process of ours to `module` (its CPU since the last sample; a new guest, counted); under the
        lock."""
        cpu_ticks, process.cpu_ticks = process.cpu_ticks, stat.cpu_ticks
        if module is not None:
            add_cpu(self.timings[module].cpu_seconds, process.kind, (stat.cpu_ticks - cpu_ticks) / CLOCK_TICKS_PER_S)
            if is_new and process.guest is not None:
                process.counted_in = module
                guests = self.timings[module].guests
                guests[process.guest] = guests.get(process.guest, 0) + 1
        if process.counted_in is not None and process.guest is not None:
            seconds = self.timings[process.counted_in].guest_seconds
            seconds[process.guest] = round(seconds.get(process.guest, 0.0) + SAMPLE_S, 1)


def current_stats() -> dict[int, ProcessStat]:
    """pid -> stat of every process on the machine but this one."""
    stats = {}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != me:
            try:
                stats[int(entry.name)] = process_stat(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue  # ended since the scan
    return stats


def own_cpu_seconds() -> float:
    """This pytest process's CPU seconds so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def add_cpu(cpu_seconds: dict[str, float], kind: str, seconds: float) -> None:
    cpu_seconds[kind] = round(cpu_seconds.get(kind, 0.0) + seconds, 3)


class TimingReport:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.timings: dict[str, ModuleTiming] = {}
        self.sampler = ProcessSampler(self.timings)
        self.session_started = time.time()
        # The xdist controller runs no test: it only merges what its workers wrote (known at session start, once
        # xdist has registered its distributing session, "dsession").
        self.controller = False
        self.commit = "unknown"
        self.follower: threading.Thread | None = None
        self.follower_stop = threading.Event()

    def module(self, nodeid: str) -> ModuleTiming:
        name = nodeid.split("::", 1)[0]
        with self.sampler.lock:
            if name not in self.timings:
                self.timings[name] = ModuleTiming(name, worker_id(), started=time.time())
            return self.timings[name]

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session_started = time.time()
        self.commit = current_commit()  # what the run tests (a commit made while it runs is not)
        self.controller = self.config.pluginmanager.hasplugin("dsession")
        if not hasattr(self.config, "workerinput"):  # the process that ends the session: a fresh set of files
            TIMING_DIR.mkdir(parents=True, exist_ok=True)
            if not APPEND:
                for old in [*TIMING_DIR.glob("tests-*.json"), *TIMING_DIR.glob("boot-*.txt"), PROGRESS_LOG]:
                    old.unlink(missing_ok=True)
            PROGRESS_LOG.touch()
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            # xdist's controller prints them, and so does a run without xdist that captures nothing (`-s`); else they
            # are only kept in the file (pytest captures what a test's process writes while the test runs).
            printed = self.controller or self.config.getoption("capture") == "no"
            if printed and reporter is not None:
                self.follower = threading.Thread(target=follow_progress, name="timing-report-progress",
                                                 args=(lambda line: reporter.write_line(line), self.follower_stop,
                                                       PROGRESS_LOG.stat().st_size),
                                                 daemon=True)
                self.follower.start()
        if not self.controller:
            self.sampler.thread.start()

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        if self.controller:
            return  # on the xdist controller: the workers keep their own figures
        global _current_module
        timing = self.module(nodeid)
        with self.sampler.lock:
            previous, self.sampler.current = self.sampler.current, timing.module
        if previous != timing.module:
            self.module_ended(previous)
            _current_module = timing.module
            if timing.module.startswith("tests/e2e/"):
                progress("started")

    def module_ended(self, name: str | None) -> None:
        timing = self.timings.get(name) if name else None
        if timing is not None and timing.ended - timing.started >= LONG_MODULE_S:
            progress(f"done in {timing.ended - timing.started:.0f} s ({timing.tests} tests, {timing.failed} failed)")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.controller:
            return
        timing = self.module(report.nodeid)
        timing.test_seconds += report.duration
        timing.ended = time.time()
        if report.when == "call":
            timing.tests += 1
        if report.failed:
            timing.failed += 1

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.controller:
            self.module_ended(self.sampler.current)
        self.follower_stop.set()
        if self.follower is not None:
            self.follower.join(timeout=5)
        self.sampler.stop.set()
        if self.sampler.thread.ident is not None:
            self.sampler.thread.join(timeout=5)
        if self.controller or (not self.timings and hasattr(self.config, "workerinput")):
            return  # the controller ran no test; an idle worker has nothing to say
        TIMING_DIR.mkdir(parents=True, exist_ok=True)
        data = {"worker": worker_id(), "started": self.session_started, "ended": time.time(),
                "peak_linux_guests": self.sampler.peak_linux,
                "modules": [asdict(t) for t in self.timings.values() if t.tests or t.test_seconds]}
        (TIMING_DIR / f"tests-{worker_id()}.json").write_text(json.dumps(data, indent=1))

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if hasattr(self.config, "workerinput"):
            return
        report = write_report(ended=time.time(), commit=self.commit)
        terminalreporter.section("where the time went (out/timing/report.md)")
        for line in report.summary:
            terminalreporter.write_line(line)


@dataclass
class Report:
    summary: list[str]
    markdown: str


class SetupStep(NamedTuple):
    """A line of setup.tsv: a step of hack/timed.sh, or an upstream build inside one (`upstream/<name>`)."""

    name: str
    seconds: float
    result: str  # ok, failed; built for an upstream build
    cpu_seconds: float | None  # None in a file written before the steps recorded it


def read_setup() -> list[SetupStep]:
    """This run's set-up steps, in the order they ended."""
    path = TIMING_DIR / "setup.tsv"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            cpu_seconds = float(parts[3]) if len(parts) >= 4 else None
            steps.append(SetupStep(parts[0], float(parts[1]), parts[2], cpu_seconds))
    return steps


def cpu_text(cpu_seconds: float | None) -> str:
    return "-" if cpu_seconds is None else f"{cpu_seconds:.0f}"


def module_cpu_s(module: dict[str, Any]) -> float:
    """A module's CPU seconds, all kinds (none in a file written before modules recorded them)."""
    return sum(module.get("cpu_seconds", {}).values())


def cpu_by_kind_text(cpu_seconds: dict[str, float]) -> str:
    """CPU seconds by kind, most first, those under half a second left out: `qemu 812, pytest 40`."""
    shown = sorted(((s, kind) for kind, s in cpu_seconds.items() if s >= 0.5), reverse=True)
    return ", ".join(f"{kind} {s:.0f}" for s, kind in shown) or "-"


def setup_wall_s(tests_started: float) -> str:
    """From `make test`'s start (hack/timed.sh --reset notes it; the Makefile hands it over as
    CAPI_LIBVIRT_SETUP_STARTED) to the first test, or "?" when pytest ran without make."""
    try:
        started = float(os.environ["CAPI_LIBVIRT_SETUP_STARTED"])
    except (KeyError, ValueError):
        return "?"
    return f"{tests_started - started:.0f} s"


def current_commit() -> str:
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return git.stdout.strip() or "unknown"


def write_report(ended: float, commit: str) -> Report:
    """The report of every pytest process's file in TIMING_DIR, the tests' wall time from the first one's start to
    `ended`."""
    workers = [json.loads(p.read_text()) for p in sorted(TIMING_DIR.glob("tests-*.json"))]
    wall_s = ended - min((w["started"] for w in workers), default=ended)
    modules = sorted((m for w in workers for m in w["modules"]), key=lambda m: -(m["ended"] - m["started"]))
    setup = read_setup()
    steps = [step for step in setup if "/" not in step.name]  # without the upstream builds inside them
    setup_s = sum(step.seconds for step in steps)
    setup_cpu = [step.cpu_seconds for step in steps if step.cpu_seconds is not None]
    setup_cpu_text = f"{sum(setup_cpu):.0f} CPU s" if setup_cpu else "CPU not recorded"
    setup_wall = setup_wall_s(min((w["started"] for w in workers), default=time.time()))
    boot_lines: list[str] = []
    guests: dict[str, int] = {}
    tests_cpu: dict[str, float] = {}
    for m in modules:
        for kind, n in m["guests"].items():
            guests[kind] = guests.get(kind, 0) + n
        for kind, cpu_s in m.get("cpu_seconds", {}).items():
            tests_cpu[kind] = tests_cpu.get(kind, 0.0) + cpu_s
    cores = os.cpu_count() or 1
    peak = max((w["peak_linux_guests"] for w in workers), default=0)

    def guests_text(m: dict[str, object]) -> str:
        counts = m["guests"]
        assert isinstance(counts, dict)
        return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "-"

    lines = [f"# make test: where the time went (commit {commit})", "",
             f"Set-up: {setup_wall} wall ({setup_s:.0f} s of steps, side by side; {setup_cpu_text}); "
             f"tests: {wall_s:.0f} s wall on {len(workers)} pytest process(es), {sum(tests_cpu.values()):.0f} CPU s "
             f"of the {cores * wall_s:.0f} its {cores} cores had ({cpu_by_kind_text(tests_cpu)}); "
             f"guests booted: {', '.join(f'{n} {k}' for k, n in sorted(guests.items())) or 'none'}; "
             f"at most {peak} Linux guests ran at once.", "",
             "## Set-up (make test's prerequisites; a step that found all of it in the cache takes a second or two)", "",
             "| step | seconds | CPU s | result |", "|---|---|---|---|"]
    lines += [f"| {step.name} | {step.seconds:.0f} | {cpu_text(step.cpu_seconds)} | {step.result} |" for step in setup]
    lines += ["", "## Test modules, longest first (wall time from the first setup to the last teardown; CPU seconds "
              "of its worker's processes while it ran)", "",
              "| module | worker | wall s | CPU s | CPU s by kind | tests | failed | guests booted | guest-seconds "
              "| peak Linux guests |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for m in modules:
        guest_s = ", ".join(f"{kind} {s:.0f}" for kind, s in sorted(m["guest_seconds"].items())) or "-"
        lines.append(f"| {m['module']} | {m['worker']} | {m['ended'] - m['started']:.0f} | {module_cpu_s(m):.0f} | "
                     f"{cpu_by_kind_text(m.get('cpu_seconds', {}))} | {m['tests']} | {m['failed']} | "
                     f"{guests_text(m)} | {guest_s} | {m['peak_linux_guests']} |")
    for profile in sorted(TIMING_DIR.glob("boot-*.txt")):
        image = profile.stem.removeprefix("boot-")
        text = profile.read_text()
        lines += ["", f"## A {image} guest's boot, from inside (systemd-analyze)", "", "```", text.rstrip(), "```"]
        startup = next((line for line in text.splitlines() if line.startswith("Startup finished")), None)
        boot_lines.append(f"  {image} guest: {startup or 'boot not finished when asked'}")
    markdown = "\n".join(lines) + "\n"
    TIMING_DIR.mkdir(parents=True, exist_ok=True)
    (TIMING_DIR / "report.md").write_text(markdown)
    summary = [lines[2]]
    summary += [f"  set-up {step.name}: {step.seconds:.0f} s, {cpu_text(step.cpu_seconds)} CPU s ({step.result})"
                for step in setup if step.seconds >= 5]
    summary += [f"  {m['ended'] - m['started']:6.0f} s {module_cpu_s(m):6.0f} CPU s  {m['module']} [{m['worker']}] "
                f"({guests_text(m)})" for m in modules[:15]]
    summary += boot_lines
    return Report(summary, markdown)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimingReport(config), "capi-libvirt-timing-report")
