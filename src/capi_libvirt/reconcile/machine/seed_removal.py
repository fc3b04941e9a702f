"""The bootstrap data leaves the host once the node joined: the NoCloud ISO ejected and deleted, or the
Ignition config taken out of the domain's definition and its file emptied.
"""

from __future__ import annotations

import logging
import posixpath

from capi_libvirt.api import reasons
from capi_libvirt.core import domain_xml_edits
from capi_libvirt.hypervisor import errors
from capi_libvirt.reconcile.base import Dependencies
from capi_libvirt.reconcile.machine.state import RECHECK_SEED_REMOVAL, MachinePass, event

log = logging.getLogger(__name__)

async def remove_nocloud_iso(deps: Dependencies, p: MachinePass) -> None:
    """Once the bootstrap data was provably consumed (the owner Machine has a nodeRef: Cluster API's word that the
    node joined, so cloud-init ran it), eject the NoCloud ISO from the domain and delete it from the host: the join
    token is then nowhere on the hypervisor. Unless spec.keepNoCloudISO keeps it for debugging (status says false).

    Looked at every pass from the domain XML this pass read (free); the host is asked only while the ISO is still in
    the CD-ROM or its removal is not recorded in status.noCloudISORemoved (a crash between the eject and the delete,
    or a moved copy without status, converges). A failure is no provisioning failure: a Warning event, and the next
    pass tries again.
    """
    if p.domain is None or p.machine is None or not p.machine.node_joined:
        return
    if any(posixpath.basename(path) == p.volumes().ignition for path in domain_xml_edits.fw_cfg_files(p.domain.xml)) or \
            "ignitionConfigRemoved" in p.status:
        await _remove_ignition_config(deps, p)
        return
    if p.spec.keep_nocloud_iso:
        p.status["noCloudISORemoved"] = False  # looked at with the node joined, and kept
        return
    inserted = any(posixpath.basename(path) == p.volumes().nocloud for path in domain_xml_edits.cdrom_sources(p.domain.xml))
    if p.status.get("noCloudISORemoved") and not inserted:
        return
    host, volumes = deps.hosts.get(p.host or ""), p.volumes()
    try:
        ejected = await host.eject_nocloud(p.domain_uuid, volumes.nocloud)
        deleted = await host.delete_nocloud(volumes)
    except errors.HostUnreachable:
        raise
    except errors.HypervisorError as error:
        log.warning("%s/%s: the NoCloud ISO was not removed yet: %s", p.namespace, p.name, error)
        await event(deps, p.body, "Warning", reasons.NOCLOUD_ISO_NOT_REMOVED, f"the NoCloud ISO stays for now: {error}")
        p.come_back_after = RECHECK_SEED_REMOVAL
        return
    p.status["noCloudISORemoved"] = True
    done = ([f"ejected from the domain ({' and '.join(ejected)})"] if ejected else []) + \
        ([f"volume {volumes.nocloud} deleted"] if deleted else [])
    if done:
        await event(deps, p.body, "Normal", reasons.NOCLOUD_ISO_REMOVED, "the node joined, so the bootstrap data was used: "
                     f"NoCloud ISO {', '.join(done)} on host {p.host}")


async def _remove_ignition_config(deps: Dependencies, p: MachinePass) -> None:
    """An Ignition machine's bootstrap data, once the node joined: its fw_cfg entry out of the domain's definition
    (the running guest read it at boot; the next start comes without it) and its volume emptied, or deleted when the
    domain is not running (hypervisor.machines.drop_ignition). The
    domain's live XML keeps naming the file until it stops, so status.ignitionConfigRemoved records that it is done."""
    if p.spec.keep_nocloud_iso:
        p.status["ignitionConfigRemoved"] = False
        return
    if p.status.get("ignitionConfigRemoved"):
        return
    host, volumes = deps.hosts.get(p.host or ""), p.volumes()
    try:
        done = await host.drop_ignition(p.domain_uuid, volumes)
    except errors.HostUnreachable:
        raise
    except errors.HypervisorError as error:
        log.warning("%s/%s: the Ignition config was not removed yet: %s", p.namespace, p.name, error)
        await event(deps, p.body, "Warning", reasons.IGNITION_CONFIG_NOT_REMOVED,
                     f"the Ignition config stays for now: {error}")
        p.come_back_after = RECHECK_SEED_REMOVAL
        return
    p.status["ignitionConfigRemoved"] = True
    said = {"definition": "taken out of the domain's definition", "volume": f"volume {volumes.ignition} deleted",
            "emptied": f"volume {volumes.ignition} emptied (deleted with the machine)"}
    if done:
        await event(deps, p.body, "Normal", reasons.IGNITION_CONFIG_REMOVED, "the node joined, so the bootstrap data was "
                     f"used: Ignition config {', '.join(said[what] for what in done)} on host {p.host}")
