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
