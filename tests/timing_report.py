"""Where `make test`'s time goes: a pytest plugin that times every test module and counts the guests it booted, and the
report that puts it beside the set-up steps (out/timing/setup.tsv, written by hack/timed.sh and the build scripts).

Guests are counted from the outside, never by the tests themselves: a thread samples /proc once a second for QEMU
processes, and a QEMU belongs to this pytest process when its parent libvirtd was started by it (its environment names
the same xdist worker, or none). Each is classed by its base image: `node` (the Kubernetes node image), `minimal` (the
minimal image), `ipxe` (the near-free iPXE guest) or `other` (mostly the integration tier's domains on empty disks,
which boot nothing). It is charged to the module running when it appeared.
The peak of Linux guests (node and minimal) running at once on the machine is kept too: the budget of 2 cores.

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
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import pytest

from devenv import base_image, guest_image

REPO = pathlib.Path(__file__).resolve().parent.parent
TIMING_DIR = pathlib.Path(os.environ.get("CAPI_LIBVIRT_TIMING_DIR", REPO / "out" / "timing"))
SAMPLE_S = 1.0
PROGRESS_EVERY_S = 30.0
PROGRESS_LOG = TIMING_DIR / "progress.log"
LONG_MODULE_S = 20.0  # a module that took longer says when it ended
LINUX_KINDS = ("node", "minimal")
APPEND = os.environ.get("CAPI_LIBVIRT_TIMING_APPEND") == "1"  # add to the earlier run's files instead of starting anew


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


def processes(program: bytes) -> dict[int, tuple[str, int]]:
    """pid -> (command line, network namespace inode) of every process of `program` on the machine."""
    found: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = pathlib.Path(entry.path, "cmdline").read_bytes()
            if program not in raw.split(b"\0", 1)[0]:
                continue
            netns = os.stat(f"{entry.path}/ns/net").st_ino
        except (OSError, ValueError):
            continue
        found[int(entry.name)] = (raw.replace(b"\0", b" ").decode(errors="replace"), netns)
    return found


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


def netns_owners() -> dict[int, str | None]:
    """network namespace inode -> the pytest process that started the libvirtd in it. libvirt daemonizes QEMU (its
    parent is init), but a QEMU runs in its libvirtd's namespace, and each test host has a namespace of its own."""
    return {netns: started_by(pid) for pid, (_, netns) in processes(b"libvirtd").items()}


class GuestSampler:
    """The once-a-second look at /proc, charging each new QEMU of ours to the module that runs."""

    def __init__(self, timings: dict[str, ModuleTiming]) -> None:
        self.timings = timings
        self.current: str | None = None
        self.known: dict[int, tuple[str, str]] = {}  # pid -> (module, kind), ours only
        self.foreign: set[int] = set()
        self.peak_linux = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="timing-report-guests", daemon=True)
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            try:
                self.sample()
            except Exception:  # never let the report break a test run
                pass

    def sample(self) -> None:
        me = worker_id()
        qemus = processes(b"qemu-system")
        linux_now = sum(1 for cmdline, _ in qemus.values() if guest_kind(cmdline) in LINUX_KINDS)
        owners: dict[int, str | None] | None = None
        with self.lock:
            self.peak_linux = max(self.peak_linux, linux_now)
            module = self.current
            if module is not None:
                timing = self.timings[module]
                timing.peak_linux_guests = max(timing.peak_linux_guests, linux_now)
            for pid, (cmdline, netns) in qemus.items():
                if pid in self.foreign:
                    continue
                if pid not in self.known:
                    owners = netns_owners() if owners is None else owners
                    if module is None or owners.get(netns) != me:
                        self.foreign.add(pid)
                        continue
                    kind = guest_kind(cmdline)
                    self.known[pid] = (module, kind)
                    guests = self.timings[module].guests
                    guests[kind] = guests.get(kind, 0) + 1
                owner, kind = self.known[pid]
                seconds = self.timings[owner].guest_seconds
                seconds[kind] = round(seconds.get(kind, 0.0) + SAMPLE_S, 1)


class TimingReport:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.timings: dict[str, ModuleTiming] = {}
        self.sampler = GuestSampler(self.timings)
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


def read_setup() -> list[tuple[str, float, str]]:
    """(step, seconds, how it ended) of this run's set-up, in the order they ended."""
    path = TIMING_DIR / "setup.tsv"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 3:
            steps.append((parts[0], float(parts[1]), parts[2]))
    return steps


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
    setup_s = sum(seconds for step, seconds, _ in setup if "/" not in step)
    setup_wall = setup_wall_s(min((w["started"] for w in workers), default=time.time()))
    boot_lines: list[str] = []
    guests: dict[str, int] = {}
    for m in modules:
        for kind, n in m["guests"].items():
            guests[kind] = guests.get(kind, 0) + n
    peak = max((w["peak_linux_guests"] for w in workers), default=0)

    def guests_text(m: dict[str, object]) -> str:
        counts = m["guests"]
        assert isinstance(counts, dict)
        return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "-"

    lines = [f"# make test: where the time went (commit {commit})", "",
             f"Set-up: {setup_wall} wall ({setup_s:.0f} s of steps, side by side); tests: {wall_s:.0f} s wall on {len(workers)} pytest process(es); "
             f"guests booted: {', '.join(f'{n} {k}' for k, n in sorted(guests.items())) or 'none'}; "
             f"at most {peak} Linux guests ran at once.", "",
             "## Set-up (make test's prerequisites; a step that found all of it in the cache takes a second or two)", "",
             "| step | seconds | result |", "|---|---|---|"]
    lines += [f"| {step} | {seconds:.0f} | {how} |" for step, seconds, how in setup]
    lines += ["", "## Test modules, longest first (wall time from the first setup to the last teardown)", "",
              "| module | worker | wall s | tests | failed | guests booted | guest-seconds | peak Linux guests |",
              "|---|---|---|---|---|---|---|---|"]
    for m in modules:
        guest_s = ", ".join(f"{kind} {s:.0f}" for kind, s in sorted(m["guest_seconds"].items())) or "-"
        lines.append(f"| {m['module']} | {m['worker']} | {m['ended'] - m['started']:.0f} | {m['tests']} | "
                     f"{m['failed']} | {guests_text(m)} | {guest_s} | {m['peak_linux_guests']} |")
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
    summary += [f"  set-up {step}: {seconds:.0f} s ({how})" for step, seconds, how in setup if seconds >= 5]
    summary += [f"  {m['ended'] - m['started']:6.0f} s  {m['module']} [{m['worker']}] ({guests_text(m)})"
                for m in modules[:15]]
    summary += boot_lines
    return Report(summary, markdown)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimingReport(config), "capi-libvirt-timing-report")
