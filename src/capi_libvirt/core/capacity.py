"""What one machine made from a LibvirtMachineTemplate offers, in the form cluster-autoscaler reads (all strings)."""

from __future__ import annotations

from typing import Any

from capi_libvirt.api import reasons, v1alpha1
from capi_libvirt.core import conditions


def template_capacity(spec: v1alpha1.LibvirtMachineSpec) -> dict[str, str]:
    """`status.capacity` of a template: quantities as strings, since one integer makes the whole map unreadable."""
    return {
        "cpu": str(spec.cpus),
        "memory": f"{spec.memory_mib}Mi",
        "ephemeral-storage": f"{spec.disk_gib}Gi",
    }


def template_node_info(spec: v1alpha1.LibvirtMachineSpec) -> dict[str, str]:
    """`status.nodeInfo` of a template; the domains this provider defines are x86_64 Linux guests."""
    del spec  # every domain the provider defines today is an x86_64 machine (q35/pc)
    return {"architecture": "amd64", "operatingSystem": "linux"}


def template_status_update(spec: v1alpha1.LibvirtMachineTemplateSpec, status: dict[str, Any] | None,
                           generation: int, now: str) -> dict[str, Any] | None:
    """What of `status` (capacity, nodeInfo, conditions) differs from what the template's spec and generation give, or
    None: level-triggered, so a template whose status is missing for any reason (a copy made by clusterctl move arrives
    without one) gets it. A template edited after it was made (generation above 1) says so in its EditedInPlace
    condition, since that edit rolls no machine."""
    machine = spec.template.spec
    current = status or {}
    wanted: dict[str, Any] = {"capacity": template_capacity(machine), "nodeInfo": template_node_info(machine)}
    if generation > 1:
        edited = conditions.get_condition(current.get("conditions"), reasons.EDITED_IN_PLACE_TYPE)
        if edited is None or edited.get("observedGeneration") != generation:
            wanted["conditions"] = conditions.set_condition(
                current.get("conditions"), reasons.EDITED_IN_PLACE_TYPE, "True",
                reasons.EDITED_IN_PLACE, v1alpha1.template_edited_message(generation), now=now,
                observed_generation=generation)
    changed = {key: value for key, value in wanted.items() if current.get(key) != value}
    return changed or None
