"""The phases that make the machine on its host: the base image, the overlay and data disks, the bootstrap
seed and the domain, started; and the providerID published.
"""

from __future__ import annotations

import functools

from capi_libvirt.api import reasons
from capi_libvirt.core import cloud_init, domain_owner, domain_xml, naming, nocloud, provider_id
from capi_libvirt.hypervisor import errors, traffic_filters
from capi_libvirt.reconcile.base import Dependencies, Wait
from capi_libvirt.reconcile.machine.identity import domain_record
from capi_libvirt.reconcile.machine.owners import fetch_bootstrap_data
from capi_libvirt.reconcile.machine.placing import pool_room
from capi_libvirt.reconcile.machine.state import DOMAIN_RECORD_ANNOTATION, MachinePass, event


async def ensure_image(deps: Dependencies, p: MachinePass) -> None:
    """The base image in the host's pool: a volume the admin put there, or the image of spec.image.url, imported once
    per host, pool and sha256 (reconcile.images) while the machine waits with ImageImporting."""
    if p.domain is not None:
        return  # the domain exists, so its disk (and the image under it) was made before it
    image = p.spec.image
    if image.url is None:
        p.image_volume = image.volume
        return
    known = deps.inventory.hosts.get(p.host or "")
    prefixes = known.spec.access.image_url_prefixes if known is not None else []
    pool = image.pool or p.spec.storage_pool
    found = await deps.images.ensure(deps.hosts.get(p.host or ""), pool, image, prefixes, deps.wake_host,
                                     room=functools.partial(pool_room, deps, p.host or "", pool))  # or Wait
    p.image_volume = found.name


async def ensure_overlay(deps: Dependencies, p: MachinePass) -> None:
    """The root disk (an overlay on the base image) and the data disks, in the machine's pool."""
    if p.domain is not None:
        return  # the domain exists, so its disks were made before it
    host = deps.hosts.get(p.host or "")
    base_pool = p.spec.image.pool or p.spec.storage_pool
    base_volume = p.image_volume or p.spec.image.volume or ""
    try:
        p.overlay = await host.ensure_overlay(p.volumes(), base_pool, base_volume, p.spec.disk_gib)
    except errors.VolumeNotFound:
        raise Wait(reasons.IMAGE_NOT_FOUND, f"base image volume {base_volume!r} not found in pool "
                   f"{base_pool!r} on host {p.host}", failure=True) from None
    if p.overlay.backing is None:
        await event(deps, p.body, "Warning", reasons.BASE_IMAGE_LABELLED,
                    f"base image volume {base_volume!r} in pool {base_pool!r} on host {p.host} is not readable by "
                    "every user (or has a backing file of its own): libvirt gives it to the host's QEMU user when "
                    "the machine starts, for good; make it mode 0644 to share it as it is")
    if p.spec.data_disks:
        await host.ensure_data_disks(p.volumes(), [disk.size_gib for disk in p.spec.data_disks])


async def ensure_domain(deps: Dependencies, p: MachinePass) -> None:
    if p.domain is not None:
        return
    if p.bootstrap is None:  # placed in an earlier pass (that ended, or crashed, before the domain was made)
        await fetch_bootstrap_data(deps, p)
    host = deps.hosts.get(p.host or "")
    volumes = p.volumes()
    pool_dir = await host.pool_path(volumes.pool)
    provider = provider_id.format_provider_id(p.host or "", p.domain_uuid)
    owner = domain_owner.Owner(namespace=p.namespace, name=p.name, uid=p.uid,
                             cluster=p.cluster.name if p.cluster else None,
                             management_cluster=deps.management_cluster)
    overlay_path = p.overlay.path if p.overlay is not None else f"{pool_dir}/{volumes.overlay}"
    ignition = p.bootstrap is not None and p.bootstrap.format == "ignition"
    try:
        await host.ensure_filters()
    except traffic_filters.TrafficFilterMissing as error:
        raise Wait(reasons.TRAFFIC_FILTER_NOT_FOUND, str(error), failure=True) from None
    try:
        config = domain_xml.from_spec(p.spec, name=p.domain_name, uuid=p.domain_uuid, disk_path=overlay_path,
                                      iso_path=None if ignition else f"{pool_dir}/{volumes.nocloud}",
                                      serial_log_path=f"{pool_dir}/{volumes.serial_log}", owner=owner,
                                      data_disk_paths=tuple(f"{pool_dir}/{disk}" for disk in volumes.data_disks),
                                      ignition_path=f"{pool_dir}/{volumes.ignition}" if ignition else None,
                                      known_addresses={i: a.addresses for i, a in p.addressing.items()},
                                      disk_backing=p.overlay.backing if p.overlay is not None else None)
    except ValueError as error:  # a spec admission let through that no domain XML can carry: the spec is immutable
        raise Wait(reasons.INVALID_SPEC, f"invalid spec: {error}", None, failure=True) from None
    user_data = (p.bootstrap.value if p.bootstrap else None) or b""  # (always set and non-empty: fetched above)
    if ignition:  # the config as it is, for Ignition to read from fw_cfg; no NoCloud seed
        await host.replace_ignition(volumes, user_data)
    else:
        iso = nocloud.build_nocloud_iso(
            user_data=user_data,
            meta_data=cloud_init.meta_data(p.domain_uuid, naming.hostname(p.name), provider),
            network_config=cloud_init.network_config(p.spec.interfaces, [nic.mac for nic in config.interfaces],
                                                     p.addressing),
            vendor_data=None if p.spec.keep_nocloud_iso else cloud_init.DISABLE_AFTER_FIRST_BOOT,
        )
        await host.replace_nocloud(volumes, iso)
    if p.spec.serial_log:
        await host.ensure_serial_log(volumes)
    if domain_record(p.body) != p.host:  # written ahead: from here on a domain may exist there (core.outage)
        p.body = await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"metadata": {
            "annotations": {DOMAIN_RECORD_ANNOTATION: p.host},
            "resourceVersion": p.body["metadata"]["resourceVersion"]}})
    p.define_sent = True
    p.domain = await host.define_domain(p.domain_uuid, domain_xml.domain_xml(config))
    await event(deps, p.body, "Normal", reasons.DOMAIN_DEFINED, f"domain {p.domain_name} defined on host {p.host}")


async def ensure_running(deps: Dependencies, p: MachinePass) -> None:
    host = deps.hosts.get(p.host or "")
    if p.domain is None or p.domain.state != "running":
        paused_for = p.domain.pause_reason if p.domain else None
        if await host.start_domain(p.domain_uuid):
            await event(deps, p.body, "Warning", reasons.DOMAIN_RESUMED,
                         f"domain {p.domain_name} on host {p.host} was paused ({paused_for or 'reason unknown'}); resumed")
        p.domain = await host.domain_info(p.domain_uuid)
    p.status["state"] = p.domain.state if p.domain else "unknown"


async def publish_provider_id(deps: Dependencies, p: MachinePass) -> None:
    wanted = provider_id.format_provider_id(p.host or "", p.domain_uuid)
    if p.body.get("spec", {}).get("providerID") != wanted:
        await deps.kube.patch_libvirt_machine(p.namespace, p.name, {"spec": {"providerID": wanted}})
