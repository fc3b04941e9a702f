"""NoCloud meta-data and network-config: read back as YAML, they say exactly what was asked."""

from __future__ import annotations

import pytest
import yaml

from capi_libvirt.api import v1alpha1
from capi_libvirt.core import cloud_init

pytestmark = pytest.mark.unit

MAC0 = "52:54:00:aa:bb:cc"
MAC1 = "52:54:00:dd:ee:ff"


def nic(**fields: object) -> v1alpha1.NetworkInterface:
    return v1alpha1.NetworkInterface.model_validate(fields)


# --- meta-data -----------------------------------------------------------------------------------------------------


def test_meta_data_carries_instance_id_hostname_and_provider_id() -> None:
    document = yaml.safe_load(cloud_init.meta_data("uuid-1", "worker-0", "libvirt://h/uuid-1"))
    assert document == {"instance-id": "uuid-1", "local-hostname": "worker-0", "provider-id": "libvirt://h/uuid-1"}


def test_meta_data_values_cannot_inject_keys() -> None:
    hostile = "x\nprovider-id: evil\n# : ]]> {}"
    document = yaml.safe_load(cloud_init.meta_data("1234", hostile, "libvirt://h/u"))
    assert document["local-hostname"] == hostile
    assert document["provider-id"] == "libvirt://h/u"
    assert document["instance-id"] == "1234"  # a numeric-looking id stays a string


# --- network-config ------------------------------------------------------------------------------------------------


def test_interfaces_without_static_addressing_get_dhcp4_matched_by_mac() -> None:
    document = yaml.safe_load(cloud_init.network_config([nic(network="default"), nic(bridge="br0")], [MAC0, MAC1]))
    assert document == {
        "version": 2,
        "ethernets": {
            "nic0": {"match": {"macaddress": MAC0}, "dhcp4": True},
            "nic1": {"match": {"macaddress": MAC1}, "dhcp4": True},
        },
    }


def test_static_interface_gets_addresses_default_route_and_nameservers() -> None:
    interface = nic(
        bridge="br0",
        static={
            "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
            "gateway": "192.0.2.1",
            "nameservers": ["192.0.2.53"],
        },
    )
    ethernet = yaml.safe_load(cloud_init.network_config([interface], [MAC0]))["ethernets"]["nic0"]
    assert ethernet == {
        "match": {"macaddress": MAC0},
        "dhcp4": False,
        "addresses": ["192.0.2.10/24", "2001:db8::10/64"],
        "routes": [{"to": "0.0.0.0/0", "via": "192.0.2.1"}],
        "nameservers": {"addresses": ["192.0.2.53"]},
    }


def test_static_interface_without_gateway_or_nameservers_has_no_routes_or_dns() -> None:
    interface = nic(network="default", static={"addresses": ["10.0.0.5/8"]})
    ethernet = yaml.safe_load(cloud_init.network_config([interface], [MAC0]))["ethernets"]["nic0"]
    assert ethernet == {"match": {"macaddress": MAC0}, "dhcp4": False, "addresses": ["10.0.0.5/8"]}


def test_mixed_interfaces_keep_their_order_and_own_settings() -> None:
    interfaces = [nic(network="default"), nic(bridge="br0", static={"addresses": ["192.0.2.10/24"]})]
    ethernets = yaml.safe_load(cloud_init.network_config(interfaces, [MAC0, MAC1]))["ethernets"]
    assert list(ethernets) == ["nic0", "nic1"]
    assert ethernets["nic0"]["dhcp4"] is True
    assert ethernets["nic1"]["dhcp4"] is False


def test_mac_addresses_are_matched_in_lowercase() -> None:
    document = yaml.safe_load(cloud_init.network_config([nic(network="default")], ["AA:BB:CC:DD:EE:FF"]))
    assert document["ethernets"]["nic0"]["match"]["macaddress"] == "aa:bb:cc:dd:ee:ff"


def test_no_interfaces_means_no_network_config() -> None:
    assert cloud_init.network_config([], []) is None


def test_interfaces_and_macs_must_pair_up() -> None:
    with pytest.raises(ValueError, match="MAC"):
        cloud_init.network_config([nic(network="default")], [MAC0, MAC1])


def test_the_default_route_is_a_network_old_cloud_init_reads_for_either_family() -> None:
    # cloud-init 22.4 (Debian 12, the guest image's) refuses `to: default` and drops the whole network-config.
    for gateway, route in (("192.0.2.1", "0.0.0.0/0"), ("2001:db8::1", "::/0")):
        interface = nic(network="default", static={"addresses": ["192.0.2.10/24", "2001:db8::10/64"],
                                                   "gateway": gateway})
        ethernets = yaml.safe_load(cloud_init.network_config([interface], [MAC0]))["ethernets"]
        assert ethernets["nic0"]["routes"] == [{"to": route, "via": gateway}]
