"""The operator's Prometheus metrics: what they are, how the reconciles record them, and their exposition.

Counters and the histogram are recorded as things happen: by the machine reconcile through `Observer` (it is the
reconcile's `Dependencies.observe`: phase durations, each pass's outcome) and by the handlers around the other
reconciles (`reconcile_pass`). The gauges (machines per host and phase, host reachability and connections, leader)
are read at scrape time from the running operators' state, so they cannot drift from it; so are the orphans per host
and state (reconcile.orphans), whose removals are counted as they happen, and the watch events taken in (counted by
kube.cache as it applies them).

Label values are bounded: kinds, phase names, condition reasons and exception class names, host names. Never a
message, a URI or anything from a Secret.
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from capi_libvirt import __version__
from capi_libvirt.operator import election
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile import machine as machine_reconcile
from capi_libvirt.reconcile import orphans as orphans_reconcile

PREFIX = "capi_libvirt"
RECONCILES = Counter(f"{PREFIX}_reconciles", "Reconcile passes, by kind and result "
                     "(success, waiting, failed, paused, error).", ["kind", "result"])
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
DURATION = Histogram(f"{PREFIX}_reconcile_duration_seconds", "Duration of a LibvirtMachine's reconcile phases, by "
                     "kind and phase name.", ["kind", "phase"], buckets=BUCKETS)
PASS_DURATION = Histogram(f"{PREFIX}_reconcile_pass_duration_seconds", "Duration of whole reconcile passes, by kind "
                          "and type (reconcile, delete).", ["kind", "type"], buckets=BUCKETS)
ERRORS = Counter(f"{PREFIX}_reconcile_errors", "Failed reconciles, by kind and reason (a condition reason, or the "
                 "class of an unexpected exception).", ["kind", "reason"])
ORPHANS_REMOVED = Counter(f"{PREFIX}_orphans_removed", "Orphaned domains and volumes (of this management cluster, "
                          "their LibvirtMachine gone) removed after the grace period, by host and kind (domain, "
                          "volume).", ["host", "kind"])
BUILD_INFO = Gauge(f"{PREFIX}_build_info", "1, labelled with the running build: the provider's version and "
                   "Python's.", ["version", "python_version"])
BUILD_INFO.labels(__version__, platform.python_version()).set(1)
LIBVIRT_CALLS = Histogram(f"{PREFIX}_libvirt_call_duration_seconds", "Duration of operations on libvirt hosts (each "
                          "one or a few libvirt API calls), by operation and outcome (ok, error).",
                          ["operation", "outcome"], buckets=BUCKETS)
API_REQUESTS = Counter(f"{PREFIX}_rest_client_requests", "Requests of the provider's Kubernetes API client (not "
                       "kopf's watches), by HTTP method and status code (<error>: no response).", ["method", "code"])
IMAGE_IMPORT_BYTES = Counter(f"{PREFIX}_image_import_bytes", "Bytes downloaded by image imports (spec.image.url).")
IMAGE_IMPORT_DURATION = Histogram(f"{PREFIX}_image_import_duration_seconds", "Duration of image imports, download, "
                                  "verification and upload into the pool, by outcome (ok, error).", ["outcome"],
                                  buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600))
# The machine work queue, under controller-runtime's names, so that dashboards made for Cluster API's managers work.
QUEUE = "libvirtmachine"
QUEUE_DEPTH = Gauge("workqueue_depth", "Keys waiting for a worker in the work queue, by queue.", ["name"])
QUEUE_ADDS = Counter("workqueue_adds", "Keys added to the work queue, by queue.", ["name"])
QUEUE_WAIT = Histogram("workqueue_queue_duration_seconds", "How long a key waited in the work queue before a worker "
                       "took it, by queue.", ["name"], buckets=BUCKETS)
QUEUE_WORK = Histogram("workqueue_work_duration_seconds", "How long a worker took over a key (one reconcile pass), by "
                       "queue.", ["name"], buckets=BUCKETS)
QUEUE_RETRIES = Counter("workqueue_retries", "Passes that failed and were queued again with backoff, by queue.",
                        ["name"])
MACHINES = f"{PREFIX}_machines"
ORPHANS = f"{PREFIX}_orphans"
HOST_REACHABLE = f"{PREFIX}_host_reachable"
HOST_PROBE_SLOW = f"{PREFIX}_host_probe_slow"
HOST_CONNECTIONS = f"{PREFIX}_host_connections_opened"
HOST_OPERATIONS = f"{PREFIX}_host_operations"
WATCH_EVENTS = f"{PREFIX}_watch_events"
LEADER = f"{PREFIX}_leader"
NAMES = [f"{PREFIX}_reconciles_total", f"{PREFIX}_reconcile_duration_seconds", f"{PREFIX}_reconcile_errors_total",
         f"{PREFIX}_reconcile_pass_duration_seconds", f"{PREFIX}_build_info", f"{PREFIX}_libvirt_call_duration_seconds",
         f"{PREFIX}_rest_client_requests_total", "workqueue_depth", "workqueue_adds_total",
         "workqueue_queue_duration_seconds", "workqueue_work_duration_seconds", "workqueue_retries_total",
         f"{PREFIX}_image_import_bytes_total", f"{PREFIX}_image_import_duration_seconds",
         MACHINES, HOST_REACHABLE, HOST_PROBE_SLOW, f"{HOST_CONNECTIONS}_total", f"{HOST_OPERATIONS}_total", LEADER, ORPHANS,
         f"{PREFIX}_orphans_removed_total", f"{WATCH_EVENTS}_total"]

MACHINE = "LibvirtMachine"
SUCCESS, WAITING, FAILED, PAUSED, ERROR = "success", "waiting", "failed", "paused", "error"


def record(kind: str, result: str, reason: str | None = None) -> None:
    RECONCILES.labels(kind, result).inc()
    if reason is not None:
        ERRORS.labels(kind, reason).inc()


@contextlib.contextmanager
def reconcile_pass(kind: str, type_: str = "reconcile", count_success: bool = True) -> Iterator[None]:
    """Around one reconcile in the handlers: its duration, and its result unless the reconcile reports it itself
    (count_success=False: the machine reconcile does, through Observer, for every pass that does not raise)."""
    started = time.monotonic()
    try:
        yield
    except machine_reconcile.Wait as wait:
        record(kind, FAILED if wait.failure else WAITING, wait.reason if wait.failure else None)
        raise
    except Exception as error:
        record(kind, ERROR, type(error).__name__)
        raise
    else:
        if count_success:
            record(kind, SUCCESS)
    finally:
        PASS_DURATION.labels(kind, type_).observe(time.monotonic() - started)


def libvirt_call(operation: str, seconds: float, ok: bool) -> None:
    """hypervisor.connection's CallObserver (called from the hosts' threads: prometheus_client is thread-safe)."""
    LIBVIRT_CALLS.labels(operation, "ok" if ok else "error").observe(seconds)


def image_import(received: int, seconds: float, ok: bool) -> None:
    """reconcile.images' ImportObserver."""
    IMAGE_IMPORT_BYTES.inc(received)
    IMAGE_IMPORT_DURATION.labels("ok" if ok else "error").observe(seconds)


def api_request(method: str, code: str) -> None:
    """kube.api's RequestObserver."""
    API_REQUESTS.labels(method, code).inc()


class QueueMetrics:
    """operator.workqueue's QueueObserver for one queue."""

    def __init__(self, name: str) -> None:
        self.depth, self.adds = QUEUE_DEPTH.labels(name), QUEUE_ADDS.labels(name)
        self.wait, self.work, self.retries = QUEUE_WAIT.labels(name), QUEUE_WORK.labels(name), QUEUE_RETRIES.labels(name)

    def added(self) -> None:
        self.adds.inc()
        self.depth.inc()

    def started(self, waited_s: float) -> None:
        self.depth.dec()
        self.wait.observe(waited_s)

    def finished(self, worked_s: float, retry: bool) -> None:
        self.work.observe(worked_s)
        if retry:
            self.retries.inc()


def machine_phase(status: dict[str, Any], wait: machine_reconcile.Wait | None, paused: bool) -> str:
    """Where a machine stands after a pass: Pending (no host yet), Provisioning, Provisioned, Failed or Paused."""
    if paused:
        return "Paused"
    if wait is None:
        return "Provisioned"
    if wait.failure:
        return "Failed"
    return "Provisioning" if status.get("host") else "Pending"


class Observer(machine_reconcile.Observer):
    """The machine reconcile's observer: phase durations and outcomes, and each machine's last host and phase."""

    def __init__(self) -> None:
        self.machines: dict[tuple[str, str], tuple[str, str]] = {}  # (namespace, name) -> (host, phase)

    def phase(self, kind: str, phase: str) -> contextlib.AbstractContextManager[object]:
        return DURATION.labels(kind, phase).time()

    def machine_outcome(self, body: dict[str, Any], status: dict[str, Any], wait: machine_reconcile.Wait | None,
                        paused: bool) -> None:
        result = PAUSED if paused else SUCCESS if wait is None else FAILED if wait.failure else WAITING
        record(MACHINE, result, wait.reason if result == FAILED and wait is not None else None)
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self.machines[key] = (status.get("host") or "", machine_phase(status, wait, paused))

    def machine_deleting(self, namespace: str, name: str, host: str | None) -> None:
        self.machines[(namespace, name)] = (host or "", "Deleting")

    def machine_gone(self, namespace: str, name: str) -> None:
        self.machines.pop((namespace, name), None)

    def orphans_removed(self, host: str, domains: int, volumes: int) -> None:
        if domains:
            ORPHANS_REMOVED.labels(host, "domain").inc(domains)
        if volumes:
            ORPHANS_REMOVED.labels(host, "volume").inc(volumes)


@dataclasses.dataclass(eq=False)
class Source:
    """One running operator's state, for the gauges."""

    observer: Observer
    inventory: inventory_.Inventory
    state: election.State
    watch_events: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)  # kube.cache's count


class StateCollector(Collector):
    """The gauges, from the operators running in this process (one in production; tests may run several)."""

    def __init__(self) -> None:
        self.sources: list[Source] = []

    def collect(self) -> Iterator:
        machines = GaugeMetricFamily(MACHINES, "LibvirtMachines this replica reconciles, by host (empty: not placed) "
                                     "and phase.", labels=["host", "phase"])
        reachable = GaugeMetricFamily(HOST_REACHABLE, "1 when the last probe of the libvirt host reached it.",
                                      labels=["host"])
        slow = GaugeMetricFamily(HOST_PROBE_SLOW, "1 while the libvirt host's probe is late (not answered within "
                                 "its timeout) and its connection alive: busy, not lost.", labels=["host"])
        opened = CounterMetricFamily(HOST_CONNECTIONS, "libvirt connections opened to the host (1 in a healthy "
                                     "life; more: the connection broke and was re-opened).", labels=["host"])
        operations = CounterMetricFamily(HOST_OPERATIONS, "Operations run on the libvirt host (each one or a few "
                                         "libvirt API calls: look up a domain, create a volume, start...).",
                                         labels=["host"])
        orphans = GaugeMetricFamily(ORPHANS, "Domains and volumes on the host that carry this provider's names or "
                                    "owner metadata but no LibvirtMachine here claims, by state: pending (this "
                                    "management cluster's, removed after the grace period), kept (another management "
                                    "cluster's, an older release's or moved away: reported, never removed), "
                                    "stray_volume (our naming scheme, no domain: never removed).",
                                    labels=["host", "state"])
        for source in self.sources:
            if source.state.active:
                for host, record in sorted(source.inventory.orphans.items()):
                    for state, count in orphans_reconcile.status_counts(record).items():
                        orphans.add_metric([host, state], count)
        events = CounterMetricFamily(WATCH_EVENTS, "Watch events the operator took in, by resource (plural) and "
                                     "outcome: changed (the object changed), unchanged (the echo of its own write, "
                                     "or a body older than the one held).", labels=["resource", "outcome"])
        for labels, count in sorted(self._watch_events().items()):
            events.add_metric(list(labels), count)
        leader = GaugeMetricFamily(LEADER, "1 when this replica does the work (it leads, or runs standalone), "
                                   "0 while it stands by.")
        for labels, count in sorted(self._machine_counts().items()):
            machines.add_metric(list(labels), count)
        for name, (up, late, connections, calls) in sorted(self._hosts().items()):
            reachable.add_metric([name], up)
            slow.add_metric([name], late)
            opened.add_metric([name], connections)
            operations.add_metric([name], calls)
        leader.add_metric([], max((1 if s.state.active else 0 for s in self.sources), default=0))
        return iter([machines, reachable, slow, opened, operations, leader, orphans, events])

    def _watch_events(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for source in self.sources:
            for labels, count in list(source.watch_events.items()):
                counts[labels] = counts.get(labels, 0) + count
        return counts

    def _machine_counts(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for source in self.sources:
            if source.state.active:  # a standby's view is from before it stood by
                for host_and_phase in list(source.observer.machines.values()):
                    counts[host_and_phase] = counts.get(host_and_phase, 0) + 1
        return counts

    def _hosts(self) -> dict[str, tuple[int, int, int, int]]:
        """Per host: reachable (0/1), its probe slow (0/1), connections opened, operations run."""
        hosts: dict[str, tuple[int, int, int, int]] = {}
        for source in self.sources:
            for name, host in list(source.inventory.hosts.items()):
                try:
                    connection = source.inventory.registry.get(name)
                    connections, calls = connection.opened, connection.calls
                except Exception:  # noqa: BLE001  removed meanwhile
                    connections = calls = 0
                up, late, opened_before, calls_before = hosts.get(name, (0, 0, 0, 0))
                hosts[name] = (max(up, int(host.reachable)), max(late, int(host.slow)), opened_before + connections,
                               calls_before + calls)
        return hosts


COLLECTOR = StateCollector()
REGISTRY.register(COLLECTOR)


def attach(source: Source) -> None:
    COLLECTOR.sources.append(source)


def detach(source: Source) -> None:
    if source in COLLECTOR.sources:
        COLLECTOR.sources.remove(source)


def exposition() -> tuple[bytes, str]:
    """The text format of every metric of the process (with prometheus_client's process and GC metrics)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
