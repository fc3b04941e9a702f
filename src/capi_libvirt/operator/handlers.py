"""kopf handlers: each turns an event on one kind into a call of that kind's reconcile. No logic lives here."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pydantic

from capi_libvirt.api import kinds, meta, v1alpha1
from capi_libvirt.core import capacity

log = logging.getLogger(__name__)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{meta.GROUP}/libvirt"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="capi-libvirt.x-k8s.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="capi-libvirt.x-k8s.io")
    settings.posting.level = logging.WARNING  # events for warnings and errors only; reconciles post their own


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_kubeconfig(**kwargs) or kopf.login_with_service_account(**kwargs)


@kopf.on.resume(meta.GROUP, meta.VERSION, kinds.LIBVIRT_MACHINE_TEMPLATE.plural)
@kopf.on.create(meta.GROUP, meta.VERSION, kinds.LIBVIRT_MACHINE_TEMPLATE.plural)
@kopf.on.update(meta.GROUP, meta.VERSION, kinds.LIBVIRT_MACHINE_TEMPLATE.plural, field="spec")
def reconcile_machine_template(spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    """Keep status.capacity and status.nodeInfo in step with the template, for scale-from-zero."""
    try:
        template = v1alpha1.LibvirtMachineTemplateSpec.model_validate(dict(spec))
    except pydantic.ValidationError as error:
        raise kopf.PermanentError(f"invalid template spec: {error}") from None
    machine = template.template.spec
    patch.status["capacity"] = capacity.template_capacity(machine)
    patch.status["nodeInfo"] = capacity.template_node_info(machine)
