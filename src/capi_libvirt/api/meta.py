"""Shapes shared by every kind: the model base, metav1.Condition, addresses and the Cluster API contract fields."""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import alias_generators

GROUP = "infrastructure.cluster.x-k8s.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Cluster API's own names this provider reads.
CAPI_GROUP = "cluster.x-k8s.io"
CAPI_VERSION = "v1beta2"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"
WATCH_FILTER_LABEL = "cluster.x-k8s.io/watch-filter"  # --watch-filter VALUE: only objects with this label = VALUE

# The provider's namespace, ServiceAccount and the ClusterRole that lets it read Secrets: bound only by RoleBindings,
# one in the provider's namespace (LibvirtHost credentials live there) and one in each namespace it serves (bootstrap
# data, <cluster>-kubeconfig), which the cluster templates ship (config/rbac, api.templates).
PROVIDER_NAMESPACE = "capi-libvirt-system"
PROVIDER_SERVICE_ACCOUNT = "capi-libvirt-manager"
SECRETS_CLUSTER_ROLE = "capi-libvirt-secrets"

# A DNS-1123 label / subdomain: what Kubernetes accepts for names, and what we accept for host and pool names.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONDITION_TYPE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Model(pydantic.BaseModel):
    """Base of every API model: camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = pydantic.ConfigDict(
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the Kubernetes API expects it: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(Model):
    """A metav1.Condition: one aspect of the object's state, with the time it last changed."""

    type: str = pydantic.Field(pattern=CONDITION_TYPE, max_length=316)
    """Type of the condition, in CamelCase (Ready, Provisioned, Paused, ...)."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    observed_generation: int | None = pydantic.Field(default=None, ge=0)
    """The .metadata.generation the condition was computed from."""
    last_transition_time: str = pydantic.Field(json_schema_extra={"format": "date-time"})
    """When the status last changed (not when the condition was last computed)."""
    reason: str = pydantic.Field(pattern=CONDITION_REASON, min_length=1, max_length=1024)
    """Why the condition has its status, in CamelCase: what the object waits for or what failed."""
    message: str = pydantic.Field(default="", max_length=32768)
    """Human-readable details."""


class MachineAddress(Model):
    """An address of a machine, as Cluster API reads it."""

    type: Literal["Hostname", "ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS"]
    """The kind of address."""
    address: str = pydantic.Field(min_length=1, max_length=256)
    """The address itself."""


class Initialization(Model):
    """The v1beta2 contract's initialization status."""

    provisioned: bool | None = None
    """True once the infrastructure is provisioned; Cluster API then moves on."""


class APIEndpoint(Model):
    """Where the workload cluster's API server is reached."""

    host: str = pydantic.Field(min_length=1, max_length=512)
    """Host name or IP address."""
    port: int = pydantic.Field(ge=1, le=65535)
    """TCP port."""


class FailureDomain(Model):
    """A failure domain the cluster's machines can be spread over (v1beta2 list form)."""

    name: str = pydantic.Field(min_length=1, max_length=256)
    """Name of the failure domain, as Machine.spec.failureDomain refers to it."""
    control_plane: bool | None = None
    """Whether control-plane machines may be placed in it."""
    attributes: dict[str, str] | None = None
    """Free-form attributes of the failure domain."""
