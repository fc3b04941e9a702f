"""Cluster API's objects as the provider reads them: typed, read-only views of an owner Machine and of a Cluster,
made once from the API's body, so the reconciles ask `machine.node_joined` rather than walk dictionaries. Pure.

Both read Cluster API's v1beta2 fields and, where v1beta1 kept the same fact elsewhere, that place too (a Cluster's
`status.infrastructureReady`, its ControlPlaneInitialized condition)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class MachineView:
    """The owner Machine: its name, its Cluster, its bootstrap data Secret, its failure domain, its Node."""

    name: str
    cluster_name: str | None = None  # spec.clusterName
    bootstrap_secret: str | None = None  # spec.bootstrap.dataSecretName: set once the bootstrap provider wrote it
    failure_domain: str | None = None  # spec.failureDomain
    node_name: str | None = None  # status.nodeRef.name: Cluster API matched the Node (the node joined)

    @property
    def node_joined(self) -> bool:
        return bool(self.node_name)

    @classmethod
    def of(cls, body: dict[str, Any]) -> MachineView:
        spec, status = body.get("spec") or {}, body.get("status") or {}
        return cls(name=str((body.get("metadata") or {}).get("name") or ""),
                   cluster_name=spec.get("clusterName") or None,
                   bootstrap_secret=(spec.get("bootstrap") or {}).get("dataSecretName") or None,
                   failure_domain=spec.get("failureDomain") or None,
                   node_name=(status.get("nodeRef") or {}).get("name") or None)


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """A Cluster: its name, whether it is paused, whether its infrastructure is provisioned and its control plane
    initialized (the workload cluster's API server answers)."""

    name: str
    paused: bool = False
    infrastructure_provisioned: bool = False
    control_plane_initialized: bool = False

    @classmethod
    def of(cls, body: dict[str, Any]) -> ClusterView:
        status = body.get("status") or {}
        initialization = status.get("initialization") or {}
        return cls(name=str((body.get("metadata") or {}).get("name") or ""),
                   paused=bool((body.get("spec") or {}).get("paused")),
                   infrastructure_provisioned=bool(initialization.get("infrastructureProvisioned")
                                                   or status.get("infrastructureReady")),
                   control_plane_initialized=bool(initialization.get("controlPlaneInitialized") or any(
                       c.get("type") == "ControlPlaneInitialized" and c.get("status") == "True"
                       for c in status.get("conditions") or [])))
