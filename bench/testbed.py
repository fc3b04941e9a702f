"""The bench's test bed: a fresh kube-apiserver, one libvirt host reached over qemu+tls as users reach theirs, a
guest that costs almost nothing, and the operator as a process of its own (so its CPU and memory are its own).

The guest is Debian's iPXE image (package `ipxe`) converted to qcow2: it boots in a second or two under software
emulation and takes a DHCP lease, so "provisioned" means a real address found the way the provider finds one, while
50 of them fit in a few GiB. Two host settings make a burst of N possible on a 2-core machine, and users with large
bursts need the same: a CPU overcommit high enough that N one-vCPU machines fit, and dnsmasq's `no-ping` (without it
dnsmasq pings every address before offering it, which serialises DHCP during a burst, and impatient DHCP clients
such as iPXE give up at N >= 8).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import libvirt

from capi_libvirt.api import meta
from devenv import control_plane, ipxe_image, libvirt_host, paths
from devenv.remote_access import RemoteAccess

REPO = pathlib.Path(__file__).resolve().parents[1]
IPXE_ISO, BASE_VOLUME = ipxe_image.IPXE_ISO, ipxe_image.BASE_VOLUME
NAMESPACE, CLUSTER = "bench", "bench"
HOST, SUBNET, LINK_INDEX = "bench", "192.168.160.0/22", 160  # room for 1,000 leases; link 198.18.160.0/30
# The test tier's smoke run: a host of its own, so it can go on beside a `make bench`.
SMOKE_HOST, SMOKE_SUBNET, SMOKE_LINK_INDEX = "bench-smoke", "192.168.164.0/24", 164
CPU_OVERCOMMIT = 64.0  # vCPUs per host CPU: the most a LibvirtHost allows, so 100 one-vCPU guests fit on 2 cores


def machine_spec(pool: str, network: str) -> dict:
    """The LibvirtMachine spec of every bench machine (the floor defines the very same domain)."""
    return ipxe_image.machine_spec(pool, network)


class Bed:
    """Everything a bench run needs, started by `up()` and stopped by leaving the context."""

    def __init__(self, workdir: pathlib.Path, smoke: bool = False) -> None:
        """`smoke`: a host of another name, subnet and link, so the test tier's run can go on beside a `make bench`."""
        self.workdir = workdir
        self.host_name, self.subnet, self.link_index = \
            (SMOKE_HOST, SMOKE_SUBNET, SMOKE_LINK_INDEX) if smoke else (HOST, SUBNET, LINK_INDEX)
        self.plane: control_plane.LocalControlPlane | None = None
        self.access: RemoteAccess | None = None
        self.operator: subprocess.Popen | None = None
        self.metrics_port = control_plane.free_port()

    @property
    def host(self) -> libvirt_host.LibvirtHost:
        assert self.access is not None
        return self.access.host

    @property
    def tls_uri(self) -> str:
        assert self.access is not None
        return self.access.tls_uri()

    @contextlib.contextmanager
    def up(self) -> Iterator[Bed]:
        with contextlib.ExitStack() as stack:
            crd_dirs = [REPO / "config" / "crd", paths.cluster_api_crd_dir()]
            (self.workdir / "control-plane").mkdir(parents=True, exist_ok=True)
            self.plane = stack.enter_context(control_plane.LocalControlPlane(
                workdir=self.workdir / "control-plane", crd_dirs=crd_dirs))
            host = libvirt_host.LibvirtHost(self.host_name, self.subnet, dnsmasq_options=["no-ping"],
                                            log_dir=self.workdir / "libvirt-logs")
            self.access = stack.enter_context(RemoteAccess(host, self.link_index))
            with self.connect() as conn:
                ipxe_image.upload_base(conn, host.pool_name, ipxe_image.ipxe_qcow2(self.workdir))
            self._create_objects()
            stack.callback(self.stop_operator)
            yield self

    @contextlib.contextmanager
    def connect(self) -> Iterator[libvirt.virConnect]:
        conn = libvirt.open(self.tls_uri)
        try:
            yield conn
        finally:
            conn.close()

    def _create_objects(self) -> None:
        """The namespace, a Cluster whose infrastructure is provisioned, and the LibvirtHost with its TLS Secret."""
        assert self.plane is not None and self.access is not None
        plane, folder = self.plane, self.access.client_dir
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        capi = f"/apis/{meta.CAPI_GROUP}/{meta.CAPI_VERSION}/namespaces/{NAMESPACE}/clusters"
        plane.request("POST", capi, {"apiVersion": f"{meta.CAPI_GROUP}/{meta.CAPI_VERSION}", "kind": "Cluster",
                                     "metadata": {"name": CLUSTER},
                                     "spec": {"infrastructureRef": {"apiGroup": meta.GROUP, "kind": "LibvirtCluster",
                                                                    "name": CLUSTER}}})
        plane.request("PATCH", f"{capi}/{CLUSTER}/status",
                      {"status": {"initialization": {"infrastructureProvisioned": True}}},
                      content_type="application/merge-patch+json")
        data = {"ca.crt": folder / "cacert.pem", "tls.crt": folder / "clientcert.pem", "tls.key": folder / "clientkey.pem"}
        plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": meta.PROVIDER_NAMESPACE}})
        plane.request("POST", f"/api/v1/namespaces/{meta.PROVIDER_NAMESPACE}/secrets", {  # host credentials live there
            "metadata": {"name": "bench-host"},
            "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in data.items()}})
        plane.request("POST", f"/apis/{meta.GROUP}/{meta.VERSION}/libvirthosts", {
            "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": self.host_name},
            "spec": {"uri": f"qemu+tls://{self.access.address}/system", "storagePool": self.host.pool_name,
                     "credentialsSecretRef": {"name": "bench-host", "namespace": meta.PROVIDER_NAMESPACE},
                     "access": {"images": [BASE_VOLUME], "networks": [self.host.network_name]},
                     "overcommit": {"cpu": CPU_OVERCOMMIT}}})

    def start_operator(self, extra_args: list[str] = ()) -> None:
        """`capi-libvirt run` as a process; with $BENCH_PROFILE set, under cProfile writing there at its exit; with
        $BENCH_OPERATOR_SRC (another checkout's src/), that checkout's operator."""
        assert self.plane is not None
        log = (self.workdir / "operator.log").open("ab")
        env = dict(os.environ, KUBECONFIG=str(self.plane.kubeconfig_path))
        if os.environ.get("BENCH_OPERATOR_SRC"):  # another checkout's operator (a before/after comparison)
            env["PYTHONPATH"] = os.environ["BENCH_OPERATOR_SRC"]
        profile = ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]] if os.environ.get("BENCH_PROFILE") else []
        self.operator = subprocess.Popen(
            [sys.executable, *profile, "-m", "bench.as_shipped", "capi_libvirt", "run", "--standalone", "--log-format", "plain",
             "--health-address", "0", "--metrics-address", f"127.0.0.1:{self.metrics_port}", *extra_args],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while f'capi_libvirt_host_reachable{{host="{self.host_name}"}} 1.0' not in self.operator_metrics():
            if self.operator.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the operator did not start or reach the host; see {self.workdir / 'operator.log'}")
            time.sleep(0.5)

    def stop_operator(self) -> None:
        stop_operator(self.operator)
        self.operator = None

    def operator_metrics(self) -> str:
        return operator_metrics(self.metrics_port)

    def apiserver_metrics(self) -> str:
        assert self.plane is not None
        return self.plane.request("GET", "/metrics", accept="text/plain")


def stop_operator(operator: subprocess.Popen | None) -> None:
    """SIGTERM, as a Deployment stops its pod; SIGKILL after 60 s."""
    if operator is not None and operator.poll() is None:
        operator.send_signal(signal.SIGTERM)
        try:
            operator.wait(60)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait()


def operator_metrics(port: int) -> str:
    """The operator's /metrics text ("" while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


def new_workdir() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="capi-libvirt-bench-"))


def dump(path: pathlib.Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
