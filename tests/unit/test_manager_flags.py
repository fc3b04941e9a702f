"""The manager takes the flags every Cluster API manager takes, as the Cluster API Operator writes them into the
Deployment from an InfrastructureProvider's spec.manager, beside its own (kept as the old names)."""

from __future__ import annotations

import pytest

from capi_libvirt import __version__, cli
from capi_libvirt.operator import logs

pytestmark = pytest.mark.unit


def parse(*args: str):
    return cli.parser().parse_args(["run", *args])


def test_the_flags_cluster_api_managers_share_are_taken():
    args = parse("--leader-elect", "--metrics-bind-addr=:8443", "--health-addr=:9440", "--v=4",
                 "--libvirtmachine-concurrency=8", "--logging-format=text")
    assert (args.metrics_address, args.health_address, args.workers, args.log_format, args.v) == \
        (":8443", ":9440", 8, logs.PLAIN, 4)
    assert cli.election_lease(args).name == "capi-libvirt-leader-election"


def test_leader_election_can_be_turned_off_as_cluster_api_does():
    assert cli.election_lease(parse("--leader-elect=false")) is None
    assert cli.election_lease(parse("--leader-elect=true", "--leader-election-id=other")).name == "other"
    assert cli.election_lease(parse("--standalone")) is None
    with pytest.raises(SystemExit):
        parse("--leader-elect=maybe")


def test_the_old_names_still_work():
    args = parse("--metrics-address=:1", "--health-address=:2", "--workers=3", "--log-format=json")
    assert (args.metrics_address, args.health_address, args.workers, args.log_format) == (":1", ":2", 3, logs.JSON)


def test_verbosity_and_version(capsys):
    assert parse("-v").run_verbose and parse("--v=0").v == 0
    with pytest.raises(SystemExit) as ended:
        cli.parser().parse_args(["--version"])
    assert ended.value.code == 0 and __version__ in capsys.readouterr().out


def test_what_the_cluster_api_operator_writes_from_spec_manager_is_taken():
    """The Operator's arguments (its deployment customization): --key=value each, the Lease as NAMESPACE/NAME."""
    args = parse("--leader-elect=true", "--leader-election-id=capi-libvirt-system/my-lease",
                 "--leader-elect-lease-duration=30s", "--leader-elect-renew-deadline=20s",
                 "--leader-elect-retry-period=5s", "--libvirtmachine-concurrency=12", "--max-concurrent-reconciles=9",
                 "--namespace=team-a", "--health-addr=:9440", "--metrics-bind-addr=:8443", "--sync-period=300s",
                 "--v=2", "--feature-gates=", "--webhook-port=9443", "--webhook-cert-dir=/tmp/k8s-webhook-server",
                 "--profiler-address=localhost:6060")
    lease = cli.election_lease(args)
    assert (lease.namespace, lease.name, lease.duration_s, lease.renew_deadline_s, lease.retry_period_s) == \
        ("capi-libvirt-system", "my-lease", 30.0, 20.0, 5.0)
    assert (args.workers, args.namespace, args.sync_period_s, args.feature_gates) == (9, ["team-a"], 300.0, {})
    assert (cli.run_config(args).workers, cli.run_config(args).sync_period_s) == (9, 300.0)


def test_unknown_feature_gates_are_refused_as_cluster_apis_managers_refuse_them(capsys):
    with pytest.raises(SystemExit):
        parse("--feature-gates=MachinePool=true")
    assert "unrecognized feature gate 'MachinePool'" in capsys.readouterr().err


def test_diagnostics_address_only_with_insecure_diagnostics(capsys):
    assert cli.manager_config(parse("--diagnostics-address=:8443", "--insecure-diagnostics")).served_metrics_address() == ":8443"
    assert cli.manager_config(parse("--metrics-bind-addr=:9000")).served_metrics_address() == ":9000"
    with pytest.raises(ValueError, match="authenticated HTTPS metrics"):
        cli.manager_config(parse("--diagnostics-address=:8443")).served_metrics_address()
    assert cli.main(["run", "--diagnostics-address=:8443", "--health-addr=0"]) == 2


def test_the_watch_filter_reaches_the_configuration():
    from capi_libvirt.operator import config

    assert parse("--watch-filter=team-a").watch_filter == "team-a"
    assert config.from_arguments({"watch_filter": "team-a"}).watch_filter == "team-a"
    assert cli.run_config(parse("--watch-filter=team-a")).watch_filter == "team-a"
    assert cli.run_config(parse("--watch-filter=")).watch_filter is None  # empty: every object


def test_the_api_clients_rate_is_limited_as_client_gos_token_bucket():
    from capi_libvirt.kube import client

    now = [0.0]
    limit = client.RateLimit(qps=10, burst=3, clock=lambda: now[0])
    assert [limit.delay() for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst goes at once
    assert limit.delay() == pytest.approx(0.1)  # then one every 1/qps seconds
    assert limit.delay() == pytest.approx(0.2)
    now[0] = 10.0  # idle: the bucket refills to the burst, no more
    assert [limit.delay() for _ in range(3)] == [0.0, 0.0, 0.0] and limit.delay() > 0
    args = parse("--kube-api-qps=20", "--kube-api-burst=30")
    assert (args.kube_api_qps, args.kube_api_burst) == (20.0, 30)
    assert cli.run_config(parse()).kube_api_qps is None  # not limited unless asked
    with pytest.raises(ValueError):
        client.RateLimit(qps=0, burst=1)
    with pytest.raises(SystemExit):
        parse("--kube-api-qps=0")


async def test_a_limited_client_waits_its_turn(monkeypatch):
    from capi_libvirt.kube import client

    now, slept = [0.0], []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
    monkeypatch.setattr(client.asyncio, "sleep", sleep)
    limit = client.RateLimit(qps=50, burst=1, clock=lambda: now[0])
    for _ in range(3):
        await limit.wait()
    assert slept == [pytest.approx(0.02), pytest.approx(0.02)]  # after the burst of one, 1/50 s each


def test_a_setting_comes_from_its_flag_else_its_environment_variable_else_its_default(monkeypatch):
    """Each setting of the operator is one field of operator.config.OperatorConfig: its default, its flags, its help
    and its environment variable spelled there once, the command line made from them."""
    from capi_libvirt.operator import config

    monkeypatch.setenv(config.ORPHAN_GRACE_ENV, "never")
    monkeypatch.setenv(config.MANAGEMENT_CLUSTER_ENV, "from-env")
    assert cli.run_config(parse()).orphan_grace_s is None  # the environment, no flag given
    assert cli.run_config(parse("--orphan-grace-period=60")).orphan_grace_s == 60.0  # the flag wins
    assert cli.run_config(parse()).management_cluster_id == "from-env"
    monkeypatch.setenv(config.MANAGEMENT_CLUSTER_ENV, "<x/>")
    with pytest.raises(ValueError, match="management cluster id"):
        cli.run_config(parse())  # a bad value in the environment is refused by the same rule as the flag's
    monkeypatch.delenv(config.MANAGEMENT_CLUSTER_ENV)
    monkeypatch.delenv(config.ORPHAN_GRACE_ENV)
    defaults = config.OperatorConfig(hosts={})
    built = config.from_arguments({})
    for name, setting, default in config.settings():
        assert getattr(defaults, name) == default
        if setting.env is None:
            assert getattr(built, name) == default, name
        option = next(action for action in cli.parser()._subparsers._group_actions[0].choices["run"]._actions
                      if action.dest == name)
        assert tuple(option.option_strings) == setting.names and "{default}" not in (option.help or "")
