"""What the bench reads: kube-apiserver's request counters, the operator's CPU and memory, and the host's state.

API traffic comes from kube-apiserver's own `/metrics` (apiserver_request_total by verb, resource and subresource),
read before and after a round; the bench's own requests in between (it creates and deletes the objects and watches
them, and only that) are counted by the bench and subtracted, so what remains is the operator's. Events are counted
apart: the targets exclude them.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import re
import time

import libvirt

SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')
READ_VERBS, WRITE_VERBS = {"GET", "LIST"}, {"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"}
Key = tuple[str, str]  # (verb, resource[/subresource])
# What the operator's roles let it touch (config/rbac); the rest is kube-apiserver's own traffic
# (its lease and endpoints heartbeat, its loopback informers' watches).
OPERATOR_RESOURCES = {"libvirtmachines", "libvirtclusters", "libvirthosts", "libvirtmachinetemplates", "machines",
                      "clusters", "secrets", "events", "customresourcedefinitions", "leases",
                      "namespaces"}


def api_requests(metrics_text: str) -> dict[Key, float]:
    counts: dict[Key, float] = {}
    for line in metrics_text.splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        labels = dict(LABEL.findall(match["labels"]))
        if labels.get("resource") not in OPERATOR_RESOURCES:
            continue  # /metrics, /healthz, discovery, the API server's own requests: not the operator's
        resource = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        key = (labels.get("verb", ""), resource)
        counts[key] = counts.get(key, 0) + float(match["value"])
    return counts


def difference(after: dict[Key, float], before: dict[Key, float], own: dict[Key, int]) -> dict[Key, float]:
    """The operator's requests: what the API server counted in between, less the bench's own."""
    keys = set(after) | set(own)
    delta = {key: after.get(key, 0) - before.get(key, 0) - own.get(key, 0) for key in keys}
    return {key: value for key, value in delta.items() if value}


def split(requests: dict[Key, float]) -> dict[str, float]:
    """reads, writes and watches; apart from them events, the host prober's status writes (every 30 s per host,
    with or without machines: not part of a machine's lifecycle) and Leases: the benches run the operator
    --standalone, which holds no Lease, so those are kube-apiserver's own identity Leases (one renewal every 10 s)."""
    totals = {"reads": 0.0, "writes": 0.0, "watches": 0.0, "events": 0.0, "host_probes": 0.0, "apiserver_leases": 0.0}
    for (verb, resource), count in requests.items():
        if resource.startswith("events"):
            totals["events"] += count
        elif resource == "libvirthosts/status":
            totals["host_probes"] += count
        elif resource == "leases":
            totals["apiserver_leases"] += count
        elif verb in READ_VERBS:
            totals["reads"] += count
        elif verb in WRITE_VERBS:
            totals["writes"] += count
        elif verb == "WATCH":
            totals["watches"] += count
    return totals


@dataclasses.dataclass(frozen=True)
class ProcessSample:
    cpu_s: float  # user + system since the process started
    rss_mb: float


def process_sample(pid: int) -> ProcessSample:
    ticks = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    cpu = (int(ticks[11]) + int(ticks[12])) / hz
    rss_kib = next(int(line.split()[1]) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    return ProcessSample(cpu, rss_kib / 1024)


def metric_sum(metrics_text: str, name: str) -> float:
    """A labelled metric of the operator's, summed over its labels."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines() if line.startswith(name + "{"))


def operator_operations(metrics_text: str) -> float:
    """capi_libvirt_host_operations_total, summed over hosts."""
    return metric_sum(metrics_text, "capi_libvirt_host_operations_total")


def watch_events(metrics_text: str) -> float:
    """capi_libvirt_watch_events_total, summed over resources and outcomes."""
    return metric_sum(metrics_text, "capi_libvirt_watch_events_total")


def last_start(qemu_log_dir: pathlib.Path, name_prefix: str, n: int, since_wall: float) -> float | None:
    """The wall-clock time libvirtd started the last of the N domains whose names begin with `name_prefix`, from the
    "starting up" line it writes in each domain's QEMU log as it launches QEMU, counting starts at or after
    `since_wall` only; None unless exactly N domains started. Both contenders' "all running" come from it: polling
    libvirt for running domains answers late while the guests just started load the host's cores (QEMU under TCG), by
    tens of seconds, which would bill that load's delay to whoever is polled."""
    starts = []
    for path in qemu_log_dir.glob(f"{name_prefix}*.log"):
        stamps = [datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=datetime.UTC).timestamp()
                  for line in path.read_text(errors="replace").splitlines() if ": starting up " in line]
        stamps = [stamp for stamp in stamps if stamp >= since_wall - 0.001]
        if stamps:
            starts.append(max(stamps))
    return max(starts) if len(starts) == n else None


def running_domains(conn: libvirt.virConnect, prefix: str) -> int:
    return sum(1 for domain in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
               if domain.name().startswith(prefix))


def host_clean(conn: libvirt.virConnect, pool_name: str, keep: set[str]) -> bool:
    """No domain, and no volume besides `keep` (the base image)."""
    if conn.listAllDomains():
        return False
    pool = conn.storagePoolLookupByName(pool_name)
    pool.refresh(0)
    return set(pool.listVolumes()) <= keep


def leased_macs(conn: libvirt.virConnect, network: str) -> set[str]:
    return {lease["mac"].lower() for lease in conn.networkLookupByName(network).DHCPLeases()}


def wait_until(predicate, timeout: float, interval: float = 0.2) -> float:
    """Poll until true; returns the monotonic time it first was. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f}s: {getattr(predicate, '__doc__', '') or predicate}")
        time.sleep(interval)
