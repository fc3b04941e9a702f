"""Test bed wiring: tier markers are mandatory, the fixtures of the real parts are loaded as plugins, the timing report
(tests/timing_report.py) is on, and under pytest-xdist (`make test` runs `-n 2`) each module runs
whole on one worker, with every module that boots Linux guests on the same one, so that never more than two such
guests boot at once on 2 cores while the other worker runs the API-server and iPXE tiers beside them. The group starts
first, and the whole cluster (the heaviest module: up to three VMs, one of 2 vCPUs) comes last in it, when the other
worker has run out of modules: its control plane has the 2 cores to itself."""

from __future__ import annotations

import pathlib

import pytest

pytest_plugins = ["fixtures_libvirt", "fixtures_control_plane", "fixtures_capi", "timing_report"]

TIERS = ("unit", "integration", "e2e")

# The modules that boot guests of the cached Linux images (the node image, the minimal image): one xdist group, so
# one worker runs them one after the other (each boots at most two guests at once). iPXE guests cost almost nothing
# and stay out of it (chaos, host outages, the integration tier).
LINUX_GUEST_MODULES = frozenset({
    "test_autoscaler", "test_bridged_addresses", "test_clusterctl_init", "test_clusterctl_move", "test_guest_boot",
    "test_ipam_pools", "test_kubeadm_join", "test_machine_crash_consistency", "test_machine_lifecycle",
    "test_machine_shape", "test_move_adoption", "test_operator_image", "test_remote_hosts", "test_whole_cluster",
})
LINUX_GUESTS_GROUP = "linux-guests"
# Scheduled first: the Linux guests' group (about 32 minutes), the run's critical path; everything else fills in on the
# other worker. Inside the group, the whole cluster comes last. On its own worker beside the group (CI at 51c42f1 and
# 8fb79cc), and first in the group beside the API-server tier (6c404fb), its control-plane VM's API server was
# starved: kubeadm init took 400-800 s instead of 124 s and failed on 10-second request timeouts.
FIRST_SCOPES = (LINUX_GUESTS_GROUP,)
LAST_IN_GROUP = "test_whole_cluster"


def xdist_scope(nodeid: str) -> str:
    """The unit of work a worker takes whole: the Linux guests' group, or the test's module."""
    module = nodeid.split("::", 1)[0]
    return LINUX_GUESTS_GROUP if pathlib.PurePath(module).stem in LINUX_GUEST_MODULES else module


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


def first_scopes_first(nodeid: str) -> tuple[int, bool]:
    """The sort key that puts FIRST_SCOPES at the head of the collection, in their order, and LAST_IN_GROUP at the
    end of the group; the rest keep theirs."""
    scope = xdist_scope(nodeid)
    name = scope if scope == LINUX_GUESTS_GROUP else pathlib.PurePath(scope).stem
    module = pathlib.PurePath(nodeid.split("::", 1)[0]).stem
    return (FIRST_SCOPES.index(name) if name in FIRST_SCOPES else len(FIRST_SCOPES), module == LAST_IN_GROUP)


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
