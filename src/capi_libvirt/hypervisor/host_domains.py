"""A host's domains as the orphan collector sees them, their removal, and rewriting a domain's owner metadata.

Run by LibvirtHost (hypervisor.host) like hypervisor.machines. Removal checks again, on the host and right before it
acts, that the domain still carries exactly the owner metadata the decision (core.orphans) was made on; anything that
changed meanwhile (adopted by a move target, redefined) is left alone.
"""

from __future__ import annotations

import libvirt

from capi_libvirt.core import domain_owner, domain_xml_edits
from capi_libvirt.core.orphans import HostDomain
from capi_libvirt.hypervisor import errors, machines


def list_domains(conn: libvirt.virConnect, pool_name: str) -> tuple[list[HostDomain], list[str]]:
    """Every domain (owner metadata parsed, files it uses) and the names of the volumes of the host's pool."""
    domains = []
    for domain in conn.listAllDomains():
        try:
            xml = domain.XMLDesc(0)
            uuid, name = domain.UUIDString(), domain.name()
        except libvirt.libvirtError as error:
            if errors.is_missing_domain(error):
                continue  # undefined between the listing and the look
            raise
        try:
            owner = domain_owner.parse_owner(xml)
        except ValueError:
            owner = None
        domains.append(HostDomain(uuid=uuid, name=name, owner=owner, paths=domain_xml_edits.disk_paths(xml)))
    volumes: list[str] = []
    try:
        pool = conn.storagePoolLookupByName(pool_name)
        if pool.isActive():
            volumes = [volume.name() for volume in pool.listAllVolumes(0)]
    except libvirt.libvirtError as error:
        if not errors.is_missing_pool(error):
            raise
    return domains, volumes


def remove_orphan(conn: libvirt.virConnect, orphan: HostDomain, paths: frozenset[str]) -> list[str]:
    """Destroy and undefine the orphan, then delete the volumes at `paths`; returns what was removed.

    Only when the domain still has the owner the decision saw (else HypervisorError, nothing touched); a volume only
    when libvirt knows it at that path under the same name.
    """
    try:
        domain = conn.lookupByUUIDString(orphan.uuid)
    except libvirt.libvirtError as error:
        if errors.is_missing_domain(error):
            return []  # gone meanwhile: its files are no longer provably an orphan's
        raise
    if domain.name() != orphan.name or domain_owner.parse_owner(domain.XMLDesc(0)) != orphan.owner:
        raise errors.HypervisorError(f"domain {orphan.name} changed since it was found orphaned; left alone")
    machines.destroy_and_undefine(domain)
    removed = [f"domain {orphan.name}"]
    for path in sorted(paths):
        try:
            volume = conn.storageVolLookupByPath(path)
        except libvirt.libvirtError as error:
            if errors.is_missing_volume(error):
                continue  # never made, or not a volume of any pool: nothing libvirt can delete
            raise
        if path.rsplit("/", 1)[-1] != volume.name():
            continue
        volume.delete(0)
        removed.append(f"volume {volume.name()}")
    return removed


def set_owner(conn: libvirt.virConnect, uuid: str, owner: domain_owner.Owner,
              expected: domain_owner.Owner | None = None) -> None:
    """Rewrite the domain's owner metadata in place (virDomainSetMetadata): its persistent definition and, when it
    runs, the live one. The domain is neither redefined nor restarted. With `expected`, only while the domain still
    carries that owner (else HypervisorError): another operator (a move target adopting it) may have written since."""
    domain = conn.lookupByUUIDString(uuid)
    if expected is not None and domain_owner.parse_owner(domain.XMLDesc(0)) != expected:
        raise errors.HypervisorError(f"owner metadata of domain {domain.name()} changed meanwhile; left as it is")
    flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
    if domain.isActive():
        flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
    domain.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, domain_owner.owner_metadata_xml(owner),
                       domain_owner.METADATA_PREFIX, domain_owner.METADATA_NAMESPACE, flags)
