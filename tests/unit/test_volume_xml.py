"""The volume XML the provider makes (base images readable by all) and what a base image's XML says about sharing it
as every overlay's backing file (core.volume_xml)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from capi_libvirt.core import volume_xml

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("fmt, allocation", [("qcow2", None), ("raw", "0")])
def test_an_image_volume_is_readable_by_all_and_written_by_its_owner_only(fmt: str, allocation: str | None) -> None:
    volume = ET.fromstring(volume_xml.image_volume_xml("img", 1 << 30, fmt))
    assert volume.findtext("name") == "img" and volume.findtext("capacity") == str(1 << 30)
    assert volume.find("target/format").get("type") == fmt  # type: ignore[union-attr]
    assert volume.findtext("allocation") == allocation, "a raw image is thin"
    assert volume.findtext("target/permissions/mode") == "0644"


def test_machine_volumes_keep_libvirts_default_mode() -> None:
    for text in (volume_xml.data_volume_xml("d", 1), volume_xml.raw_volume_xml("r", 1),
                 volume_xml.overlay_volume_xml("o", 1, "/images/base.qcow2", "qcow2")):
        assert ET.fromstring(text).find("target/permissions") is None


def base_xml(mode: str | None, backing: str | None = None, owner: str = "0") -> str:
    """A base image's volume XML as libvirt describes it (the parts read here)."""
    permissions = f"<permissions><mode>{mode}</mode><owner>{owner}</owner><group>0</group></permissions>" if mode else ""
    chain = f"<backingStore><path>{backing}</path><format type='qcow2'/></backingStore>" if backing else ""
    return (f"<volume type='file'><name>b</name><target><path>/images/b</path><format type='qcow2'/>{permissions}"
            f"</target>{chain}</volume>")


@pytest.mark.parametrize("mode, shareable", [("0644", True), ("0444", True), ("0604", True), ("0600", False),
                                             ("0640", False), ("0711", False), ("0666", False), ("0664", False),
                                             ("0646", False), (None, False), ("garbage", False)])
def test_a_base_is_shared_as_it_is_only_when_every_user_may_read_it_and_no_other_write_it(
        mode: str | None, shareable: bool) -> None:
    assert volume_xml.shareable_base(base_xml(mode)) is shareable


@pytest.mark.parametrize("owner", ["64055", "1000", "x"])
def test_a_base_that_is_not_roots_is_not_shared_as_it_is(owner: str) -> None:
    """A base an earlier start gave to the QEMU user (a host upgraded from before) stays libvirt's to label."""
    assert volume_xml.shareable_base(base_xml("0644", owner=owner)) is False


def test_a_base_with_a_backing_file_of_its_own_is_left_to_libvirt() -> None:
    assert volume_xml.shareable_base(base_xml("0644", backing="/images/older.qcow2")) is False
