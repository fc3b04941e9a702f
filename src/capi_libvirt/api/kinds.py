"""The provider's kinds: names, spec and status models, and how `kubectl get` prints them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pydantic

from capi_libvirt.api import v1alpha1, v1alpha1_host

CLUSTER_NAME_LABEL = r".metadata.labels['cluster\.x-k8s\.io/cluster-name']"


@dataclasses.dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


@dataclasses.dataclass(frozen=True)
class Kind:
    """One custom resource kind: everything its CRD is generated from."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec: type[pydantic.BaseModel]
    status: type[pydantic.BaseModel] | None
    description: str
    columns: tuple[PrinterColumn, ...] = ()
    categories: tuple[str, ...] = ("cluster-api",)
    # CEL rules from the generated spec schema
    spec_validations: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    scope: str = "Namespaced"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date", "Time since creation")
CLUSTER = PrinterColumn("Cluster", CLUSTER_NAME_LABEL, "string", "Cluster this object belongs to")

LIBVIRT_CLUSTER = Kind(
    kind="LibvirtCluster",
    plural="libvirtclusters",
    short_names=("lvc",),
    spec=v1alpha1.LibvirtClusterSpec,
    status=v1alpha1.LibvirtClusterStatus,
    description="The infrastructure of a Cluster API cluster whose machines run on plain KVM/libvirt hosts.",
    columns=(
        CLUSTER,
        PrinterColumn("Provisioned", ".status.initialization.provisioned", "boolean", "Infrastructure provisioned"),
        PrinterColumn("Endpoint", ".spec.controlPlaneEndpoint.host", "string", "Control-plane endpoint host"),
        AGE,
    ),
)

LIBVIRT_CLUSTER_TEMPLATE = Kind(
    kind="LibvirtClusterTemplate",
    plural="libvirtclustertemplates",
    short_names=("lvct",),
    spec=v1alpha1.LibvirtClusterTemplateSpec,
    status=None,
    description="A template of LibvirtClusters, used by ClusterClass.",
    columns=(AGE,),
)

LIBVIRT_MACHINE = Kind(
    kind="LibvirtMachine",
    plural="libvirtmachines",
    short_names=("lvm",),
    spec=v1alpha1.LibvirtMachineSpec,
    status=v1alpha1.LibvirtMachineStatus,
    description="A Cluster API machine that is a libvirt domain on a KVM/libvirt host.",
    spec_validations=v1alpha1.machine_spec_immutability,
    columns=(
        CLUSTER,
        PrinterColumn("Host", ".status.host", "string", "Host the domain lives on"),
        PrinterColumn("State", ".status.state", "string", "Domain state"),
        PrinterColumn("ProviderID", ".spec.providerID", "string", "libvirt://<host>/<domain-uuid>"),
        PrinterColumn("Address", ".status.addresses[?(@.type=='InternalIP')].address", "string", "Internal address"),
        PrinterColumn("Ready", ".status.ready", "boolean", "Machine provisioned", priority=1),
        AGE,
    ),
)

LIBVIRT_MACHINE_TEMPLATE = Kind(
    kind="LibvirtMachineTemplate",
    plural="libvirtmachinetemplates",  # cluster-autoscaler derives exactly this from the kind: lower(kind) + "s"
    short_names=("lvmt",),
    spec=v1alpha1.LibvirtMachineTemplateSpec,
    status=v1alpha1.LibvirtMachineTemplateStatus,
    description="A template of LibvirtMachines, referred to by MachineDeployments and control planes.",
    columns=(
        PrinterColumn("CPU", ".status.capacity.cpu", "string", "CPUs of one machine"),
        PrinterColumn("Memory", ".status.capacity.memory", "string", "Memory of one machine"),
        AGE,
    ),
)

LIBVIRT_HOST = Kind(
    kind="LibvirtHost",
    plural="libvirthosts",
    short_names=("lvh",),
    spec=v1alpha1_host.LibvirtHostSpec,
    status=v1alpha1_host.LibvirtHostStatus,
    description="A KVM/libvirt hypervisor of the inventory: how to reach it, its failure domain and overcommit, and "
                "what the health probe sees. Cluster-scoped: machines of any cluster and namespace share hosts.",
    columns=(
        PrinterColumn("URI", ".spec.uri", "string", "libvirt URI"),
        PrinterColumn("FailureDomain", ".spec.failureDomain", "string", "Failure domain"),
        PrinterColumn("Reachable", ".status.reachable", "boolean", "Reached by the last probe"),
        PrinterColumn("Machines", ".status.machines", "integer", "Domains of this provider"),
        PrinterColumn("FreeMemory", ".status.freeMemoryMiB", "integer", "Free memory (MiB)"),
        PrinterColumn("ForeignVMs", ".status.foreignVMs", "integer", "Running domains not of this provider"),
        AGE,
    ),
    scope="Cluster",
    spec_validations=v1alpha1_host.host_spec_immutability,
)

ALL = (LIBVIRT_CLUSTER, LIBVIRT_CLUSTER_TEMPLATE, LIBVIRT_MACHINE, LIBVIRT_MACHINE_TEMPLATE, LIBVIRT_HOST)
