"""One bench run: the test bed up, the operator idling with no machine, then for each N the rounds of ours, of the
floor at the same concurrency and of the floor one machine at a time; the largest N's last round also idles."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import pathlib
import platform
import re
import subprocess

from bench import report, testbed, workload

log = logging.getLogger("bench")


@dataclasses.dataclass(frozen=True)
class Settings:
    sizes: tuple[int, ...] = (1, 10, 50)
    rounds: int = 3
    idle_s: float = 120.0
    floor_concurrency: int = 0  # 0: the operator's per-host creation concurrency (read from its default)
    operator_args: tuple[str, ...] = ()
    out: pathlib.Path = pathlib.Path("bench/results")
    name: str = "latest"
    smoke: bool = False  # the test tier's run: a host of its own (see testbed.Bed)


def rewrite(results_file: pathlib.Path, libvirtd_log: pathlib.Path | None = None) -> dict:
    """The report again from a results file (after a change to the summary or the table), optionally re-reading the
    run's libvirtd log (its workdir is left in /tmp)."""
    results = json.loads(results_file.read_text())
    if libvirtd_log is not None:
        results["libvirtd_log"] = libvirtd_log_summary(libvirtd_log)
    results["summary"] = report.summarize(results)
    report.write(results, results_file.parent, results_file.stem)
    return results


def run(settings: Settings) -> dict:
    workdir = testbed.new_workdir()
    log.info("bench: working in %s", workdir)
    results: dict = {"settings": {**dataclasses.asdict(settings), "out": str(settings.out)},
                     "machine": machine_facts(), "ours": {}, "floor": {}, "floor_serial": {}}
    concurrency = settings.floor_concurrency or default_creation_concurrency()
    results["settings"]["floor_concurrency"] = concurrency
    with testbed.Bed(workdir, smoke=settings.smoke).up() as bed:
        bed.start_operator(list(settings.operator_args))
        log.info("bench: operator up; idling %.0fs with no machine", settings.idle_s)
        results["idle_empty"] = asyncio.run(workload.idle_cost(bed, settings.idle_s)) if settings.idle_s else None
        ours, floor, serial = workload.Ours(bed), workload.Floor(bed, concurrency), workload.Floor(bed, 1)
        for n in settings.sizes:
            for index in range(settings.rounds):
                idle = settings.idle_s if n == max(settings.sizes) and index == settings.rounds - 1 else 0
                for label, make in (("ours", lambda n=n, idle=idle: asyncio.run(ours.run(n, idle))),
                                    ("floor", lambda n=n: floor.run(n)), ("floor_serial", lambda n=n: serial.run(n))):
                    result = make()
                    provisioned = f"{result.provisioned_s:.2f}s" if result.provisioned_s is not None else \
                        f"not all ({result.unprovisioned} without an address: {'; '.join(result.unprovisioned_why)})"
                    log.info("bench: N=%d round %d %s: running %.2fs, provisioned %s, deleted %.2fs", n, index + 1,
                             label, result.running_s, provisioned, result.delete_s)
                    results[label].setdefault(str(n), []).append(dataclasses.asdict(result))
        results["libvirtd_log"] = libvirtd_log_summary(bed.host.libvirtd_log)
        bed.stop_operator()
    results["summary"] = report.summarize(results)
    report.write(results, settings.out, settings.name)
    return results


def default_creation_concurrency() -> int:
    from capi_libvirt.operator import config

    return config.DEFAULT_CREATES_PER_HOST  # what `capi-libvirt run --creates-per-host` defaults to


def machine_facts() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=testbed.REPO).stdout.strip()
    meminfo = pathlib.Path("/proc/meminfo").read_text().splitlines()
    memory_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "cpus": len(__import__("os").sched_getaffinity(0)), "memory_gib": round(memory_kib / 1024**2, 1),
            "kernel": platform.release()}


NAMES_AND_NUMBERS = re.compile(r"(id=\d+|name='[^']*'|uuid=[0-9a-f-]+|\d+)")
TAINTED = "is tainted: high-privileges"  # one per domain started: the test host runs QEMU as root


def libvirtd_log_summary(path: pathlib.Path) -> dict:
    """How many warning and error lines libvirtd wrote during the run, by message (ids and numbers blanked, the
    first 100 characters); `lines` leaves out the per-domain taint notice of the test host's QEMU-as-root set-up."""
    counts: dict[str, int] = {}
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            if ": warning :" in line or ": error :" in line:
                message = NAMES_AND_NUMBERS.sub("#", line.split(" : ", 2)[-1])[:100]
                counts[message] = counts.get(message, 0) + 1
    lines = sum(count for message, count in counts.items() if TAINTED not in message)
    return {"lines": lines, "by_message": dict(sorted(counts.items(), key=lambda kv: -kv[1])[:10])}
