"""How the test bed reacts to a missing prerequisite: a failure in CI (CI=true), a skip that names it elsewhere."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(available: bool, what: str) -> None:
    """Stop the test when `what` is missing: fail in CI (never a silent skip there), skip with its name locally."""
    if available:
        return
    message = f"missing prerequisite: {what} (run `make test`, which installs it)"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
