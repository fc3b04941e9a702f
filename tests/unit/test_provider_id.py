"""The provider ID: one canonical form written, the same parsed back, everything else refused with a reason."""

from __future__ import annotations

import pytest

from capi_libvirt.core.provider_id import MAX_LENGTH, ProviderID, format_provider_id, parse_provider_id

pytestmark = pytest.mark.unit

UUID = "5d64ece4-dc73-59e8-9624-de2ce4c5a35e"


def test_format_writes_scheme_host_and_uuid() -> None:
    assert format_provider_id("host-1", UUID) == f"libvirt://host-1/{UUID}"


@pytest.mark.parametrize("host", ["host-1", "kvm01.lab.example.com", "h", "a" * 63])
def test_format_and_parse_round_trip(host: str) -> None:
    provider_id = format_provider_id(host, UUID)
    assert parse_provider_id(provider_id) == ProviderID(host=host, domain_uuid=UUID)
    assert str(parse_provider_id(provider_id)) == provider_id


def test_longest_possible_provider_id_stays_within_the_crd_limit() -> None:
    host = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters, the longest DNS name
    provider_id = format_provider_id(host, UUID)
    assert len(provider_id) <= MAX_LENGTH
    assert parse_provider_id(provider_id).host == host


@pytest.mark.parametrize(
    ("host", "domain_uuid"),
    [
        pytest.param("", UUID, id="empty-host"),
        pytest.param("Host", UUID, id="uppercase-host"),
        pytest.param("host:22", UUID, id="host-with-port"),
        pytest.param("host/x", UUID, id="host-with-slash"),
        pytest.param("host-1", UUID.upper(), id="uppercase-uuid"),
        pytest.param("host-1", "not-a-uuid", id="bad-uuid"),
        pytest.param("host-1", UUID.replace("-", ""), id="unhyphenated-uuid"),
    ],
)
def test_format_refuses_non_canonical_parts(host: str, domain_uuid: str) -> None:
    with pytest.raises(ValueError):
        format_provider_id(host, domain_uuid)


@pytest.mark.parametrize(
    ("provider_id", "complaint"),
    [
        pytest.param(f"qemu://host-1/{UUID}", "does not start with", id="wrong-scheme"),
        pytest.param(f"LIBVIRT://host-1/{UUID}", "does not start with", id="uppercase-scheme"),
        pytest.param(f"libvirt:/host-1/{UUID}", "does not start with", id="one-slash"),
        pytest.param(f"host-1/{UUID}", "does not start with", id="no-scheme"),
        pytest.param(f"libvirt:///{UUID}", "no host", id="missing-host"),
        pytest.param("libvirt://host-1", "no domain UUID", id="missing-uuid"),
        pytest.param("libvirt://host-1/", "no domain UUID", id="empty-uuid"),
        pytest.param("libvirt://host-1/1234", "not a lowercase hyphenated UUID", id="bad-uuid"),
        pytest.param(f"libvirt://host-1/{UUID.upper()}", "not a lowercase hyphenated UUID", id="uppercase-uuid"),
        pytest.param(f"libvirt://host-1/{UUID}/extra", "path after", id="extra-path"),
        pytest.param(f"libvirt://host-1/{UUID}/", "path after", id="trailing-slash"),
        pytest.param(f"libvirt://host-1/{UUID}?x=1", "not a lowercase hyphenated UUID", id="query"),
        pytest.param(f"libvirt://user@host-1/{UUID}", "not a lowercase DNS name", id="userinfo"),
        pytest.param(f"libvirt://host-1:16509/{UUID}", "not a lowercase DNS name", id="port"),
        pytest.param(f"libvirt://[::1]/{UUID}", "not a lowercase DNS name", id="ipv6-literal"),
        pytest.param(f"libvirt://host-1/{UUID}\n", "not a lowercase hyphenated UUID", id="trailing-newline"),
        pytest.param(f"libvirt://{'a' * 600}/{UUID}", "more than 512", id="too-long"),
        pytest.param("", "does not start with", id="empty"),
    ],
)
def test_parse_refuses_malformed_provider_ids_saying_why(provider_id: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_provider_id(provider_id)


def test_parse_refuses_non_strings() -> None:
    with pytest.raises(ValueError, match="string"):
        parse_provider_id(None)  # type: ignore[arg-type]
