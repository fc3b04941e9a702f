"""The operator process's own parts, without a cluster: `run`'s flags, endpoint addresses, the election rule and
readiness, the metrics registry and what the reconciles record in it, and the JSON log format."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import platform
import types
from collections.abc import Iterator

import libvirt
import pytest
from prometheus_client import REGISTRY

from capi_libvirt import cli
from capi_libvirt.operator import election, endpoints, logs, metrics
from capi_libvirt.reconcile import inventory as inventory_
from capi_libvirt.reconcile import machine as machine_reconcile

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
ME = election.Lease(name="capi-libvirt-leader-election", namespace="capi-libvirt-system", identity="pod-a_1_aaaa")


# -- flags ------------------------------------------------------------------------------------------------------------

def test_run_defaults_elect_a_leader_and_serve_probes_and_metrics(monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    args = cli.parser().parse_args(["run"])
    assert (args.leader_election_id, args.standalone, args.leader_elect) == ("capi-libvirt-leader-election", False, True)
    assert (args.leader_elect_lease_duration, args.leader_elect_renew_deadline, args.leader_elect_retry_period) == \
        (15.0, 10.0, 2.0)
    assert (args.health_address, args.metrics_address) == ("0.0.0.0:8081", ":8080")
    assert args.log_format == "plain"


def test_logs_are_json_by_default_in_a_pod(monkeypatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert cli.parser().parse_args(["run"]).log_format == "json"


def test_run_flags_as_tests_and_the_deployment_give_them() -> None:
    args = cli.parser().parse_args(["run", "--standalone", "--health-address", "127.0.0.1:18081",
                                    "--metrics-address", "0", "--log-format", "json", "--namespace", "a"])
    assert args.standalone and args.health_address == "127.0.0.1:18081" and args.metrics_address == "0"
    assert args.log_format == "json" and args.namespace == ["a"]
    assert cli.parser().parse_args(["run", "--leader-election-id", "other"]).leader_election_id == "other"
    assert cli.parser().parse_args(["run", "--peering", "old-name"]).leader_election_id == "old-name"


@pytest.mark.parametrize("argv", [
    ["run", "--standalone", "--peering", "capi-libvirt"],  # one or the other
    ["run", "--health-address", "8081"],  # no colon
    ["run", "--metrics-address", "localhost:http"],
    ["run", "--leader-election-id", "Not_A_Name"],
    ["run", "--leader-elect-lease-duration", "15x"],
    ["run", "--leader-elect-renew-deadline", "10 s"],
    ["run", "--leader-elect-retry-period", "0s"],
    ["run", "--log-format", "xml"],
])
def test_bad_run_flags_are_refused(argv) -> None:
    with pytest.raises(SystemExit):
        cli.parser().parse_args(argv)


@pytest.mark.parametrize("address, expected", [
    (":8080", ("0.0.0.0", 8080)),
    ("0.0.0.0:8081", ("0.0.0.0", 8081)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:9000", ("::1", 9000)),
    ("0", None),
    ("", None),
])
def test_addresses(address, expected) -> None:
    assert endpoints.parse_address(address) == expected


@pytest.mark.parametrize("address", ["8080", "host:", "host:65536", "host:-1"])
def test_bad_addresses(address) -> None:
    with pytest.raises(ValueError):
        endpoints.parse_address(address)


# -- election ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, seconds", [("15s", 15.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0),
                                            ("2.5s", 2.5), ("7", 7.0)])
def test_durations_are_taken_as_cluster_apis_managers_take_them(value, seconds) -> None:
    assert cli.parser().parse_args(["run", "--leader-elect-renew-deadline", value]).leader_elect_renew_deadline \
        == seconds


def test_the_timings_must_nest(monkeypatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "provider-ns")
    lease = cli.election_lease(cli.parser().parse_args(["run", "--leader-elect-lease-duration=30s"]))
    assert lease is not None and (lease.namespace, lease.duration_s) == ("provider-ns", 30.0)
    assert cli.election_lease(cli.parser().parse_args(["run", "--leader-elect=false"])) is None
    with pytest.raises(ValueError, match="must exceed the renew deadline"):
        cli.election_lease(cli.parser().parse_args(["run", "--leader-elect-lease-duration=10s"]))
    assert cli.main(["run", "--leader-elect-retry-period=20s", "--metrics-bind-addr=0", "--health-addr=0"]) == 2


@pytest.mark.parametrize("holder, observed_ago, may", [
    ("", 0, True),  # nobody holds it (never held, or released)
    (ME.identity, 0, True),  # ours: renew
    ("pod-b_1_bbbb", 1, False),  # another's, seen changing a moment ago
    ("pod-b_1_bbbb", 14.9, False),
    ("pod-b_1_bbbb", 15, True),  # unchanged for the lease duration: taken for dead
])
def test_who_may_take_the_lease(holder, observed_ago, may) -> None:
    assert election.may_take(holder, ME.identity, 100.0 - observed_ago, ME.duration_s, 100.0) is may


def test_taking_renewing_and_releasing_write_what_client_go_writes() -> None:
    created = election.taken(None, ME, NOW)
    assert created["metadata"] == {"name": ME.name, "namespace": ME.namespace}
    assert created["spec"] == {"holderIdentity": ME.identity, "leaseDurationSeconds": 15, "leaseTransitions": 0,
                               "acquireTime": "2026-01-01T12:00:00.000000Z", "renewTime": "2026-01-01T12:00:00.000000Z"}
    later = NOW + datetime.timedelta(seconds=2, microseconds=5)
    renewed = election.taken({**created, "metadata": {**created["metadata"], "resourceVersion": "7"}}, ME, later)
    assert renewed["metadata"]["resourceVersion"] == "7"  # the write is refused if someone wrote in between
    assert renewed["spec"]["acquireTime"] == "2026-01-01T12:00:00.000000Z"
    assert renewed["spec"]["renewTime"] == "2026-01-01T12:00:02.000005Z" and renewed["spec"]["leaseTransitions"] == 0
    other = dataclasses.replace(ME, identity="pod-b_1_bbbb")
    taken_over = election.taken(renewed, other, later)
    assert taken_over["spec"]["holderIdentity"] == other.identity and taken_over["spec"]["leaseTransitions"] == 1
    assert taken_over["spec"]["acquireTime"] == "2026-01-01T12:00:02.000005Z"
    free = election.released(taken_over, later)
    assert free["spec"]["holderIdentity"] == "" and free["spec"]["leaseDurationSeconds"] == 1
    assert "acquireTime" not in free["spec"] and free["spec"]["leaseTransitions"] == 1


def test_each_replica_has_its_own_identity() -> None:
    assert len({election.new_identity() for _ in range(50)}) == 50


def test_readiness_standing_by_or_leading_once_started() -> None:
    state = election.State(ME)
    ready, report = state.readiness()
    assert not ready and report["problem"] == "not in the election yet" and report["role"] is None
    state.set_role(None, "Lease capi-libvirt-system/x: HTTP 403 Forbidden")
    assert state.readiness()[1]["problem"] == "Lease capi-libvirt-system/x: HTTP 403 Forbidden"
    state.set_role(election.STANDBY, "held by pod-b_1_bbbb")
    assert state.readiness() == (True, {"ready": True, "role": "standby", "problem": "held by pod-b_1_bbbb",
                                        "lease": f"{ME.namespace}/{ME.name}", "identity": ME.identity})
    assert not state.active and state.not_leading.is_set() and not state.leading.is_set()
    state.set_role(election.LEADER)
    assert state.active and state.leading.is_set() and not state.not_leading.is_set()
    assert state.readiness()[0] is False and state.readiness()[1]["problem"] == "starting"
    state.started.set()
    assert state.readiness()[0] is True
    state.stopping()
    assert state.readiness()[0] is False


def test_standalone_is_active_and_ready_once_started() -> None:
    state = election.State(None)
    assert state.active and state.leading.is_set() and not state.readiness()[0]
    state.started.set()
    assert state.readiness() == (True, {"ready": True, "role": "standalone"})


# -- metrics -----------------------------------------------------------------------------------------------------------

def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_every_metric_is_registered_and_exposed() -> None:
    text = metrics.exposition()[0].decode()
    helped = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    assert set(metrics.NAMES) <= helped


def test_a_pass_is_timed_and_counted_by_its_result() -> None:
    kind = "UnitTestKind"
    with metrics.reconcile_pass(kind):
        pass
    with pytest.raises(machine_reconcile.Wait):
        with metrics.reconcile_pass(kind):
            raise machine_reconcile.Wait("HostUnreachable", "down", failure=True)
    with pytest.raises(machine_reconcile.Wait):
        with metrics.reconcile_pass(kind):
            raise machine_reconcile.Wait("WaitingForOwner", "no owner")
    with pytest.raises(KeyError):
        with metrics.reconcile_pass(kind, count_success=False):
            raise KeyError("x")
    with metrics.reconcile_pass(kind, count_success=False):
        pass
    results = {r: value("capi_libvirt_reconciles_total", kind=kind, result=r) for r in ("success", "failed",
                                                                                         "waiting", "error")}
    assert results == {"success": 1, "failed": 1, "waiting": 1, "error": 1}
    assert value("capi_libvirt_reconcile_errors_total", kind=kind, reason="HostUnreachable") == 1
    assert value("capi_libvirt_reconcile_errors_total", kind=kind, reason="KeyError") == 1
    assert value("capi_libvirt_reconcile_pass_duration_seconds_count", kind=kind, type="reconcile") == 5


def fake_source(observer: metrics.Observer, state: election.State) -> metrics.Source:
    """An inventory of two hosts (one reachable, its probe late), without libvirt."""
    connections = {"kvm1": types.SimpleNamespace(opened=2, calls=7), "kvm2": types.SimpleNamespace(opened=0, calls=0)}
    inventory = types.SimpleNamespace(
        hosts={"kvm1": types.SimpleNamespace(reachable=True, slow=True),
               "kvm2": types.SimpleNamespace(reachable=False, slow=False)},
        registry=types.SimpleNamespace(get=connections.__getitem__),
        orphans={"kvm1": inventory_.OrphanRecord(pending=2, kept=1, stray_volumes=3)})
    return metrics.Source(observer, inventory, state, {("machines", "changed"): 4, ("machines", "unchanged"): 1})


def body(name: str) -> dict:
    return {"metadata": {"namespace": "unit", "name": name}}


@pytest.fixture
def no_other_operator() -> Iterator[None]:
    """The process-wide collector without the sources of operators other tests of the session still run."""
    saved = list(metrics.COLLECTOR.sources)
    metrics.COLLECTOR.sources.clear()
    yield
    metrics.COLLECTOR.sources[:] = saved


def test_the_machine_reconcile_reports_outcomes_and_phases_per_host(no_other_operator) -> None:
    observer, state = metrics.Observer(), election.State(None)
    source = fake_source(observer, state)
    failed_before = value("capi_libvirt_reconcile_errors_total", kind="LibvirtMachine", reason="ImageNotFound")
    observer.machine_outcome(body("a"), {"host": "kvm1"}, None, False)
    observer.machine_outcome(body("b"), {"host": "kvm1"}, None, False)
    observer.machine_outcome(body("c"), {}, machine_reconcile.Wait("WaitingForBootstrapData", "..."), False)
    observer.machine_outcome(body("d"), {"host": "kvm2"}, machine_reconcile.Wait("ImageNotFound", "...",
                                                                                 failure=True), False)
    observer.machine_outcome(body("e"), {"host": "kvm2"}, None, True)
    observer.machine_deleting("unit", "b", "kvm1")
    observer.machine_gone("unit", "e")
    assert value("capi_libvirt_reconcile_errors_total", kind="LibvirtMachine", reason="ImageNotFound") \
        == failed_before + 1
    with observer.phase("LibvirtMachine", "unit_phase"):
        pass
    assert value("capi_libvirt_reconcile_duration_seconds_count", kind="LibvirtMachine", phase="unit_phase") >= 1
    metrics.attach(source)
    try:
        assert value("capi_libvirt_machines", host="kvm1", phase="Provisioned") == 1
        assert value("capi_libvirt_machines", host="kvm1", phase="Deleting") == 1
        assert value("capi_libvirt_machines", host="", phase="Pending") == 1
        assert value("capi_libvirt_machines", host="kvm2", phase="Failed") == 1
        assert value("capi_libvirt_machines", host="kvm2", phase="Paused") == 0
        assert value("capi_libvirt_host_reachable", host="kvm1") == 1
        assert value("capi_libvirt_host_reachable", host="kvm2") == 0
        assert value("capi_libvirt_host_probe_slow", host="kvm1") == 1
        assert value("capi_libvirt_host_probe_slow", host="kvm2") == 0
        assert value("capi_libvirt_host_connections_opened_total", host="kvm1") == 2
        assert value("capi_libvirt_host_operations_total", host="kvm1") == 7
        assert value("capi_libvirt_leader") == 1
        assert value("capi_libvirt_watch_events_total", resource="machines", outcome="changed") == 4
        assert value("capi_libvirt_watch_events_total", resource="machines", outcome="unchanged") == 1
        assert [value("capi_libvirt_orphans", host="kvm1", state=state)
                for state in ("pending", "kept", "stray_volume")] == [2, 1, 3]
    finally:
        metrics.detach(source)
    assert value("capi_libvirt_host_reachable", host="kvm1") == 0  # gone with its operator
    removed_before = value("capi_libvirt_orphans_removed_total", host="kvm1", kind="volume")
    observer.orphans_removed("kvm1", 1, 2)
    assert value("capi_libvirt_orphans_removed_total", host="kvm1", kind="volume") == removed_before + 2


def test_a_standby_reports_no_machines_and_no_leadership(no_other_operator) -> None:
    observer, state = metrics.Observer(), election.State(ME)
    state.set_role(election.STANDBY)
    observer.machine_outcome(body("a"), {"host": "kvm1"}, None, False)
    source = fake_source(observer, state)
    metrics.attach(source)
    try:
        assert value("capi_libvirt_machines", host="kvm1", phase="Provisioned") == 0
        assert value("capi_libvirt_leader") == 0
    finally:
        metrics.detach(source)


@pytest.mark.parametrize("status, wait, paused, phase", [
    ({}, None, True, "Paused"),
    ({"host": "kvm1"}, None, False, "Provisioned"),
    ({"host": "kvm1"}, machine_reconcile.Wait("HostUnreachable", "", failure=True), False, "Failed"),
    ({"host": "kvm1"}, machine_reconcile.Wait("WaitingForAddress", ""), False, "Provisioning"),
    ({}, machine_reconcile.Wait("WaitingForOwner", ""), False, "Pending"),
])
def test_machine_phase(status, wait, paused, phase) -> None:
    assert metrics.machine_phase(status, wait, paused) == phase


# -- logs --------------------------------------------------------------------------------------------------------------

@pytest.fixture
def root_logger():
    """The root logger's handlers and level, restored after the test reconfigures them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs_are_one_object_per_line_naming_the_logger(root_logger, capsys) -> None:
    logs.configure(logs.JSON)
    logging.getLogger("capi_libvirt.unit").info("placed on host %s", "kvm1")
    [line] = [line for line in capsys.readouterr().err.splitlines() if "placed on host" in line]
    record = json.loads(line)
    assert record["message"] == "placed on host kvm1" and record["logger"] == "capi_libvirt.unit"
    assert record["severity"] == "info" and "timestamp" in record


def test_plain_logs_are_text(root_logger, capsys) -> None:
    logs.configure(logs.PLAIN)
    logging.getLogger("capi_libvirt.unit").warning("host %s unreachable", "kvm2")
    assert "WARNING capi_libvirt.unit: host kvm2 unreachable" in capsys.readouterr().err


def test_a_reconciles_fields_are_on_every_line_logged_inside_it(root_logger, capsys) -> None:
    logs.configure(logs.JSON)
    logger = logging.getLogger("capi_libvirt.unit")
    with logs.fields(machine="team-a/worker-1", reconcileID="abc123", host="kvm1", cluster=None):
        logger.info("placed on host %s", "kvm1")
        with logs.fields(host="kvm2"):
            logger.info("moved")
    logger.info("outside")
    records = {r["message"]: r for r in map(json.loads, capsys.readouterr().err.splitlines())
               if r["logger"] == "capi_libvirt.unit"}
    assert {k: records["placed on host kvm1"].get(k) for k in ("machine", "reconcileID", "host", "cluster")} == \
        {"machine": "team-a/worker-1", "reconcileID": "abc123", "host": "kvm1", "cluster": None}  # empty: left out
    assert records["moved"]["host"] == "kvm2" and records["moved"]["machine"] == "team-a/worker-1"
    assert "machine" not in records["outside"]


def test_in_text_the_fields_follow_the_message(root_logger, capsys) -> None:
    logs.configure(logs.PLAIN)
    with logs.fields(machine="team-a/worker-1", reconcileID="abc123"):
        logging.getLogger("capi_libvirt.unit").warning("host %s at 100%% of its memory", "kvm2")
        logging.getLogger("capi_libvirt.unit").warning("no args, 5% left")
    err = capsys.readouterr().err
    assert "host kvm2 at 100% of its memory [machine=team-a/worker-1 reconcileID=abc123]" in err
    assert "no args, 5% left [machine=team-a/worker-1 reconcileID=abc123]" in err


def test_libvirt_calls_are_timed_by_operation_and_outcome() -> None:
    """A host connection reports each call to its observer; libvirt's in-process test driver is the host."""
    from capi_libvirt.hypervisor import connection, errors

    seen: list[tuple[str, bool]] = []
    host = connection.HostConnection("unit", "qemu:///system", observe=lambda op, s, ok: seen.append((op, ok)))
    test_driver = libvirt.open("test:///default")
    host._live_connection = lambda: test_driver  # the product allows qemu URIs only

    def list_domains(conn) -> int:
        return len(conn.listAllDomains())

    def missing(conn) -> None:
        conn.lookupByName("no-such-domain")

    assert host._call_sync(list_domains, (), "list") >= 1
    with pytest.raises(errors.DomainNotFound):
        host._call_sync(missing, (), "look up")
    host.close()
    assert seen == [("list_domains", True), ("missing", False)]
    before = value("capi_libvirt_libvirt_call_duration_seconds_count", operation="unit_op", outcome="error")
    metrics.libvirt_call("unit_op", 0.2, False)
    assert value("capi_libvirt_libvirt_call_duration_seconds_count", operation="unit_op", outcome="error") == before + 1


def test_queue_metrics_and_build_info() -> None:
    queue = metrics.QueueMetrics("unit-queue")
    queue.added()
    queue.added()
    queue.started(1.5)
    queue.finished(0.25, retry=True)

    def of_queue(metric: str) -> float | None:
        return REGISTRY.get_sample_value(metric, {"name": "unit-queue"})
    assert of_queue("workqueue_depth") == 1 and of_queue("workqueue_adds_total") == 2
    assert of_queue("workqueue_queue_duration_seconds_sum") == 1.5
    assert of_queue("workqueue_work_duration_seconds_count") == 1 and of_queue("workqueue_retries_total") == 1
    from capi_libvirt import __version__
    assert value("capi_libvirt_build_info", version=__version__, python_version=platform.python_version()) == 1
    metrics.api_request("GET", "200")
    assert value("capi_libvirt_rest_client_requests_total", method="GET", code="200") >= 1
