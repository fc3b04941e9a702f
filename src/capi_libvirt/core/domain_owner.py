"""Who a domain belongs to, written into its `<metadata>` under the provider's own XML namespace and read back to tell
our domains from everyone else's: the LibvirtMachine (namespace, name, UID, cluster) and the management cluster whose
operator made or adopted it. `metadata_element` is the element of a new domain's XML; `owner_metadata_xml` the same
owner on its own, for virDomainSetMetadata (adoption rewrites the owner without redefining the domain); `parse_owner`
reads it back.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from capi_libvirt.core.xml_text import check_xml_text, text_element

METADATA_NAMESPACE = "https://capi-libvirt.x-k8s.io/machine/v1"
METADATA_PREFIX = "capi"
METADATA_ELEMENT = "machine"
OWNER_FIELDS = ("namespace", "name", "uid", "cluster", "management_cluster")
# Element names in the metadata (an older release wrote the first four only).
OWNER_ELEMENTS = {"namespace": "namespace", "name": "name", "uid": "uid", "cluster": "cluster",
                  "management_cluster": "managementCluster"}


@dataclass(frozen=True)
class Owner:
    """Who a domain belongs to: the LibvirtMachine (and its cluster) it was defined for, and the management cluster
    (its identity: see operator startup) whose operator made or last adopted it. None: written by a release before
    management cluster identities, or released by a clusterctl move source: no proof of whose it is."""

    namespace: str
    name: str
    uid: str
    cluster: str | None = None
    management_cluster: str | None = None

    def __post_init__(self) -> None:
        for name in ("namespace", "name", "uid"):
            if not getattr(self, name):
                raise ValueError(f"owner {name} must not be empty")
        for name in OWNER_FIELDS:
            check_xml_text(f"owner {name}", getattr(self, name))


def parse_owner(xml_text: str) -> Owner | None:
    """The owner recorded in a domain's metadata; None when the domain is not ours (no or incomplete metadata)."""
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as error:
        raise ValueError(f"domain XML is not well-formed: {error}") from error
    machine = root.find(f"metadata/{{{METADATA_NAMESPACE}}}{METADATA_ELEMENT}")
    if machine is None:
        return None
    values = {name: machine.findtext(f"{{{METADATA_NAMESPACE}}}{OWNER_ELEMENTS[name]}") for name in OWNER_FIELDS}
    if not (values["namespace"] and values["name"] and values["uid"]):
        return None  # damaged or foreign: never claim a domain on partial evidence
    return Owner(
        namespace=values["namespace"], name=values["name"], uid=values["uid"], cluster=values["cluster"] or None,
        management_cluster=values["management_cluster"] or None,
    )


def owner_metadata_xml(owner: Owner) -> str:
    """The owner element alone, as virDomainSetMetadata takes it (key METADATA_PREFIX, uri METADATA_NAMESPACE).

    The children are in METADATA_NAMESPACE through a default namespace: libvirt gives the root element the prefix
    itself and would refuse a root that already declares it.
    """
    machine = ET.Element(METADATA_ELEMENT, {"xmlns": METADATA_NAMESPACE})
    _owner_children(machine, owner, prefix="")
    return ET.tostring(machine, encoding="unicode")


def metadata_element(owner: Owner) -> ET.Element:
    """<metadata><capi:machine xmlns:capi=...> with one child per owner field."""
    metadata = ET.Element("metadata")
    # The prefix is written literally (instead of ET.register_namespace, which is process-global state); readers match
    # on the namespace URI, so whatever prefix libvirt keeps, parse_owner still finds it.
    machine = ET.SubElement(
        metadata, f"{METADATA_PREFIX}:{METADATA_ELEMENT}", {f"xmlns:{METADATA_PREFIX}": METADATA_NAMESPACE}
    )
    _owner_children(machine, owner, prefix=f"{METADATA_PREFIX}:")
    return metadata


def _owner_children(machine: ET.Element, owner: Owner, prefix: str) -> None:
    for name in OWNER_FIELDS:
        value = getattr(owner, name)
        if value:  # an empty cluster is the same as none, and reads back as None
            text_element(machine, f"{prefix}{OWNER_ELEMENTS[name]}", value)
