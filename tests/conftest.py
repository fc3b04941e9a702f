"""Test bed wiring: tier markers are mandatory, the fixtures of the real parts are loaded as plugins, the timing report
(tests/timing_report.py) is on, and under pytest-xdist (`make test` runs `-n 2`) each module runs whole on one worker.
Linux guests (1 vCPU each under TCG) are held to what 2 cores carry by guest slots (tests/guest_slots.py) that every
module booting them takes for its run, on whichever worker. The modules that boot two at once run first, as one group
on one worker, beside the API-server and iPXE tiers on the other; the modules that boot one at a time come last, as
modules of their own, so both workers share them once the rest is done. (The whole cluster is not among them in
`make test`: the Makefile runs it after them, alone.)"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Iterator

import pytest

import guest_slots
from devenv.libvirt_host import LibvirtHost

# The test bed's own API client (kubernetes_asyncio; the product has its own, kube/client.py) logs every response body
# at DEBUG, Secrets (host keys, bootstrap data) included. Tests that gather every log line of their process at DEBUG
# to prove the operator never logs a credential (test_many_hosts, ...) would find the test bed's own reads there.
logging.getLogger("kubernetes_asyncio.client.rest").setLevel(logging.INFO)

pytest_plugins = ["fixtures_libvirt", "fixtures_control_plane", "fixtures_capi", "timing_report"]

TIERS = ("unit", "integration", "e2e")

# The modules that boot guests of the cached Linux images (the node image, the minimal image), with the most they run
# at once: each holds that many guest slots for its run. iPXE guests cost almost nothing and are not counted (chaos,
# host outages, the Cluster API Operator's machine, the integration tier).
LINUX_GUEST_MODULES = {
    "test_autoscaler": 2, "test_bridged_addresses": 2, "test_remote_hosts": 2,
    "test_whole_cluster": 2, "test_control_plane_rollout": 2, "test_clusterctl_move": 1,
    "test_clusterctl_init": 1, "test_guest_boot": 1, "test_ipam_pools": 1, "test_machine_crash_consistency": 1,
    "test_machine_lifecycle": 1, "test_machine_shape": 1, "test_operator_image": 1, "test_no_spoofing": 1,
    "test_newer_libvirt": 1,
}
# Run one after the other on one worker, first, in this order: the modules that take both slots (another worker's
# Linux module would only wait for them), then the clusterctl move bed (one node guest, 270 s), then the whole cluster
# (only in a run that names it with the rest: `make test` runs it after them, alone, in a pytest process of its own),
# then the control-plane rollout (`make test` leaves it out; `make test-control-plane-rollout` runs it alone).
# At 63de215, in alphabetical order, the move bed came between two-guest modules and the other worker, done with its
# own modules, waited 5 minutes for slots.
LINUX_GUESTS_GROUP = "linux-guests"
LINUX_GROUP_ORDER = ("test_autoscaler", "test_remote_hosts", "test_bridged_addresses",
                     "test_clusterctl_move", "test_whole_cluster", "test_control_plane_rollout")
# Scheduled first: the group, the run's critical path; everything else fills in on the other worker, and the
# one-guest modules come last, for whichever worker is free. On its own worker beside the group (CI at 51c42f1 and
# 8fb79cc), and first in the group beside the API-server tier (6c404fb), the whole cluster's control-plane VM's API
# server was starved: kubeadm init took 400-800 s instead of 124 s and failed on 10-second request timeouts.
FIRST_SCOPES = (LINUX_GUESTS_GROUP,)


def xdist_scope(nodeid: str) -> str:
    """The unit of work a worker takes whole: the Linux guests' group, or the test's module."""
    module = nodeid.split("::", 1)[0]
    return LINUX_GUESTS_GROUP if pathlib.PurePath(module).stem in LINUX_GROUP_ORDER else module


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown to a pytest run without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scope scheduling, with xdist_scope as the scope: whole modules, and one group of the modules
    that boot Linux guests. (Its loadgroup mode, which marks would drive, no longer groups under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection's order (FIRST_SCOPES first), not the largest scope first

    class ModulesAndLinuxGuests(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ModulesAndLinuxGuests(config, log)


def first_scopes_first(nodeid: str) -> tuple[int, int]:
    """The sort key that puts FIRST_SCOPES at the head of the collection, in their order (the group's modules in
    LINUX_GROUP_ORDER), and the Linux guest modules outside the group at the end of the collection; the rest keep
    theirs."""
    scope = xdist_scope(nodeid)
    name = scope if scope == LINUX_GUESTS_GROUP else pathlib.PurePath(scope).stem
    module = pathlib.PurePath(nodeid.split("::", 1)[0]).stem
    rank = FIRST_SCOPES.index(name) if name in FIRST_SCOPES else len(FIRST_SCOPES) + (module in LINUX_GUEST_MODULES)
    return (rank, LINUX_GROUP_ORDER.index(module) if module in LINUX_GROUP_ORDER else 0)


@pytest.fixture(autouse=True)
def apparmor_profiles_allow_each_domains_files() -> Iterator[None]:
    """After each test: every domain started on this process's libvirt hosts meanwhile had an AppArmor profile, made
    as Ubuntu's libvirtd makes it, that allows each file it names and each host file its QEMU held
    (devenv.apparmor_check); a profile that could not be made failed the domain's start already."""
    yield
    found = LibvirtHost.take_profile_findings()
    assert not found, "AppArmor profiles that miss files:\n" + "\n".join(found)


@pytest.fixture(scope="module", autouse=True)
def linux_guest_slots(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module that boots Linux guests holds its guest slots (tests/guest_slots.py) from before its first fixture
    to after its last teardown."""
    module = pathlib.PurePath(str(request.path)).stem
    count = LINUX_GUEST_MODULES.get(module, 0)
    if not count:
        yield
        return
    with guest_slots.linux_guest_slots(count, module):
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test belongs to exactly one tier, so `make test-fast` and `make test` select what they claim; the
    collection starts with FIRST_SCOPES (a stable sort: modules stay whole and in order)."""
    for item in items:
        tiers = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: mark it with exactly one of {TIERS}, not {tiers}")
    items.sort(key=lambda item: first_scopes_first(item.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The hostile-input count (tests/hostile_inputs.py): how many generated inputs each tier ran, and how they ended."""
    from hostile_inputs import COUNTS

    if not COUNTS:
        return
    admission = sum(n for what, n in COUNTS.items() if what.startswith("admission: ") and what.endswith("s"))
    unit = sum(n for what, n in COUNTS.items() if what.startswith("unit: "))
    terminalreporter.section("hostile input (Hypothesis, derandomized)")
    terminalreporter.write_line(
        f"{admission} generated specs and bootstrap Secrets through admission on the real API server; "
        f"{COUNTS['reconcile: cases on libvirtd']} sampled cases through the reconcile on a real libvirtd; "
        f"{unit} examples through the pure core")
    for what, n in sorted(COUNTS.items()):
        terminalreporter.write_line(f"  {what}: {n}")
