"""The NoCloud seed ISO: read back with pycdlib, it carries the cidata label and the documents under every name."""

from __future__ import annotations

import io

import pycdlib
import pytest

from capi_libvirt.core.nocloud import build_nocloud_iso

pytestmark = pytest.mark.unit

USER_DATA = b"#cloud-config\nruncmd:\n  - echo hello\n"
META_DATA = b"instance-id: i-123\nlocal-hostname: guest\n"
NETWORK_CONFIG = b"version: 2\nethernets: {}\n"


def open_iso(image: bytes) -> pycdlib.PyCdlib:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    return iso


def read(iso: pycdlib.PyCdlib, **path: str) -> bytes:
    out = io.BytesIO()
    iso.get_file_from_iso_fp(out, **path)
    return out.getvalue()


def test_volume_is_labelled_cidata() -> None:
    iso = open_iso(build_nocloud_iso(USER_DATA, META_DATA))
    assert iso.pvd.volume_identifier.decode().strip() == "cidata"
    assert iso.has_rock_ridge() and iso.has_joliet()


def test_documents_readable_by_rock_ridge_joliet_and_iso9660_names() -> None:
    iso = open_iso(build_nocloud_iso(USER_DATA, META_DATA, NETWORK_CONFIG))
    expected = {"user-data": USER_DATA, "meta-data": META_DATA, "network-config": NETWORK_CONFIG}
    rock_ridge_names = {child.rock_ridge.name().decode() for child in iso.list_children(rr_path="/")
                        if child.is_file()}
    joliet_names = {child.file_identifier().decode("utf-16_be").split(";")[0]
                    for child in iso.list_children(joliet_path="/") if child.is_file()}
    assert rock_ridge_names == set(expected)
    assert joliet_names == set(expected)
    for name, content in expected.items():
        assert read(iso, rr_path=f"/{name}") == content
        assert read(iso, joliet_path=f"/{name}") == content
        assert read(iso, iso_path="/" + name.replace("-", "").upper() + ".;1") == content


def test_network_config_only_when_given() -> None:
    iso = open_iso(build_nocloud_iso(USER_DATA, META_DATA))
    names = {child.rock_ridge.name().decode() for child in iso.list_children(rr_path="/") if child.is_file()}
    assert names == {"user-data", "meta-data"}
