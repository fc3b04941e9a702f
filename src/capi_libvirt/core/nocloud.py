"""The cloud-init NoCloud seed: an ISO 9660 image labelled `cidata` holding user-data, meta-data, network-config and
vendor-data.

Built in memory and returned as bytes; the caller uploads it into a storage volume. cloud-init finds the seed by its
volume label and reads the files by their Rock Ridge or Joliet names, so both are written.
"""

from __future__ import annotations

import io

import pycdlib

VOLUME_ID = "cidata"  # the label cloud-init's NoCloud data source looks for


def build_nocloud_iso(user_data: bytes, meta_data: bytes, network_config: bytes | None = None,
                      vendor_data: bytes | None = None) -> bytes:
    """The seed ISO for these documents; network-config only when given (cloud-init then skips its fallback), and
    vendor-data only when given."""
    files = {"user-data": user_data, "meta-data": meta_data}
    if network_config is not None:
        files["network-config"] = network_config
    if vendor_data is not None:
        files["vendor-data"] = vendor_data

    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=VOLUME_ID)
    for name, content in files.items():
        iso.add_fp(
            io.BytesIO(content),
            len(content),
            iso_path=iso9660_path(name),
            rr_name=name,
            joliet_path=f"/{name}",
        )
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def iso9660_path(name: str) -> str:
    """The plain ISO 9660 name (level 3 allows the length; the '-' is not a d-character): 'user-data' -> '/USERDATA.;1'."""
    return "/" + name.replace("-", "").upper() + ".;1"
