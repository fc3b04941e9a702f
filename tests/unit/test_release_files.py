"""The release's files that do not need a cluster: the committed cluster templates match the code, and metadata.yaml
lists every release series (clusterctl upgrade looks up both the installed release's series and the new one's)."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from capi_libvirt import __version__, cli
from capi_libvirt.api import release

pytestmark = pytest.mark.unit

TEMPLATES = pathlib.Path(__file__).resolve().parents[2] / "templates"


def test_the_committed_templates_are_what_the_code_renders(capsys):
    assert cli.main(["templates", "--dir", str(TEMPLATES), "--check"]) == 0, capsys.readouterr().out
    assert sorted(path.name for path in TEMPLATES.glob("*.yaml")) == sorted(release.rendered_templates())


def test_a_drifted_or_stray_template_is_reported(tmp_path, capsys):
    assert cli.main(["templates", "--dir", str(tmp_path)]) == 0
    assert cli.main(["templates", "--dir", str(tmp_path), "--check"]) == 0
    edited = tmp_path / "cluster-template.yaml"
    edited.write_text(edited.read_text().replace("replicas", "replica"))
    (tmp_path / "cluster-template-old.yaml").write_text("{}\n")
    capsys.readouterr()
    assert cli.main(["templates", "--dir", str(tmp_path), "--check"]) == 1
    assert "cluster-template-old.yaml, cluster-template.yaml" in capsys.readouterr().out
    assert cli.main(["templates", "--dir", str(tmp_path)]) == 0
    assert not (tmp_path / "cluster-template-old.yaml").exists()


def test_metadata_lists_every_series_up_to_the_release():
    series = ((0, 1, "v1beta2"), (0, 2, "v1beta2"), (1, 0, "v1beta2"))
    assert release.metadata("v0.2.3", series)["releaseSeries"] == [
        {"major": 0, "minor": 1, "contract": "v1beta2"}, {"major": 0, "minor": 2, "contract": "v1beta2"}]
    assert len(release.metadata("v1.0.0", series)["releaseSeries"]) == 3
    with pytest.raises(release.ReleaseError, match="v0.3 is not in"):
        release.metadata("v0.3.0", series)


def test_this_release_series_is_listed():
    major, minor = release.parse_version(f"v{__version__}")
    assert (major, minor) in {(s_major, s_minor) for s_major, s_minor, _ in release.RELEASE_SERIES}


def test_the_manager_runs_on_control_plane_nodes_as_cluster_apis_managers_do():
    """A management cluster of control-plane nodes alone (kind's default) schedules the manager."""
    documents = yaml.safe_load_all((TEMPLATES.parent / "config" / "manager" / "manager.yaml").read_text())
    [deployment] = [d for d in documents if d and d["kind"] == "Deployment"]
    assert {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"} in \
        deployment["spec"]["template"]["spec"]["tolerations"]
    [manager] = deployment["spec"]["template"]["spec"]["containers"]
    assert manager["args"][:2] == ["run", "--leader-elect"]  # Cluster API's flags, as the Operator writes them
