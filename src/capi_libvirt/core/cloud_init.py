"""The NoCloud documents besides user-data: meta-data (identity), network-config (netplan v2), and the vendor-data that
keeps cloud-init from running again once its seed is gone.

meta-data and network-config are YAML dumped by pyyaml from plain dicts, never from templates, so no value (a
hostname, an address) can add keys or lines of its own; the vendor-data is a fixed script. The user-data is the bootstrap data from Cluster API and is passed through untouched.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from capi_libvirt.api import v1alpha1

# vendor-data of a machine whose NoCloud ISO is removed once its node joined (spec.keepNoCloudISO false). cloud-init
# runs it once, at its first boot (scripts-vendor, before the user-data's runcmd); it takes effect from the next boot.
# Without it, an image whose datasource_list is NoCloud alone (with None) starts cloud-init again on every boot
# (ds-identify's "single entry in datasource_list" rule skips its search), which then finds no seed and, in its local
# stage, writes its fallback network config (DHCP on the first NIC) over the one the provider gave: a machine with
# static addresses would lose them at its first reboot. With it, cloud-init is disabled as ds-identify disables it
# when it finds no data source at all, and what the first boot configured stays. User-data can turn it off
# (`vendor_data: {enabled: false}`).
DISABLE_AFTER_FIRST_BOOT = (
    b"#!/bin/sh\n"
    b"# capi-libvirt: this machine's NoCloud seed (its bootstrap data) is ejected and deleted once its node joined;\n"
    b"# with no data source left, cloud-init stays off from the next boot on, and the first boot's configuration stays.\n"
    b"touch /etc/cloud/cloud-init.disabled\n"
)


def meta_data(instance_id: str, hostname: str, provider_id: str) -> bytes:
    """meta-data: the instance ID (use the domain UUID: cloud-init runs its once-per-instance steps again when it
    changes), the hostname, and the provider ID.

    cloud-init exposes meta-data keys to Jinja-templated user-data with '-' turned into '_', so bootstrap data can set
    the kubelet's `--provider-id` to `{{ ds.meta_data.provider_id }}` and the Node matches its Machine.
    """
    document = {
        "instance-id": instance_id,
        "local-hostname": hostname,
        "provider-id": provider_id,
    }
    return _yaml(document)


def network_config(interfaces: Sequence[v1alpha1.NetworkInterface], macs: Sequence[str],
                   addressing: Mapping[int, v1alpha1.StaticAddressing] | None = None) -> bytes | None:
    """network-config (netplan v2) for these interfaces, each matched by its MAC (`macs[i]` belongs to `interfaces[i]`).

    `addressing` maps an interface's index to its addresses (its `static`, or what an IP pool allocated it); None
    means each interface's own `static`. An interface without addressing gets DHCPv4; one with addressing gets its
    addresses, a default route via its gateway and its nameservers. Every interface is listed, so all of them come up (cloud-init's fallback only configures the
    first). None when there are no interfaces: cloud-init then applies its fallback.
    """
    if len(interfaces) != len(macs):
        raise ValueError(f"{len(interfaces)} interfaces but {len(macs)} MAC addresses")
    if not interfaces:
        return None
    ethernets = {
        ethernet_id(index): ethernet(mac, interface.static if addressing is None else addressing.get(index))
        for index, (interface, mac) in enumerate(zip(interfaces, macs, strict=True))
    }
    return _yaml({"version": 2, "ethernets": ethernets})


def ethernet_id(index: int) -> str:
    """The netplan ID of the `index`-th interface: a label only; the kernel's interface name is left as it is."""
    return f"nic{index}"


def ethernet(mac: str, static: v1alpha1.StaticAddressing | None) -> dict[str, Any]:
    """One netplan ethernet: matched by MAC, DHCPv4 unless it has static addressing."""
    config: dict[str, Any] = {"match": {"macaddress": mac.lower()}}
    if static is None:
        config["dhcp4"] = True
        return config
    config["dhcp4"] = False
    config["addresses"] = list(static.addresses)
    if static.gateway is not None:
        # `routes` rather than the deprecated gateway4/gateway6, with the default route written as a network: netplan
        # reads `to: default`, but cloud-init before 23.x (Debian 12's 22.4) refuses it ("Address default is not a
        # valid ip network") and gives up on the whole network-config.
        config["routes"] = [{"to": default_route(static.gateway), "via": static.gateway}]
    if static.nameservers:
        config["nameservers"] = {"addresses": list(static.nameservers)}
    return config


def default_route(gateway: str) -> str:
    """The default route's destination for the gateway's family: 0.0.0.0/0 or ::/0."""
    return "::/0" if ipaddress.ip_address(gateway).version == 6 else "0.0.0.0/0"


def _yaml(document: dict[str, Any]) -> bytes:
    # Key order kept as written (readable for a human looking at the seed); ASCII-only output, block style.
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=False).encode()
