"""The manager as users run it: `capi-libvirt run` in a process of its own, as the user bound only to the shipped
ClusterRole and leader election Role, against the real API server. Probes and metrics answer, replicas elect one
leader over a Lease and the next one takes over when it goes (at once: the Lease is released), a leader that loses
its Lease exits, SIGTERM stops an operator cleanly, and JSON logs hold no credentials.

The operators watch the whole cluster, as the Deployment runs them. What they are checked on is their own: the
objects of the test's namespace, their metrics, their Lease. The election tests use a Lease of their own, so they
cannot see one another.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from capi_libvirt.api import meta
from capi_libvirt.operator import election, metrics
from devenv import control_plane as cp

from fixtures_control_plane import OPERATOR_USER, PROVIDER_NAMESPACE
from waiting import CONVERGENCE_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DEADLINE_S = CONVERGENCE_S
EXIT_TIMEOUT_S = 60.0
CLUSTER = "LibvirtCluster"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{PROVIDER_NAMESPACE}/leases"
MARKER = "c2VjcmV0LWtleS1tYXRlcmlhbA-json-logs-marker"
FAKE_PEM = f"-----BEGIN PRIVATE KEY-----\n{MARKER}\n-----END PRIVATE KEY-----\n".encode()


class OperatorProcess:
    """`python -m capi_libvirt.cli run ...` with the restricted user's kubeconfig, its log in a file."""

    def __init__(self, plane: cp.LocalControlPlane, log: pathlib.Path, *args: str, verbose: bool = False,
                 env: dict[str, str] | None = None) -> None:
        self.health, self.metrics_port, self.log = cp.free_port(), cp.free_port(), log
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig_for(OPERATOR_USER)), **(env or {})}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "capi_libvirt.cli", *(["-v"] if verbose else []), "run", *args,
                 "--health-address", f"127.0.0.1:{self.health}", "--metrics-address", f"127.0.0.1:{self.metrics_port}"],
                stdout=output, stderr=subprocess.STDOUT, env=env)

    async def get(self, port: int, path: str) -> tuple[int, str]:
        """(HTTP status, body); (0, why) while nothing answers."""
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
                async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                    return response.status, await response.text()
        except (TimeoutError, aiohttp.ClientError) as error:
            return 0, type(error).__name__

    async def readiness(self) -> tuple[int, dict]:
        status, body = await self.get(self.health, "/readyz")
        return status, json.loads(body) if status else {"problem": body}

    async def wait_ready(self) -> dict:
        async def ready() -> dict | None:
            assert self.process.poll() is None, f"the operator exited:\n{self.tail()}"
            status, report = await self.readiness()
            return report if status == 200 else None
        return await wait_until("the operator to be ready", ready, DEADLINE_S)

    async def reconciles(self, kind: str) -> float:
        """capi_libvirt_reconciles_total of the kind, all results together."""
        status, text = await self.get(self.metrics_port, "/metrics")
        assert status == 200, text
        return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == "capi_libvirt_reconciles_total" and sample.labels.get("kind") == kind)

    async def reconciled_since(self, before: float) -> bool:
        return await self.reconciles(CLUSTER) > before

    def terminate(self) -> int:
        """SIGTERM, then the exit code (a failure if it does not exit in EXIT_TIMEOUT_S)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the operator did not exit within {EXIT_TIMEOUT_S:.0f}s of SIGTERM:\n{self.tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def lease(control_plane: cp.LocalControlPlane) -> str:
    """A Lease name of the test's own (the first replica creates it); removed at the end."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(cp.ControlPlaneError):
        control_plane.request("DELETE", f"{LEASES}/{name}")


def holder(plane: cp.LocalControlPlane, name: str) -> str | None:
    """The Lease's holderIdentity ("" once released), or None while there is no Lease."""
    try:
        return plane.request("GET", f"{LEASES}/{name}")["spec"].get("holderIdentity", "")
    except cp.ControlPlaneError as error:
        if error.status == 404:
            return None
        raise


@pytest.fixture
def operators(control_plane: cp.LocalControlPlane, tmp_path: pathlib.Path):
    """Start operators with `start(*args)`; whatever still runs at the end is killed."""
    started: list[OperatorProcess] = []

    def start(*args: str, verbose: bool = False, env: dict[str, str] | None = None) -> OperatorProcess:
        log = tmp_path / f"operator-{len(started)}.log"
        started.append(OperatorProcess(control_plane, log, *args, verbose=verbose, env=env))
        return started[-1]
    yield start
    for operator in started:
        operator.stop()


async def create_libvirt_cluster(api_client: client.ApiClient, namespace: str, name: str) -> None:
    """No owner Cluster: the reconcile only writes a status that says it waits for one (no libvirt involved)."""
    await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        meta.GROUP, meta.VERSION, namespace, "libvirtclusters",
        {"apiVersion": meta.API_VERSION, "kind": "LibvirtCluster", "metadata": {"name": name}, "spec": {}})


async def wait_for_status(api_client: client.ApiClient, namespace: str, name: str) -> dict:
    async def status() -> dict | None:
        body = await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, namespace, "libvirtclusters", name)
        return body.get("status", {}).get("conditions")
    return await wait_until(f"LibvirtCluster {name} to get a status", status, DEADLINE_S)


# -- probes and metrics -----------------------------------------------------------------------------------------------

async def test_restricted_operator_leads_over_the_default_lease_and_serves_its_metrics(control_plane,
                                                                                      operators) -> None:
    operator = operators("--log-format", "json")  # the Deployment's election: the default Lease
    report = await operator.wait_ready()
    assert report["role"] == election.LEADER
    assert report["lease"] == f"{PROVIDER_NAMESPACE}/{election.DEFAULT_LEASE_NAME}"
    assert holder(control_plane, election.DEFAULT_LEASE_NAME) == report["identity"]
    assert await operator.get(operator.health, "/healthz") == (200, '{"alive": true}')

    status, text = await operator.get(operator.metrics_port, "/metrics")
    assert status == 200
    exposed = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    assert set(metrics.NAMES) <= exposed, f"missing: {set(metrics.NAMES) - exposed}"
    assert f"{metrics.LEADER} 1.0" in text.splitlines()
    assert operator.terminate() == 0
    assert holder(control_plane, election.DEFAULT_LEASE_NAME) == ""  # released


# -- leader election ---------------------------------------------------------------------------------------------------

async def roles(*operators: OperatorProcess) -> list[str | None]:
    return [(await operator.readiness())[1].get("role") for operator in operators]


async def test_one_of_two_replicas_works_and_the_other_takes_over_when_it_stops(
        api_client, control_plane, lease, operators, namespace) -> None:
    pair = [operators("--leader-election-id", lease, "--log-format", "json") for _ in range(2)]
    for operator in pair:
        await operator.wait_ready()  # a standby is ready too: it stands by

    async def one_leader() -> list[OperatorProcess] | None:
        found = await roles(*pair)
        if sorted(found, key=str) != [election.LEADER, election.STANDBY]:
            return None
        return pair if found[0] == election.LEADER else pair[::-1]
    leader, standby = await wait_until("one leader and one standby", one_leader, DEADLINE_S)
    leader_identity = (await leader.readiness())[1]["identity"]
    assert holder(control_plane, lease) == leader_identity

    async def standing_by_for_the_leader() -> bool:  # (its first try may have met the leader's create: a 409)
        return (await standby.readiness())[1].get("problem") == f"held by {leader_identity}"
    await wait_until("the standby to see the leader's Lease", standing_by_for_the_leader, DEADLINE_S)
    before = {operator: await operator.reconciles(CLUSTER) for operator in pair}

    await create_libvirt_cluster(api_client, namespace, "first")
    await wait_for_status(api_client, namespace, "first")
    await wait_until("the leader to reconcile it", lambda: leader.reconciled_since(before[leader]), DEADLINE_S)
    assert await standby.reconciles(CLUSTER) == before[standby]  # the standby runs no kopf at all

    assert leader.terminate() == 0
    assert holder(control_plane, lease) in ("", (await standby.readiness())[1]["identity"])  # released on exit

    async def took_over() -> bool:
        return (await roles(standby)) == [election.LEADER]
    await wait_until("the standby to lead", took_over, DEADLINE_S)
    await create_libvirt_cluster(api_client, namespace, "second")
    await wait_for_status(api_client, namespace, "second")
    await wait_until("the new leader to reconcile", lambda: standby.reconciled_since(before[standby]), DEADLINE_S)
    assert standby.terminate() == 0


async def test_a_leader_that_loses_its_lease_stops(control_plane, lease, operators) -> None:
    """Another holder written into the Lease (as after a network partition, when a standby took it over): the leader
    can no longer renew, and once its renew deadline passes it exits with an error, for its pod to restart."""
    operator = operators("--leader-election-id", lease, "--leader-elect-lease-duration=20s",
                         "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=1s", "--log-format", "plain")
    assert (await operator.wait_ready())["role"] == election.LEADER
    body = control_plane.request("GET", f"{LEASES}/{lease}")
    body["spec"] |= {"holderIdentity": "someone-else", "renewTime": election.micro_time(election._now())}
    control_plane.request("PUT", f"{LEASES}/{lease}", body)

    async def exited() -> int | None:
        return operator.process.poll()
    assert await wait_until("the leader to exit", exited, DEADLINE_S) == 1, operator.tail()
    log = operator.log.read_text()
    assert "leader election lost" in log and "held by someone-else" in log, operator.tail()
    assert holder(control_plane, lease) == "someone-else"  # not released: it was not ours any more


async def test_without_the_right_to_its_lease_the_operator_is_not_ready_and_says_why(operators) -> None:
    """In a namespace where the leader election Role is not bound (the provider's namespace taken from POD_NAMESPACE,
    as in a pod), the Lease is refused: not ready, alive, and the reason is on /readyz."""
    operator = operators("--leader-election-id", f"refused-{uuid.uuid4().hex[:8]}", env={"POD_NAMESPACE": "default"})

    async def explained() -> dict | None:
        assert operator.process.poll() is None, operator.tail()
        status, report = await operator.readiness()
        return report if status == 503 and "403" in report.get("problem", "") else None
    report = await wait_until("a 503 that names the refused Lease", explained, DEADLINE_S)
    assert report["role"] is None and report["problem"].startswith("Lease default/refused-")
    assert (await operator.get(operator.health, "/healthz"))[0] == 200  # alive all the same: no restart loop
    assert operator.terminate() == 0  # a SIGTERM while not leading ends it cleanly too


# -- graceful shutdown -------------------------------------------------------------------------------------------------

async def test_sigterm_stops_the_operator_cleanly(control_plane, lease, operators) -> None:
    operator = operators("--leader-election-id", lease, "--log-format", "plain")
    identity = (await operator.wait_ready())["identity"]
    assert holder(control_plane, lease) == identity
    assert operator.terminate() == 0
    assert holder(control_plane, lease) == ""
    log = operator.log.read_text()
    assert "Signal SIGTERM is received. Operator is stopping." in log and "released Lease" in log
    assert "Traceback" not in log, operator.tail()


async def test_namespace_flag_watches_only_that_namespace(api_client, lease, operators, namespace) -> None:
    """The contract's `--namespace`: objects there are reconciled, objects elsewhere are not, and the restricted
    user is refused nothing on the way (kopf resolves the namespaces it is given by listing them)."""
    other = f"{namespace}-other"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    try:
        operator = operators("--leader-election-id", lease, "--namespace", namespace, "--log-format", "plain")
        await operator.wait_ready()
        await create_libvirt_cluster(api_client, namespace, "watched")
        await create_libvirt_cluster(api_client, other, "not-watched")
        await wait_for_status(api_client, namespace, "watched")
        # One more in the watched namespace, made after the other one: by the time it has its status, an operator
        # that watched the other namespace would have reconciled the object there too.
        await create_libvirt_cluster(api_client, namespace, "watched-later")
        await wait_for_status(api_client, namespace, "watched-later")
        body = await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            meta.GROUP, meta.VERSION, other, "libvirtclusters", "not-watched")
        assert "status" not in body and not body["metadata"].get("finalizers")
        assert operator.terminate() == 0
        assert "forbidden" not in operator.log.read_text().lower(), operator.tail()
    finally:
        await client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            meta.GROUP, meta.VERSION, other, "libvirtclusters", "not-watched")
        await core.delete_namespace(other)


# -- structured logs ---------------------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def host_with_credentials(api_client: client.ApiClient) -> AsyncIterator[str]:
    """A LibvirtHost over qemu+tls to a closed port, its credentials Secret holding MARKER in every key; removed
    at the end, which needs a running operator to take its finalizer off."""
    name = f"json-logs-{uuid.uuid4().hex[:6]}"
    namespace = PROVIDER_NAMESPACE  # where host credentials must live
    await client.CoreV1Api(api_client).create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name=name),
        data={key: base64.b64encode(FAKE_PEM).decode() for key in ("ca.crt", "tls.crt", "tls.key")}))
    objects = client.CustomObjectsApi(api_client)
    await objects.create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
        "spec": {"uri": f"qemu+tls://127.0.0.1:{cp.free_port()}/system",
                 "credentialsSecretRef": {"name": name, "namespace": namespace}}})
    try:
        yield name
    finally:
        await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)
        await wait_until("the LibvirtHost to be removed", lambda: _host_gone(objects, name), DEADLINE_S)
        await client.CoreV1Api(api_client).delete_namespaced_secret(name, namespace)


async def _host_gone(objects: client.CustomObjectsApi, name: str) -> bool:
    hosts = await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")
    return name not in {h["metadata"]["name"] for h in hosts["items"]}


async def test_json_logs_are_json_lines_without_credentials(api_client, operators, namespace) -> None:
    operator = operators("--standalone", "--log-format", "json", verbose=True)
    assert (await operator.wait_ready())["role"] == election.STANDALONE
    async with host_with_credentials(api_client) as name:
        async def refused() -> dict | None:
            body = await client.CustomObjectsApi(api_client).get_cluster_custom_object(
                meta.GROUP, meta.VERSION, "libvirthosts", name)
            return body.get("status") if body.get("status", {}).get("reachable") is False else None
        await wait_until("the host's credentials to be used and the host found unreachable", refused, DEADLINE_S)
        await operator.wait_ready()
    assert operator.terminate() == 0
    lines = operator.log.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"message", "severity", "timestamp", "logger"} <= record.keys() for record in records)
    assert any(record.get("object", {}).get("kind") == "LibvirtHost" for record in records)  # kopf's object field
    secret_text = [MARKER, base64.b64encode(FAKE_PEM).decode()[:40]]  # as is, and as the API returns Secrets
    assert not [line for line in lines if any(text in line for text in secret_text)]


PROBE_A_TLS_HOST = """
import asyncio, os, pathlib, sys
from capi_libvirt.hypervisor import credentials, errors
from capi_libvirt.hypervisor import host as host_api
folder, uri = pathlib.Path(sys.argv[1]), sys.argv[2]
secret = credentials.Credentials({key: (folder / name).read_bytes() for key, name in
                                  (("ca.crt", "ca.pem"), ("tls.crt", "client.pem"), ("tls.key", "client.key"))})
async def probe():
    host = host_api.libvirt_host("refusing", uri, secret, None)
    try:
        await host.probe("default", None, [], False)
    except errors.HostUnreachable as error:
        print(error.message)
    finally:
        host.close()
asyncio.run(probe())
print("children inherit LIBVIRT_LOG_OUTPUTS:", "LIBVIRT_LOG_OUTPUTS" in os.environ)
"""


def test_libvirts_own_warnings_stay_out_of_the_operators_output(tmp_path: pathlib.Path) -> None:
    """A TLS host whose certificate the client refuses: libvirt's client library warns about it on stderr unless told
    otherwise (it did in a JSON log); the hypervisor package tells it, for its own process only, and the refusal
    still comes as an error."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=ca",
            "-days", "1")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr", "-subj",
            "/CN=client")
    (tmp_path / "client.ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "client.pem", "-days", "1", "-extfile", "client.ext")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.pem", "-subj",
            "/CN=127.0.0.1", "-days", "1")  # its own issuer: not the client's CA
    port = cp.free_port()
    server = subprocess.Popen(["openssl", "s_server", "-accept", f"127.0.0.1:{port}", "-cert", "server.pem", "-key",
                               "server.key", "-quiet"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        env = {k: v for k, v in os.environ.items() if k != "LIBVIRT_LOG_OUTPUTS"}
        done = subprocess.run([sys.executable, "-c", PROBE_A_TLS_HOST, str(tmp_path), f"qemu+tls://127.0.0.1:{port}/system"],
                              capture_output=True, text=True, timeout=60, env=env)
    finally:
        server.terminate()
        server.wait()
    assert done.returncode == 0, done.stderr
    assert "certificate" in done.stdout.lower(), done.stdout  # the refusal, as the provider's error
    assert done.stderr == "", f"libvirt wrote to stderr: {done.stderr}"
    assert "children inherit LIBVIRT_LOG_OUTPUTS: False" in done.stdout, "a libvirtd it starts would log nothing"


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on 127.0.0.1:{port}")
        time.sleep(0.1)
