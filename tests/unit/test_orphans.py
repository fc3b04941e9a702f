"""The orphan decision (core.orphans): only a domain this management cluster provably made, that no LibvirtMachine
here claims, is an orphan; its volumes go only when they are provably its own. Everything else is kept."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET

import pytest

from capi_libvirt.core import domain_owner, domain_xml_edits, naming, orphans, provider_id
from capi_libvirt.core.domain_owner import Owner
from capi_libvirt.core.orphans import Claims, HostDomain, Verdict

pytestmark = pytest.mark.unit

ME, OTHER = "1f0c3b0e-0000-4000-8000-00000000000a", "2e0c3b0e-0000-4000-8000-00000000000b"
POOL = "/var/lib/libvirt/images"


def ours(name: str = "m0", namespace: str = "ns", management: str | None = ME, uid: str | None = None,
         extra_paths: tuple[str, ...] = ()) -> HostDomain:
    uid = uid or str(uuid.uuid4())
    owner = Owner(namespace=namespace, name=name, uid=uid, cluster="c", management_cluster=management)
    paths = {f"{POOL}/{naming.overlay_volume_name(namespace, name, uid)}",
             f"{POOL}/{naming.nocloud_volume_name(namespace, name, uid)}",
             f"{POOL}/{naming.serial_log_file_name(namespace, name, uid)}", *extra_paths}
    return HostDomain(uuid=naming.domain_uuid(uid), name=naming.domain_name(namespace, name, uid), owner=owner,
                      paths=frozenset(paths))


def machine(namespace: str, name: str, uid: str, *, identity: str | None = None, placed: bool = True) -> dict:
    body: dict = {"metadata": {"namespace": namespace, "name": name, "uid": uid, "annotations": {}}, "spec": {}}
    if placed:
        body["spec"]["providerID"] = provider_id.format_provider_id("kvm1", naming.domain_uuid(identity or uid))
        body["metadata"]["finalizers"] = ["libvirtmachine.infrastructure.cluster.x-k8s.io"]
    if identity:
        body["metadata"]["annotations"][naming.IDENTITY_ANNOTATION] = identity
    return body


def test_a_domain_of_this_management_cluster_with_no_machine_is_an_orphan() -> None:
    domain = ours()
    assert orphans.classify(domain, ME, orphans.claims_of([])) is Verdict.ORPHAN


def test_a_machine_claims_its_domain_by_uid() -> None:
    domain = ours()
    assert domain.owner is not None
    claims = orphans.claims_of([machine("ns", "m0", domain.owner.uid)])
    assert orphans.classify(domain, ME, claims) is Verdict.CLAIMED


def test_a_moved_copy_claims_by_identity_not_only_by_metadata_uid() -> None:
    domain = ours(name="moved")
    assert domain.owner is not None
    copy = machine("other-ns", "renamed", str(uuid.uuid4()), identity=domain.owner.uid)
    assert orphans.classify(domain, ME, orphans.claims_of([copy])) is Verdict.CLAIMED


def test_a_copy_without_the_identity_annotation_claims_by_its_provider_id() -> None:
    domain = ours(name="old")
    assert domain.owner is not None
    copy = machine("x", "y", str(uuid.uuid4()))
    copy["spec"]["providerID"] = provider_id.format_provider_id("kvm1", domain.uuid)
    assert orphans.classify(domain, ME, orphans.claims_of([copy])) is Verdict.CLAIMED


def test_a_machine_being_created_claims_by_namespace_and_name() -> None:
    domain = ours(name="fresh")
    not_placed = machine("ns", "fresh", str(uuid.uuid4()), placed=False)
    assert orphans.classify(domain, ME, orphans.claims_of([not_placed])) is Verdict.CLAIMED


@pytest.mark.parametrize("paused", [{"spec": {"paused": True}},
                                    {"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}}])
def test_an_orphan_of_a_paused_cluster_is_kept(paused: dict) -> None:
    cluster = {"spec": paused.get("spec", {}), "metadata": {"namespace": "ns", "name": "c", **paused.get("metadata", {})}}
    claims = orphans.claims_of([], clusters=[cluster])
    assert orphans.classify(ours(), ME, claims) is Verdict.PAUSED
    assert orphans.classify(ours(namespace="other"), ME, claims) is Verdict.ORPHAN  # another namespace's "c"
    running = {"metadata": {"namespace": "ns", "name": "c"}, "spec": {"paused": False}}
    assert orphans.classify(ours(), ME, orphans.claims_of([], clusters=[running])) is Verdict.ORPHAN


def test_another_management_clusters_domain_is_kept() -> None:
    assert orphans.classify(ours(management=OTHER), ME, orphans.claims_of([])) is Verdict.OTHER_MANAGEMENT_CLUSTER


def test_a_domain_without_management_cluster_proof_is_kept() -> None:
    assert orphans.classify(ours(management=None), ME, orphans.claims_of([])) is Verdict.NO_PROOF


def test_a_domain_moved_away_by_clusterctl_is_kept() -> None:
    domain = ours()
    assert domain.owner is not None
    assert orphans.classify(domain, ME, orphans.claims_of([], moved_away=[domain.owner.uid])) is Verdict.MOVED_AWAY


def test_a_machine_moved_a_second_time_is_known_as_moved_away_by_its_domain_uuid() -> None:
    """clusterctl replaces the annotation map with its delete-for-move one: a copy adopted earlier (its UID is not its
    identity) loses the identity annotation, and only the domain UUID of its providerID still names its domain."""
    domain = ours()
    assert domain.owner is not None
    deleted = machine("ns", "m0", str(uuid.uuid4()), identity=domain.owner.uid)
    deleted["metadata"]["annotations"] = {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}
    keys = orphans.moved_away_keys(deleted)
    assert domain.owner.uid not in keys and domain.uuid in keys
    assert orphans.classify(domain, ME, orphans.claims_of([], moved_away=keys)) is Verdict.MOVED_AWAY
    assert orphans.moved_away_keys(machine("ns", "m1", domain.owner.uid)) == {domain.owner.uid, domain.uuid}
    assert orphans.moved_away_keys(machine("ns", "m2", "u", placed=False)) == {"u"}


def test_a_domain_in_a_namespace_not_watched_is_left_alone() -> None:
    claims = orphans.claims_of([], namespaces=["watched"])
    assert orphans.classify(ours(namespace="elsewhere"), ME, claims) is Verdict.UNWATCHED
    assert orphans.classify(ours(namespace="watched"), ME, claims) is Verdict.ORPHAN


def test_no_metadata_or_metadata_that_does_not_fit_the_domain_is_not_ours() -> None:
    real = ours()
    look_alike = HostDomain(uuid=str(uuid.uuid4()), name=real.name, owner=None, paths=real.paths)
    copied_metadata = HostDomain(uuid=str(uuid.uuid4()), name="someone-else", owner=real.owner, paths=real.paths)
    renamed = HostDomain(uuid=real.uuid, name=real.name + "-x", owner=real.owner, paths=real.paths)
    for domain in (look_alike, copied_metadata, renamed):
        assert orphans.classify(domain, ME, Claims()) is Verdict.NOT_OURS


def test_only_the_orphans_own_volumes_that_no_other_domain_uses_go_with_it() -> None:
    orphan = ours(extra_paths=(f"{POOL}/shared-data.qcow2", f"{POOL}/capi-ns-m0-deadbeef.qcow2.bak"))
    assert orphan.owner is not None
    overlay = f"{POOL}/{naming.overlay_volume_name('ns', 'm0', orphan.owner.uid)}"
    foreign = HostDomain(uuid=str(uuid.uuid4()), name="foreign", owner=None,
                         paths=frozenset({overlay, f"{POOL}/shared-data.qcow2"}))
    paths = orphans.removable_paths(orphan, [orphan, foreign])
    assert paths == {f"{POOL}/{naming.nocloud_volume_name('ns', 'm0', orphan.owner.uid)}",
                     f"{POOL}/{naming.serial_log_file_name('ns', 'm0', orphan.owner.uid)}"}


def test_stray_volumes_in_our_scheme_are_reported_not_removed() -> None:
    domain = ours()
    used = sorted(p.rsplit("/", 1)[1] for p in domain.paths)
    stray = naming.overlay_volume_name("ns", "gone", str(uuid.uuid4()))
    found = orphans.find([domain], ME, Claims(), [*used, stray, "base.qcow2", stray + ".bak"])
    assert found.stray_volumes == (stray,)
    assert [d.name for d, _ in found.orphans] == [domain.name]


def test_find_and_status_count_orphans_and_kept_domains_with_bounded_lists() -> None:
    many = [ours(name=f"m{i}") for i in range(12)]
    kept = [ours(name="a", management=OTHER), ours(name="b", management=None)]
    found = orphans.find([*many, *kept, HostDomain("u", "foreign", None)], ME, Claims())
    status = orphans.status(found, removed_total=3, grace_s=30)
    assert (status["count"], status["keptCount"], status["removed"], status["gracePeriodSeconds"]) == (12, 2, 3, 30)
    assert len(status["domains"]) == orphans.LIST_MAX
    assert sorted(status["kept"]) == sorted([f"{kept[0].name} (OtherManagementCluster)", f"{kept[1].name} (NoProof)"])
    assert orphans.status(found, 0, None)["gracePeriodSeconds"] is None


def test_grace_period() -> None:
    assert not orphans.due(100.0, 129.0, 30.0)
    assert orphans.due(100.0, 130.0, 30.0)
    assert not orphans.due(0.0, 1e9, None)  # never: report only


def test_owner_metadata_round_trips_with_the_management_cluster() -> None:
    owner = Owner(namespace="ns", name="m", uid="u-1", cluster="c", management_cluster=ME)
    xml = domain_owner.metadata_element(owner)
    root = ET.Element("domain")
    root.append(xml)
    assert domain_owner.parse_owner(ET.tostring(root, encoding="unicode")) == owner
    # What virDomainSetMetadata receives: the element alone, its children in our namespace.
    alone = ET.fromstring(domain_owner.owner_metadata_xml(owner))
    assert alone.tag == f"{{{domain_owner.METADATA_NAMESPACE}}}{domain_owner.METADATA_ELEMENT}"
    assert alone.findtext(f"{{{domain_owner.METADATA_NAMESPACE}}}managementCluster") == ME


def test_an_older_releases_metadata_has_no_management_cluster() -> None:
    older = Owner(namespace="ns", name="m", uid="u-1")
    root = ET.Element("domain")
    root.append(domain_owner.metadata_element(older))
    parsed = domain_owner.parse_owner(ET.tostring(root, encoding="unicode"))
    assert parsed is not None and parsed.management_cluster is None


def test_disk_paths_of_a_domain() -> None:
    xml = """<domain><devices>
      <disk type='file'><source file='/p/a.qcow2'/></disk><disk type='file'><source file='/p/b.iso'/></disk>
      <serial type='file'><source path='/p/c.serial.log'/></serial><console type='file'><source path='/p/c.serial.log'/>
      </console><disk type='network'><source protocol='rbd' name='x'/></disk></devices></domain>"""
    assert domain_xml_edits.disk_paths(xml) == {"/p/a.qcow2", "/p/b.iso", "/p/c.serial.log"}
