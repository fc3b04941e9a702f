"""The anti-spoofing filter on every NIC (core.traffic_filter): its parameters for addresses known up front (or leased
by the host's network), held to the MAC before that, and for addresses granted beside them; the project's filters;
the host's grant."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from capi_libvirt.api import v1alpha1, v1alpha1_host
from capi_libvirt.core import tenancy, traffic_filter
from capi_libvirt.core.traffic_filter import TrafficFilter, filterref_element

pytestmark = pytest.mark.unit


def parameters(traffic: TrafficFilter) -> tuple[str, list[tuple[str, str]]]:
    element = filterref_element(traffic)
    return element.get("filter", ""), [(p.get("name", ""), p.get("value", "")) for p in element]


def test_known_addresses_are_the_only_ones_a_nic_may_send_from():
    assert parameters(TrafficFilter(addresses=("192.168.122.10", "192.168.122.11"))) == \
        ("clean-traffic", [("IP", "192.168.122.10"), ("IP", "192.168.122.11")])


def test_a_nic_without_a_known_address_sends_as_a_dhcp_client_until_a_lease_pins_it():
    assert parameters(TrafficFilter(awaiting_lease=True)) == (traffic_filter.BEFORE_LEASE, [])
    assert parameters(TrafficFilter(allowed=("192.168.122.250",), awaiting_lease=True)) == \
        (traffic_filter.BEFORE_LEASE, [])  # not even its virtual IP before
    assert parameters(TrafficFilter()) == (traffic_filter.MAC_ONLY, [])  # a bridge: no lease the host knows
    assert not TrafficFilter().pinned and TrafficFilter(addresses=("192.168.122.7",)).pinned


def test_a_filterref_reads_back_as_the_filter_it_was_made_from():
    for traffic in (TrafficFilter(), TrafficFilter(awaiting_lease=True), TrafficFilter(addresses=("192.168.122.7",)),
                    TrafficFilter(addresses=("192.168.122.7",), allowed=("192.168.122.250",))):
        interface = ET.Element("interface")
        interface.append(filterref_element(traffic))
        assert traffic_filter.parse_filterref(interface) == traffic
    assert traffic_filter.parse_filterref(ET.Element("interface")) is None


def test_granted_addresses_take_the_projects_filter():
    name, given = parameters(TrafficFilter(addresses=("192.168.122.7",), allowed=("192.168.122.250",)))
    assert name == traffic_filter.WITH_ALLOWED
    assert given == [("IP", "192.168.122.7"), ("ALLOWED_IP", "192.168.122.250")]


def test_only_ipv4_goes_into_a_filter():
    assert traffic_filter.ipv4_only(["192.168.122.10/24", "fd00::10/64", "10.0.0.1"]) == ("192.168.122.10", "10.0.0.1")
    with pytest.raises(ValueError, match="IPv4 only"):
        TrafficFilter(addresses=("fd00::10",))


def test_the_projects_filters_return_the_allowed_addresses_in_clean_traffics_chains():
    filters = {name: ET.fromstring(xml) for name, xml in traffic_filter.project_filters().items()}
    assert list(filters) == [traffic_filter.ALLOWED_IPV4, traffic_filter.ALLOWED_ARP, traffic_filter.WITH_ALLOWED,
                             traffic_filter.DHCP_CLIENT_IPV4, traffic_filter.DHCP_CLIENT_ARP, traffic_filter.MAC_ONLY,
                             traffic_filter.BEFORE_LEASE]
    ipv4, arp, root, dhcp_ipv4, dhcp_arp, mac_only, before_lease = filters.values()
    for name, xml in traffic_filter.project_filters().items():
        assert "$IP" not in xml or name in (traffic_filter.ALLOWED_IPV4, traffic_filter.ALLOWED_ARP), name
    assert len({f.findtext("uuid") for f in filters.values()}) == len(filters)  # fixed, one each
    assert [ref.get("filter") for ref in mac_only.findall("filterref")] == [
        "no-mac-spoofing", "no-arp-mac-spoofing", "no-other-l2-traffic", "qemu-announce-self"]
    assert [ref.get("filter") for ref in before_lease.findall("filterref")] == [
        "no-mac-spoofing", "no-arp-mac-spoofing", traffic_filter.DHCP_CLIENT_IPV4, traffic_filter.DHCP_CLIENT_ARP,
        "no-other-l2-traffic", "qemu-announce-self"]
    # Before its lease a NIC sends IPv4 only as a DHCP client, and ARP only as a probe; everything else is dropped.
    assert dhcp_ipv4.get("chain") == "ipv4-ip" and dhcp_arp.get("chain") == "arp-ip"
    ([out, drop], [probe, arp_drop]) = (dhcp_ipv4.findall("rule"), dhcp_arp.findall("rule"))
    assert out.find("ip").attrib == {"srcipaddr": "0.0.0.0", "protocol": "udp", "srcportstart": "68",
                                     "dstportstart": "67"} and drop.get("action") == "drop"
    assert probe.find("arp").get("arpsrcipaddr") == "0.0.0.0" and arp_drop.get("action") == "drop"
    assert (ipv4.get("chain"), arp.get("chain")) == ("ipv4-ip", "arp-ip")
    assert ipv4.find("rule/ip").get("srcipaddr") == "$ALLOWED_IP" and ipv4.find("rule").get("action") == "return"
    assert arp.find("rule/arp").get("arpsrcipaddr") == "$ALLOWED_IP"
    assert [ref.get("filter") for ref in root.findall("filterref")] == [
        traffic_filter.ALLOWED_IPV4, traffic_filter.ALLOWED_ARP, "clean-traffic"]


def test_a_tenant_may_send_from_an_extra_address_only_where_the_admin_granted_its_namespace():
    access = v1alpha1_host.HostAccess.model_validate({"images": ["base.qcow2"], "allowedAddresses": [
        {"namespaces": ["team-a"], "cidrs": ["192.168.122.250/32"]}]})

    def spec(address: str) -> v1alpha1.LibvirtMachineSpec:
        return v1alpha1.LibvirtMachineSpec.model_validate({"image": {"volume": "base.qcow2"}, "interfaces": [
            {"network": "default", "allowedAddresses": [address]}]})
    assert tenancy.refusal("h", access, "default", "team-a", spec("192.168.122.250")) is None
    refused = tenancy.refusal("h", access, "default", "team-b", spec("192.168.122.250"))
    assert refused is not None and refused.field == "allowedAddresses" and "namespace team-b" in refused.message
    assert tenancy.refusal("h", access, "default", "team-a", spec("192.168.122.251")) is not None
    assert tenancy.refusal("h", v1alpha1_host.HostAccess(images=["base.qcow2"]), "default", "team-a",
                           spec("192.168.122.250")) is not None  # nothing granted by default
