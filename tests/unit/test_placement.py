"""Placement: pinned hosts, failure domains, room after overcommit, spreading a group, least loaded, determinism."""

from __future__ import annotations

import dataclasses

import pytest

from capi_libvirt.api import reasons
from capi_libvirt.core.placement import HostLoad, NoHost, Placed, Request, choose_host

pytestmark = pytest.mark.unit


def host(name: str, **fields) -> HostLoad:
    return HostLoad(**{"name": name, "healthy": True, "cpus": 8, "memory_mib": 16384, **fields})


SMALL = Request(cpus=2, memory_mib=2048)


def test_pinned_host_is_taken_when_healthy_with_room():
    assert choose_host(dataclasses.replace(SMALL, pinned_host="b"), [host("a"), host("b", failure_domain="fd2")]) \
        == Placed("b", "fd2")


@pytest.mark.parametrize(("hosts", "reason"), [
    ([host("a")], reasons.HOST_NOT_FOUND),
    ([host("b", healthy=False)], reasons.HOST_UNREACHABLE),
    ([host("b", allocated_memory_mib=16000)], reasons.INSUFFICIENT_CAPACITY),
    ([host("b", decommissioned=True)], reasons.HOST_DECOMMISSIONED),
])
def test_pinned_host_that_cannot_take_the_machine_says_why(hosts, reason):
    result = choose_host(dataclasses.replace(SMALL, pinned_host="b"), hosts)
    assert isinstance(result, NoHost) and result.reason == reason and "b" in result.message


def test_least_loaded_by_free_memory_wins():
    hosts = [host("a", allocated_memory_mib=8192), host("b", allocated_memory_mib=1024), host("c", memory_mib=8192)]
    assert choose_host(SMALL, hosts) == Placed("b", None)


def test_unhealthy_hosts_are_never_chosen():
    assert choose_host(SMALL, [host("a", healthy=False, memory_mib=65536), host("b")]) == Placed("b", None)


def test_overcommit_decides_what_fits():
    tight = host("a", cpus=2, cpu_overcommit=1.0, allocated_cpus=1)
    assert isinstance(choose_host(SMALL, [tight]), NoHost)
    assert choose_host(SMALL, [dataclasses.replace(tight, cpu_overcommit=2.0)]) == Placed("a", None)
    over_memory = host("a", memory_mib=2048, allocated_memory_mib=1024, memory_overcommit=1.5)
    assert choose_host(SMALL, [over_memory]) == Placed("a", None)


def test_no_room_anywhere_gives_the_numbers():
    result = choose_host(Request(cpus=64, memory_mib=2048), [host("a"), host("b")])
    assert isinstance(result, NoHost) and result.reason == reasons.INSUFFICIENT_CAPACITY
    assert "64 vCPU" in result.message and "a: 32 vCPU" in result.message and "b: 32 vCPU" in result.message


def test_requested_failure_domain_is_honoured():
    hosts = [host("a", failure_domain="fd1", memory_mib=65536), host("b", failure_domain="fd2")]
    assert choose_host(dataclasses.replace(SMALL, failure_domain="fd2"), hosts) == Placed("b", "fd2")
    result = choose_host(dataclasses.replace(SMALL, failure_domain="fd9"), hosts)
    assert isinstance(result, NoHost) and result.reason == reasons.NO_HOST_IN_FAILURE_DOMAIN


def test_a_group_spreads_over_failure_domains_then_hosts():
    hosts = [host("a1", failure_domain="fd1", memory_mib=65536), host("a2", failure_domain="fd1", memory_mib=65536),
             host("b1", failure_domain="fd2")]
    # fd1 already holds one machine of the group: the next goes to fd2, though a1 and a2 have more free memory.
    assert choose_host(SMALL, hosts, {"a1": 1}) == Placed("b1", "fd2")
    # Balanced domains: the host with fewer of the group, then the most free memory.
    assert choose_host(SMALL, hosts, {"a1": 1, "b1": 1}) == Placed("a2", "fd1")


def test_a_burst_spreads_when_each_placement_counts_the_ones_before_it():
    hosts = {name: host(name) for name in ("a", "b", "c")}
    counts: dict[str, int] = {}
    for _ in range(6):
        chosen = choose_host(SMALL, list(hosts.values()), counts)
        assert isinstance(chosen, Placed)
        counts[chosen.host] = counts.get(chosen.host, 0) + 1
        hosts[chosen.host] = dataclasses.replace(hosts[chosen.host],
                                                 allocated_memory_mib=hosts[chosen.host].allocated_memory_mib + 2048,
                                                 allocated_cpus=hosts[chosen.host].allocated_cpus + 2)
    assert counts == {"a": 2, "b": 2, "c": 2}


def test_same_inputs_same_host():
    hosts = [host("b"), host("a"), host("c")]
    assert {choose_host(SMALL, hosts).host for _ in range(5)} == {"a"}


def test_a_decommissioned_host_is_never_chosen_even_when_it_looks_healthy_and_emptiest():
    hosts = [host("a", decommissioned=True), host("b", allocated_memory_mib=8192)]
    assert choose_host(SMALL, hosts) == Placed("b", None)
    result = choose_host(SMALL, [host("a", decommissioned=True)])
    assert isinstance(result, NoHost) and result.reason == reasons.HOST_UNREACHABLE


# -- decommissioned hosts and tenant refusals together (the outage and tenancy work merged) ---------------------------

def test_a_pinned_host_that_refuses_is_tenant_not_allowed_before_it_is_decommissioned():
    """A tenant learns nothing more of a host it may not use: the refusal comes first."""
    pinned = Request(cpus=1, memory_mib=1024, pinned_host="b")
    result = choose_host(pinned, [host("b", decommissioned=True, refusal="host b does not allow namespace t")])
    assert isinstance(result, NoHost) and result.reason == reasons.TENANT_NOT_ALLOWED
    result = choose_host(pinned, [host("b", decommissioned=True)])
    assert isinstance(result, NoHost) and result.reason == reasons.HOST_DECOMMISSIONED


def test_candidates_exclude_decommissioned_and_refusing_hosts():
    hosts = [host("a", decommissioned=True), host("b", refusal="no b"), host("c", allocated_memory_mib=8192)]
    assert choose_host(SMALL, hosts) == Placed("c", None)


def test_a_decommissioned_host_that_would_allow_the_machine_does_not_hide_the_refusals():
    result = choose_host(SMALL, [host("a", decommissioned=True), host("b", refusal="no b")])
    assert isinstance(result, NoHost) and result.reason == reasons.TENANT_NOT_ALLOWED
    assert result.message == "no host allows this machine: no b"


def test_a_decommissioned_host_is_not_named_among_the_refusals():
    result = choose_host(SMALL, [host("a", decommissioned=True, refusal="no a"), host("b", refusal="no b")])
    assert isinstance(result, NoHost) and result.reason == reasons.TENANT_NOT_ALLOWED and "no a" not in result.message
