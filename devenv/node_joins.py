"""Guests of a libvirt host joining the local API server with `kubeadm join`, as the workers of a kubeadm cluster do.

While accepting_joins() runs: the host's guests reach the API server through an API gateway (TLS verified against
the cluster CA, for the gateway's address, which is in the API server's certificate); the API server is prepared the
way `kubeadm init` leaves it for joining nodes (kubeadm's own phases: its configuration, the kubelet's, cluster-info
naming the gateway, the bootstrap RBAC); and kube-controller-manager approves and signs the kubelets' CSRs, signs
cluster-info for every bootstrap token, removes expired tokens, and lifts new Nodes' not-ready taint once they are
Ready. Bootstrap tokens themselves come from whoever writes the join configuration (Cluster API's kubeadm bootstrap
provider).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from devenv.api_gateway import ApiGateway
from devenv.autoscaling import NODE_JOINS, KubeControllerManager
from devenv.control_plane import LocalControlPlane
from devenv.libvirt_host import LibvirtHost


@contextlib.contextmanager
def accepting_joins(plane: LocalControlPlane, host: LibvirtHost) -> Iterator[ApiGateway]:
    """The API server accepts `kubeadm join` from `host`'s guests; yields the gateway (its address and port are the
    control-plane endpoint to give joining nodes). `plane` must list the gateway's address in its
    `serving_addresses`."""
    with ApiGateway(host, plane) as gateway, KubeControllerManager(plane, NODE_JOINS):
        plane.accept_joins(gateway.url)
        yield gateway
