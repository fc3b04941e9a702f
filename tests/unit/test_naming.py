"""Names of a machine's libvirt objects: deterministic, unique per machine, and safe whatever the input."""

from __future__ import annotations

import re
import uuid

import pytest

from capi_libvirt.core import naming

pytestmark = pytest.mark.unit

UID = "0b3c3f4e-8f0e-4d7a-9a51-2f1c1c7e5d10"
OTHER_UID = "7f2d9c1a-5b6e-4f3d-8c2a-9e8d7c6b5a40"

DOMAIN_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
VOLUME_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")
HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")

NASTY = [
    pytest.param("default", "worker-0", id="ordinary"),
    pytest.param("../..", "../../etc/passwd", id="path-traversal"),
    pytest.param("a/b", "c/d", id="slashes"),
    pytest.param("ns with spaces", "name with spaces", id="spaces"),
    pytest.param("'quoted'", '"double" `back`', id="quotes"),
    pytest.param("ünïcödé", "名前-ノード", id="unicode"),
    pytest.param("n" * 300, "m" * 300, id="very-long"),
    pytest.param("UPPER", "Mixed.Case.Name", id="case-and-dots"),
    pytest.param("", "", id="empty"),
    pytest.param("---", "...", id="only-separators"),
    pytest.param("x\x00y\n", "$(rm -rf /);<>&|", id="control-and-shell"),
    pytest.param("-leading", "trailing-", id="edge-dashes"),
    pytest.param("a" * 62 + "-", "b", id="cut-lands-on-dash"),
]


# --- domain UUID ---------------------------------------------------------------------------------------------------


def test_domain_uuid_is_the_same_on_every_call_for_one_uid() -> None:
    assert naming.domain_uuid(UID) == naming.domain_uuid(UID)


def test_domain_uuid_is_pinned_so_existing_domains_keep_theirs_across_releases() -> None:
    assert naming.domain_uuid(UID) == str(uuid.uuid5(naming.PROJECT_NAMESPACE, UID))
    assert str(naming.PROJECT_NAMESPACE) == "5d64ece4-dc73-59e8-9624-de2ce4c5a35e"


def test_domain_uuid_is_a_canonical_lowercase_uuid() -> None:
    value = naming.domain_uuid(UID)
    assert str(uuid.UUID(value)) == value


def test_domain_uuid_differs_between_uids() -> None:
    assert naming.domain_uuid(UID) != naming.domain_uuid(OTHER_UID)


@pytest.mark.parametrize("uid", ["", "   "])
def test_empty_uid_is_refused_rather_than_shared_by_every_machine(uid: str) -> None:
    with pytest.raises(ValueError, match="UID"):
        naming.domain_uuid(uid)
    with pytest.raises(ValueError, match="UID"):
        naming.domain_name("ns", "name", uid)
    with pytest.raises(ValueError, match="UID"):
        naming.mac_address(uid, 0)


# --- domain and volume names ---------------------------------------------------------------------------------------


def test_domain_name_reads_capi_namespace_name_and_uid_hash() -> None:
    assert naming.domain_name("default", "worker-0", UID) == f"capi-default-worker-0-{naming.uid_hash(UID)}"


def test_domain_name_is_deterministic() -> None:
    assert naming.domain_name("default", "worker-0", UID) == naming.domain_name("default", "worker-0", UID)


def test_same_name_in_two_namespaces_gives_two_domains() -> None:
    assert naming.domain_name("team-a", "cp-0", UID) != naming.domain_name("team-b", "cp-0", OTHER_UID)


def test_same_namespace_and_name_with_another_uid_gives_another_domain() -> None:
    # A machine deleted and re-created under the same name must not pick up the old domain.
    assert naming.domain_name("default", "cp-0", UID) != naming.domain_name("default", "cp-0", OTHER_UID)


def test_names_that_sanitise_alike_are_kept_apart_by_the_uid_hash() -> None:
    assert naming.domain_name("a.b", "c", UID) != naming.domain_name("a-b", "c", OTHER_UID)


def test_long_names_keep_both_namespace_and_name_visible() -> None:
    name = naming.domain_name("n" * 100, "m" * 100, UID)
    assert len(name) == naming.DOMAIN_NAME_MAX
    assert "nnnn" in name and "mmmm" in name


def test_short_namespace_leaves_its_room_to_a_long_name() -> None:
    name = naming.domain_name("ns", "m" * 100, UID)
    assert name.startswith("capi-ns-mmm")
    assert len(name) == naming.DOMAIN_NAME_MAX


@pytest.mark.parametrize(("namespace", "name"), NASTY)
def test_hostile_namespace_and_name_give_a_safe_domain_name_within_63_chars(namespace: str, name: str) -> None:
    domain = naming.domain_name(namespace, name, UID)
    assert DOMAIN_NAME.fullmatch(domain), domain
    assert "--" not in domain
    assert len(domain) <= naming.DOMAIN_NAME_MAX
    assert domain.startswith("capi-") and domain.endswith(naming.uid_hash(UID))


@pytest.mark.parametrize(("namespace", "name"), NASTY)
def test_hostile_namespace_and_name_give_safe_volume_file_names(namespace: str, name: str) -> None:
    for volume in (
        naming.overlay_volume_name(namespace, name, UID),
        naming.nocloud_volume_name(namespace, name, UID),
        naming.serial_log_file_name(namespace, name, UID),
    ):
        assert VOLUME_NAME.fullmatch(volume), volume
        assert ".." not in volume and "/" not in volume
        assert len(volume.encode()) <= naming.VOLUME_NAME_MAX


def test_volume_names_extend_the_domain_name() -> None:
    domain = naming.domain_name("default", "worker-0", UID)
    assert naming.overlay_volume_name("default", "worker-0", UID) == f"{domain}.qcow2"
    assert naming.nocloud_volume_name("default", "worker-0", UID) == f"{domain}-cidata.iso"
    assert naming.serial_log_file_name("default", "worker-0", UID) == f"{domain}.serial.log"


def test_accented_letters_are_folded_to_ascii() -> None:
    assert naming.sanitize_label("Ünïcödé") == "unicode"


# --- MAC addresses -------------------------------------------------------------------------------------------------


def test_mac_address_is_deterministic_per_uid_and_index() -> None:
    assert naming.mac_address(UID, 0) == naming.mac_address(UID, 0)


def test_mac_address_differs_per_interface_and_per_machine() -> None:
    macs = {naming.mac_address(uid, index) for uid in (UID, OTHER_UID) for index in range(8)}
    assert len(macs) == 16


def test_mac_address_is_a_qemu_unicast_locally_administered_address() -> None:
    mac = naming.mac_address(UID, 3)
    assert re.fullmatch(r"52:54:00(:[0-9a-f]{2}){3}", mac)
    first_octet = int(mac[:2], 16)
    assert first_octet & 0b01 == 0  # unicast
    assert first_octet & 0b10 == 0b10  # locally administered


def test_negative_interface_index_is_refused() -> None:
    with pytest.raises(ValueError, match="index"):
        naming.mac_address(UID, -1)


# --- hostname ------------------------------------------------------------------------------------------------------


def test_valid_machine_name_is_its_own_hostname() -> None:
    assert naming.hostname("cluster-md-0-abcde-xyz12") == "cluster-md-0-abcde-xyz12"


@pytest.mark.parametrize(("namespace", "name"), NASTY)
def test_hostile_machine_name_gives_an_rfc1123_label(namespace: str, name: str) -> None:
    del namespace
    label = naming.hostname(name)
    assert HOSTNAME.fullmatch(label), label
    assert len(label) <= naming.HOSTNAME_MAX


def test_long_names_with_a_common_prefix_keep_distinct_hostnames() -> None:
    # Cluster API puts the random part of a machine name at its end, where a plain cut would lose it.
    first, second = "x" * 70 + "-aaaaa", "x" * 70 + "-bbbbb"
    assert naming.hostname(first) != naming.hostname(second)


def test_names_that_sanitise_alike_get_distinct_hostnames() -> None:
    assert naming.hostname("node.a") != naming.hostname("node-a")
