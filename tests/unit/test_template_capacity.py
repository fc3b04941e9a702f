"""A template's capacity is what cluster-autoscaler needs to scale from zero: strings, sized from the spec."""

from __future__ import annotations

import pytest

from capi_libvirt.api import v1alpha1
from capi_libvirt.core import capacity

pytestmark = pytest.mark.unit


def test_capacity_is_quantity_strings_from_the_spec():
    spec = v1alpha1.LibvirtMachineSpec.model_validate(
        {"image": {"volume": "base"}, "cpus": 4, "memoryMiB": 8192, "diskGiB": 40}
    )
    assert capacity.template_capacity(spec) == {"cpu": "4", "memory": "8192Mi", "ephemeral-storage": "40Gi"}
    assert all(isinstance(v, str) for v in capacity.template_capacity(spec).values())
    assert capacity.template_node_info(spec) == {"architecture": "amd64", "operatingSystem": "linux"}
