"""A management cluster the way users make one: a fresh API server, `clusterctl init`, and our manager run from the
Deployment clusterctl installed. Several may run side by side (`clusterctl move` goes from one to another).

ManagementCluster starts, in order: a LocalControlPlane with no CRDs (clusterctl installs them all), the controllers
of kube-controller-manager a management cluster needs here (namespaces, garbage collection, ClusterRole aggregation),
and ClusterctlInit (devenv/clusterctl_init.py: cert-manager and the Cluster API managers keep running). What differs
between two of them is given, so they never collide:

- `service_address`: the local address the API server reaches webhook Services at (devenv/service_address.py); each
  management cluster has its own, e.g. 198.19.255.2 and 198.19.255.3;
- `serving_addresses`: where guests reach this API server through API gateways (its certificate lists them);
- operator(): our manager's pod (devenv/pod_runner.py), its metrics and health ports on free host ports, the
  container named after the workdir, so another management cluster's pod of the same Deployment can run beside it.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable

from devenv import autoscaling, pod_runner
from devenv.clusterctl_init import ClusterctlInit
from devenv.clusterctl_repository import Repository
from devenv.control_plane import LocalControlPlane, free_port
from devenv.service_address import ServiceAddress

OPERATOR = ("capi-libvirt-system", "capi-libvirt-controller-manager")  # our Deployment, as config/manager names it
OPERATOR_PORTS = (8080, 8081)  # its container's metrics and health ports (config/manager)


class ManagementCluster:
    """API server, kube-controller-manager and `clusterctl init`; a context manager. `plane` and `init` while it
    runs."""

    def __init__(self, workdir: pathlib.Path, repository: Repository, service_address: str, *,
                 serving_addresses: Iterable[str] = ()) -> None:
        self.workdir = workdir
        self.repository = repository
        self.plane = LocalControlPlane(workdir=workdir / "control-plane", serving_addresses=serving_addresses)
        self.address = ServiceAddress(service_address)
        self.init: ClusterctlInit | None = None
        self._controllers: autoscaling.KubeControllerManager | None = None

    def start(self) -> ManagementCluster:
        self.plane.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.plane.start()
            self._controllers = autoscaling.KubeControllerManager(self.plane,
                                                                  controllers=autoscaling.MANAGEMENT_CLUSTER)
            self._controllers.start()
            self.init = ClusterctlInit(self.plane, self.repository, self.workdir / "init", address=self.address)
            self.init.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            if self.init is not None:
                self.init.stop()
            if self._controllers is not None:
                self._controllers.stop()
        finally:
            self.plane.stop()

    def __enter__(self) -> ManagementCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def operator(self, folder: pathlib.Path) -> pod_runner.PodmanPod:
        """Our manager's pod as clusterctl installed it, on free host ports; not started."""
        namespace, deployment = OPERATOR
        return pod_runner.PodmanPod(self.plane, namespace, deployment, folder,
                                    port_map={port: free_port() for port in OPERATOR_PORTS},
                                    name=f"pod-{self.workdir.name}-{deployment}")
