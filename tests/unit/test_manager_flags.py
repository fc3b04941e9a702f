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
