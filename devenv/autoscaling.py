"""The workload-cluster side of autoscaling and of joining nodes, run against a LocalControlPlane: kube-scheduler,
kube-controller-manager (the node lifecycle controller; for joins, the CSR approver and signer, the bootstrap signer
and the token cleaner) and cluster-autoscaler (its clusterapi provider), each a child process built by
hack/build-upstream.sh. The kubelets are real: guests run them after `kubeadm join` (devenv/node_joins.py).

- kube-scheduler binds pending Pods to Nodes, as in any cluster; the node lifecycle controller lifts the not-ready
  taint of new Nodes once they are Ready.
- cluster-autoscaler with `--cloud-provider=clusterapi` scales MachineDeployments between their min/max annotations;
  the management and the workload cluster are the same API server, or two (a whole cluster's). On the management
  side it authenticates as the user given (the tests bind it only to config/autoscaler's ClusterRole, so a missing
  rule shows as a refusal in its log).

All listen on 127.0.0.1 only.
"""

from __future__ import annotations

import logging
import pathlib
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from devenv import paths
from devenv.control_plane import LocalControlPlane, free_port

log = logging.getLogger(__name__)

# cluster-autoscaler's clusterapi provider reads `infrastructureRef.apiVersion` of MachineDeployments (the v1beta1
# shape), so it talks v1beta1, which Cluster API's conversion webhook serves from the v1beta2 storage.
AUTOSCALER_ENV = {"CAPI_VERSION": "v1beta1"}

# Quick but sane timings for a test: a scan every 5 s, a node unneeded for 20 s goes.
AUTOSCALER_TIMINGS = {
    "scan-interval": "5s",
    "scale-down-unneeded-time": "20s",
    "scale-down-delay-after-add": "20s",
    "scale-down-delay-after-delete": "0s",
    "scale-down-delay-after-failure": "10s",
    "max-node-provision-time": "15m",
}


class UpstreamProcessError(RuntimeError):
    """An upstream program did not start, or died."""


class UpstreamProcess:
    """One upstream program as a child process, its output in a log file; a context manager."""

    name = "upstream"

    def __init__(self, workdir: pathlib.Path, env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.env = dict(env or {})
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> pathlib.Path:
        return self.workdir / f"{self.name}.log"

    def binary(self) -> pathlib.Path:
        raise NotImplementedError

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> UpstreamProcess:
        binary = self.binary()
        if not binary.exists():
            raise UpstreamProcessError(f"{binary} is missing: run `make upstream` (hack/build-upstream.sh)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as output:  # appended: a restart keeps what the last run said
            self.process = subprocess.Popen([str(binary), *self.argv()], stdout=output, stderr=subprocess.STDOUT,
                                            env={"PATH": "/usr/bin:/bin", **self.env}, start_new_session=True)
        log.info("started %s (pid %d), log %s", self.name, self.process.pid, self.log_path)
        time.sleep(0.5)
        self.check_alive()
        return self

    def check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise UpstreamProcessError(f"{self.name} exited; the end of its log:\n{self.log_tail()}")

    def restarted_if_exited(self) -> bool:
        """Start it again if it exited, as a Deployment's kubelet would (restartPolicy Always); True if it did."""
        if self.process is not None and self.process.poll() is None:
            return False
        log.warning("%s exited (%s); starting it again. The end of its log:\n%s", self.name,
                    None if self.process is None else self.process.returncode, self.log_tail(1500))
        self.process = None
        self.start()
        return True

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        log.info("stopped %s (pid %d, exit %s)", self.name, self.process.pid, self.process.returncode)
        self.process = None

    def __enter__(self) -> UpstreamProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KubeScheduler(UpstreamProcess):
    name = "kube-scheduler"

    def __init__(self, plane: LocalControlPlane) -> None:
        super().__init__(plane.workdir)
        self.kubeconfig = plane.kubeconfig_path

    def binary(self) -> pathlib.Path:
        return paths.kube_scheduler_binary()

    def argv(self) -> list[str]:
        return [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}"]


# The node lifecycle controller lifts the not-ready taint the API server puts on every new Node once the Node is Ready,
# and would taint Nodes whose heartbeats stop.
NODE_LIFECYCLE = ("node-lifecycle-controller",)
# What `kubeadm join` needs besides: bootstrap tokens' CSRs approved and signed (the kubelet's client certificate),
# cluster-info signed for each bootstrap token, expired tokens removed.
NODE_JOINS = (*NODE_LIFECYCLE, "certificatesigningrequest-approving-controller",
              "certificatesigningrequest-signing-controller", "bootstrap-signer-controller", "token-cleaner-controller")

# What a management cluster where `clusterctl init` runs needs (devenv/clusterctl_init.py): namespaces finish terminating
# (clusterctl deletes its cert-manager-test namespace after each check; one left Terminating fails the next init or
# upgrade), owner references are honoured, and aggregated ClusterRoles get their rules (Cluster API's manager roles are
# aggregated from its providers' labelled ones). Not the endpoint(slice) controllers: the test bed writes the slices.
MANAGEMENT_CLUSTER = ("namespace-controller", "garbage-collector-controller", "clusterrole-aggregation-controller")


class KubeControllerManager(UpstreamProcess):
    """kube-controller-manager running only the named controllers; the cluster CA is its CSR signing key."""

    name = "kube-controller-manager"

    def __init__(self, plane: LocalControlPlane, controllers: Sequence[str] = NODE_LIFECYCLE) -> None:
        super().__init__(plane.workdir)
        self.kubeconfig = plane.kubeconfig_path
        self.controllers = list(controllers)
        self.signing = (plane.ca_file, plane.ca_key_file)

    def binary(self) -> pathlib.Path:
        return paths.kube_controller_manager_binary()

    def argv(self) -> list[str]:
        return [f"--kubeconfig={self.kubeconfig}", f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                "--use-service-account-credentials=false",
                f"--cluster-signing-cert-file={self.signing[0]}", f"--cluster-signing-key-file={self.signing[1]}"]


class ClusterAutoscaler(UpstreamProcess):
    """cluster-autoscaler's clusterapi provider, discovering the node groups of the given namespaces."""

    name = "cluster-autoscaler"

    def __init__(self, plane: LocalControlPlane, kubeconfig: pathlib.Path, namespaces: Sequence[str],
                 own_namespace: str, timings: Mapping[str, str] = AUTOSCALER_TIMINGS,
                 management_kubeconfig: pathlib.Path | None = None) -> None:
        """`kubeconfig`: the workload cluster, where it reads Nodes and Pods and keeps its status ConfigMap and
        leader Lease (in `own_namespace`); `management_kubeconfig`: the management cluster, where its node groups
        are (in `namespaces`), the same API server unless given."""
        super().__init__(plane.workdir, env=AUTOSCALER_ENV)
        self.kubeconfig = kubeconfig
        self.management_kubeconfig = management_kubeconfig or kubeconfig
        self.namespaces = list(namespaces)
        self.own_namespace = own_namespace
        self.timings = dict(timings)

    def binary(self) -> pathlib.Path:
        return paths.cluster_autoscaler_binary()

    def argv(self) -> list[str]:
        discovery = [f"--node-group-auto-discovery=clusterapi:namespace={n}" for n in self.namespaces]
        return [
            "--cloud-provider=clusterapi",
            f"--kubeconfig={self.kubeconfig}",  # the workload cluster
            f"--cloud-config={self.management_kubeconfig}",  # the management cluster
            "--clusterapi-cloud-config-authoritative",
            f"--namespace={self.own_namespace}",
            *discovery,
            *(f"--{flag}={value}" for flag, value in self.timings.items()),
            "--leader-elect=true",  # as config/autoscaler runs it: a Lease in its own namespace
            f"--address=127.0.0.1:{free_port()}",
            "--skip-nodes-with-local-storage=false",
            "--expander=least-waste",
            "--logtostderr=true",
            "--v=2",
        ]

    def refusals(self) -> list[str]:
        """Lines of its log where the API server refused it something (RBAC)."""
        return [line for line in self.log_tail(10**7).splitlines() if "forbidden" in line.lower()]
