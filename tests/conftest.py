"""Test bed wiring: tier markers are mandatory, and the fixtures of the real parts are loaded as plugins."""

from __future__ import annotations

import pytest

pytest_plugins = ["fixtures_libvirt", "fixtures_control_plane", "fixtures_capi"]

TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test belongs to exactly one tier, so `make test-fast` and `make test` select what they claim."""
    for item in items:
        tiers = [tier for tier in TIERS if item.get_closest_marker(tier)]
        if len(tiers) != 1:
            raise pytest.UsageError(f"{item.nodeid}: mark it with exactly one of {TIERS}, not {tiers}")


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
