"""The book's reference pages match the code, and the catalogues they come from are complete: every reason the code
writes is in api/reasons.py (and spelled only there), every environment variable it reads is in operator/config.py."""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest

from capi_libvirt.api import reasons
from capi_libvirt.operator import config

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "capi_libvirt"
CATALOGUE = PACKAGE / "api" / "reasons.py"
# Words that are reasons' names too, but mean something else where they are written: printer columns' titles, and
# the machine phases of the capi_libvirt_machines metric (Cluster API's Machine phases).
NOT_REASONS = {("api/kinds.py", "Provisioned"), ("api/kinds.py", "Reachable"), ("operator/metrics.py", "Paused"),
               ("operator/metrics.py", "Provisioned"), ("operator/metrics.py", "Deleting")}


def _reference_module():
    spec = importlib.util.spec_from_file_location("reference", ROOT / "hack" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources() -> list[tuple[pathlib.Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))]


def test_the_committed_reference_pages_are_what_the_code_says():
    reference = _reference_module()
    stale = reference.differences(reference.DEFAULT_DIR)
    assert not stale, f"run `make reference`: {stale} differ from the code"


def test_the_generator_notices_a_page_that_drifted(tmp_path):
    reference = _reference_module()
    for name, page in reference.PAGES.items():
        (tmp_path / name).write_text(page())
    assert reference.differences(tmp_path) == []
    (tmp_path / "conditions.md").write_text((tmp_path / "conditions.md").read_text().replace("QuotaExceeded", "Quota"))
    (tmp_path / "flags.md").unlink()
    assert reference.differences(tmp_path) == ["conditions.md", "flags.md"]


def test_every_reason_is_catalogued_once_and_spelled_only_in_the_catalogue():
    names = [reason.name for reason in reasons.REASONS]
    assert len(names) == len(set(names)), "a reason is catalogued twice"
    catalogued = set(names) | {t.name for t in reasons.CONDITION_TYPES}
    spelled_elsewhere = []
    for path, tree in _sources():
        if path == CATALOGUE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in catalogued and node.value != "Ready" \
                    and (str(path.relative_to(PACKAGE)), node.value) not in NOT_REASONS:
                # "Ready" is also Cluster API's and the IPAM claims' own condition type, read from their objects
                spelled_elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not spelled_elsewhere, "take these from capi_libvirt.api.reasons:\n" + "\n".join(spelled_elsewhere)


def test_events_are_posted_with_catalogued_reasons_only():
    """A reason written as a literal would escape the check above by being new: every event call names a constant."""
    literal_reasons = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")).endswith("event"):
                for argument in node.args:
                    if isinstance(argument, ast.Constant) and isinstance(argument.value, str) \
                            and argument.value[:1].isupper() and argument.value not in ("Normal", "Warning"):
                        literal_reasons.append(f"{path.relative_to(ROOT)}:{node.lineno}: {argument.value!r}")
    assert not literal_reasons, "add these to capi_libvirt.api.reasons:\n" + "\n".join(literal_reasons)


def test_every_catalogued_reason_is_written_somewhere():
    used: set[str] = set()
    for path, tree in _sources():
        if path != CATALOGUE:
            used |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name) and node.value.id == "reasons"}
    constants = {name for name, value in vars(reasons).items() if name.isupper() and isinstance(value, str)
                 and value in {r.name for r in reasons.REASONS}}
    unused = sorted(constants - used)
    assert not unused, f"catalogued but never written (remove them, or the code lost a reason): {unused}"


def test_every_environment_variable_the_code_reads_is_catalogued():
    catalogued = {variable.name for variable in config.ENVIRONMENT}
    read = set()
    for _path, tree in _sources():
        constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                     and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                     for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                key = node.slice
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
                key = node.args[0]
            if isinstance(key, ast.Constant):
                read.add(key.value)
            elif isinstance(key, ast.Name):
                read.add(constants.get(key.id, getattr(config, key.id, key.id)))
            elif isinstance(key, ast.Attribute) and key.attr == "env":  # a setting's Flag: every variable they name
                read |= {flag.env for _name, flag, _default in config.settings() if flag.env}
            elif isinstance(key, ast.Attribute):
                read.add(getattr(config, key.attr, key.attr))
    assert read, "found no environment reads: the scan is broken"
    assert read <= catalogued, f"read but not in operator.config.ENVIRONMENT: {sorted(read - catalogued)}"
