"""The bench's results as JSON, a Markdown table and a plot (time against N, ours and the floor), and the targets
each checked against what was measured (never asserted in a test: speed is measured here, not in `make test`)."""

from __future__ import annotations

import json
import pathlib
import statistics

from bench import measure

TARGETS = {
    "vs_serial": "all domains running at least 5x sooner than one-at-a-time creation (largest N)",
    "vs_floor": "all domains running within 1.3x the floor at the same concurrency (largest N)",
    "writes": "at most 4 API writes per machine lifecycle, events (and the host prober's status writes) excluded",
    "reads": "at most 2 API reads per machine lifecycle",
    "cpu": "operator CPU at most 0.05 s per machine lifecycle (largest N)",
    "idle_cpu": "idle CPU with the largest N provisioned at most 1% of one core",
    "rss_idle": "RSS at most 80 MB idle (no machine; issue 28, was 100)",
    "rss_loaded": "RSS at most 150 MB with the largest N provisioned",
    "delete": "deleting N as fast as creating N (delete -> host clean vs create -> all running, largest N)",
}


def spread(values: list[float | None]) -> dict:
    """Median and range of what was measured (a round whose guests did not all provision has no time for that)."""
    measured = [v for v in values if v is not None]
    return {"median": statistics.median(measured), "min": min(measured), "max": max(measured)} if measured else {}


def summarize(results: dict) -> dict:
    summary: dict = {}
    for label in ("ours", "floor", "floor_serial"):
        for n, rounds in results[label].items():
            row = summary.setdefault(n, {})
            for field in ("running_s", "provisioned_s", "delete_s"):
                row[f"{label}_{field}"] = spread([r[field] for r in rounds])
            row[f"{label}_unprovisioned"] = sum(r.get("unprovisioned", 0) for r in rounds)
            if label == "ours":
                per_machine = [measure.split({tuple(k.split(" ", 1)): v for k, v in r["api"].items()}) for r in rounds]
                count = int(n)
                row["writes_per_machine"] = spread([p["writes"] / count for p in per_machine])
                row["reads_per_machine"] = spread([p["reads"] / count for p in per_machine])
                row["events_per_machine"] = spread([p["events"] / count for p in per_machine])
                row["cpu_s_per_machine"] = spread([r["cpu_s"] / count for r in rounds])
                row["libvirt_operations_per_machine"] = spread([r["libvirt_operations"] / count for r in rounds])
                row["rss_mb"] = spread([r["rss_mb"] for r in rounds])
                idles = [r["idle"] for r in rounds if r.get("idle")]
                if idles:
                    row["idle_loaded"] = idles[-1]
    largest = str(max(int(n) for n in results["ours"]))
    summary["targets"] = check_targets(summary[largest], results.get("idle_empty"), int(largest))
    return summary


def check_targets(row: dict, idle_empty: dict | None, n: int) -> dict:
    def verdict(value: float | None, limit: float, measured: str) -> dict:
        return {"met": value is not None and value <= limit, "measured": measured}

    ours, floor, serial = (row[f"{k}_running_s"]["median"] for k in ("ours", "floor", "floor_serial"))
    idle_loaded = row.get("idle_loaded")
    return {
        "vs_serial": verdict(ours * 5, serial, f"{serial / ours:.1f}x sooner ({ours:.1f}s vs {serial:.1f}s)"),
        "vs_floor": verdict(ours / floor, 1.3, f"{ours / floor:.2f}x the floor ({ours:.1f}s vs {floor:.1f}s)"),
        "writes": verdict(row["writes_per_machine"]["median"], 4, f"{row['writes_per_machine']['median']:.1f}"),
        "reads": verdict(row["reads_per_machine"]["median"], 2, f"{row['reads_per_machine']['median']:.1f}"),
        "cpu": verdict(row["cpu_s_per_machine"]["median"], 0.05, f"{row['cpu_s_per_machine']['median']:.3f} s"),
        "idle_cpu": verdict(idle_loaded and idle_loaded["cpu_percent_of_core"], 1.0,
                            f"{idle_loaded['cpu_percent_of_core']:.2f}%" if idle_loaded else "not measured"),
        "rss_idle": verdict(idle_empty and idle_empty["rss_mb"], 80,
                            f"{idle_empty['rss_mb']:.0f} MB" if idle_empty else "not measured"),
        "rss_loaded": verdict(row["rss_mb"]["max"], 150, f"{row['rss_mb']['max']:.0f} MB"),
        "delete": verdict(row["ours_delete_s"]["median"], ours,
                          f"{row['ours_delete_s']['median']:.1f}s to delete vs {ours:.1f}s to create (N={n})"),
    }


def _cell(value: dict) -> str:
    if not value:
        return "-"
    return f"{value['median']:.2f} ({value['min']:.2f}-{value['max']:.2f})"


def markdown(results: dict) -> str:
    s, settings, machine = results["summary"], results["settings"], results["machine"]
    sizes = sorted((n for n in s if n != "targets"), key=int)
    lines = [f"# make bench: {machine['date']}, commit {machine['commit']}", "",
             f"{machine['cpus']} CPUs, {machine['memory_gib']} GiB, guests under TCG (domainType qemu); "
             f"{settings['rounds']} rounds "
             f"per N; floor concurrency {settings['floor_concurrency']}; median (min-max), seconds unless named.", "",
             "| N | ours: all running | floor: all running | floor one at a time | ours: all provisioned | "
             "floor: all leased | ours: delete -> clean | floor: delete -> clean |",
             "|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        r = s[n]
        lines.append(f"| {n} | {_cell(r['ours_running_s'])} | {_cell(r['floor_running_s'])} | "
                     f"{_cell(r['floor_serial_running_s'])} | {_cell(r['ours_provisioned_s'])} | "
                     f"{_cell(r['floor_provisioned_s'])} | {_cell(r['ours_delete_s'])} | {_cell(r['floor_delete_s'])} |")
    failed = [f"{label} N={n}: {s[n][f'{label}_unprovisioned']}" for n in sizes
              for label in ("ours", "floor", "floor_serial") if s[n].get(f"{label}_unprovisioned")]
    if failed:
        lines += ["", "Guests that took no address within the round's limit (their rounds have no provisioned time): "
                  + ", ".join(failed)]
    lines += ["", "Per machine lifecycle (the operator's share):", "",
              "| N | API writes | API reads | events | libvirt operations | CPU s | RSS MB |", "|---|---|---|---|---|---|---|"]
    # (the host prober's LibvirtHost status writes, every 30 s, are counted apart: see the request list below)
    for n in sizes:
        r = s[n]
        lines.append(f"| {n} | {_cell(r['writes_per_machine'])} | {_cell(r['reads_per_machine'])} | "
                     f"{_cell(r['events_per_machine'])} | {_cell(r['libvirt_operations_per_machine'])} | "
                     f"{_cell(r['cpu_s_per_machine'])} | {_cell(r['rss_mb'])} |")
    lines += ["", "Idle:", ""]
    for label, idle in (("no machine", results.get("idle_empty")),
                        (f"N={sizes[-1]} provisioned", s[sizes[-1]].get("idle_loaded"))):
        if idle:
            lines.append(f"- {label}: {idle['cpu_s']:.2f} CPU s over {idle['seconds']:.0f} s "
                         f"({idle['cpu_percent_of_core']:.2f}% of a core), RSS {idle['rss_mb']:.0f} MB, API requests "
                         + (", ".join(f"{k} {v:.0f}" for k, v in idle["api"].items()) or "none"))
    log = results.get("libvirtd_log") or {}
    lines += ["", f"libvirtd warnings and errors over the run: {log.get('lines', 0)} (besides one taint notice per "
              "domain: the test host runs QEMU as root); the most frequent:"]
    lines += [f"- {count} x {message}" for message, count in (log.get("by_message") or {}).items()]
    lines += ["", "Targets (largest N):", "", "| target | measured | met |", "|---|---|---|"]
    for key, text in TARGETS.items():
        t = s["targets"][key]
        lines.append(f"| {text} | {t['measured']} | {'yes' if t['met'] else 'no'} |")
    largest = s[sizes[-1]]
    lines += ["", f"API requests of the operator in the last N={sizes[-1]} round:", ""]
    last = results["ours"][sizes[-1]][-1]["api"]
    lines += [f"- {key}: {value:.0f}" for key, value in last.items()]
    del largest
    return "\n".join(lines) + "\n"


def plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    sizes = sorted((n for n in s if n != "targets"), key=int)
    xs = [int(n) for n in sizes]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (("ours_running_s", "ours: all running", "o-"),
                              ("floor_running_s", "floor: all running", "s--"),
                              ("floor_serial_running_s", "floor, one at a time", "^:"),
                              ("ours_provisioned_s", "ours: all provisioned", "o-"),
                              ("ours_delete_s", "ours: delete -> host clean", "x-")):
        axis.plot(xs, [s[n][key].get("median", float("nan")) for n in sizes], style, label=label)
    axis.set_xlabel("machines created at once (N)")
    axis.set_ylabel("seconds (median)")
    axis.set_title(f"capi-libvirt make bench ({results['machine']['commit']})")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write(results: dict, folder: pathlib.Path, name: str) -> list[pathlib.Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.json", folder / f"{name}.md", folder / f"{name}.png"]
    paths[0].write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    paths[1].write_text(markdown(results))
    plot(results, paths[2])
    return paths
