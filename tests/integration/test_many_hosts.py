"""Many hosts: an inventory of LibvirtHosts reached over qemu+tls and qemu+ssh with verification on, health in their
status, placement that spreads a burst over hosts and failure domains, waits with numbers when nothing fits, and the
failure domains on the LibvirtCluster. Machines here use a missing base image: placement is what is tested, no boot."""

from __future__ import annotations

import base64
import collections
import logging
import shutil
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from capi_libvirt.api import meta
from devenv import capi_objects
from devenv import remote_access as ra
from devenv.libvirt_host import LibvirtHost

from fixtures_control_plane import PROVIDER_NAMESPACE, operator_running
from prereq import require
from waiting import CONVERGENCE_S, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DEADLINE_S = CONVERGENCE_S
MERGE = {"_content_type": "application/merge-patch+json"}
POOL = NETWORK = "capi-libvirt"  # the test hosts' pool and network
MISSING_BASE = "missing-base.qcow2"  # no such volume: placement is what is tested, nothing boots


@pytest.fixture(scope="module")
def remote_hosts():
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost("tr-op-tls", "192.168.150.0/24"), link_index=150) as tls, \
            ra.RemoteAccess(LibvirtHost("tr-op-ssh", "192.168.151.0/24"), link_index=151) as ssh:
        yield tls, ssh


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def make_secret(api_client, namespace: str, name: str, data: dict[str, bytes]) -> None:
    await client.CoreV1Api(api_client).create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name=name), data={k: b64(v) for k, v in data.items()}))


async def make_host(api_client, name: str, uri: str, secret_ns: str, secret: str, failure_domain: str) -> None:
    await client.CustomObjectsApi(api_client).create_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": name},
        "spec": {"uri": uri, "credentialsSecretRef": {"name": secret, "namespace": secret_ns},
                 "failureDomain": failure_domain, "storagePool": POOL,
                 "access": {"images": [MISSING_BASE], "networks": [NETWORK]}}})


async def host_status(api_client, name: str) -> dict:
    body = await client.CustomObjectsApi(api_client).get_cluster_custom_object(
        meta.GROUP, meta.VERSION, "libvirthosts", name)
    return body.get("status", {})


def tls_secret(access: ra.RemoteAccess) -> dict[str, bytes]:
    folder = access.client_dir
    return {"ca.crt": (folder / "cacert.pem").read_bytes(), "tls.crt": (folder / "clientcert.pem").read_bytes(),
            "tls.key": (folder / "clientkey.pem").read_bytes()}


def ssh_secret(access: ra.RemoteAccess) -> dict[str, bytes]:
    return {"ssh-privatekey": access.ssh_key.read_bytes(), "known_hosts": access.known_hosts.read_bytes()}


class Collected(logging.Handler):
    """Every log record of the module's run, formatted as it would be printed."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(scope="module")
def collected_logs():
    handler, root = Collected(), logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(previous)


@pytest.fixture(scope="module")
async def inventory(control_plane, api_client, remote_hosts, collected_logs) -> AsyncIterator[dict]:
    """Two LibvirtHosts (kvm-tls in rack-a over qemu+tls, kvm-ssh in rack-b over qemu+ssh) and a running operator."""
    tls, ssh = remote_hosts
    secrets_ns = PROVIDER_NAMESPACE  # where host credentials must live
    await make_secret(api_client, secrets_ns, "kvm-tls", tls_secret(tls))
    await make_secret(api_client, secrets_ns, "kvm-ssh", ssh_secret(ssh))
    async with operator_running(control_plane, {}) as memo:
        await make_host(api_client, "kvm-tls", f"qemu+tls://{tls.address}/system", secrets_ns, "kvm-tls", "rack-a")
        await make_host(api_client, "kvm-ssh", f"qemu+ssh://root@{ssh.address}/system", secrets_ns, "kvm-ssh", "rack-b")
        yield {"secrets_ns": secrets_ns, "tls": tls, "ssh": ssh, "memo": memo}
        objects = client.CustomObjectsApi(api_client)
        for name in ("kvm-tls", "kvm-ssh"):
            await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name)


async def test_hosts_over_tls_and_ssh_report_their_health(api_client, inventory):
    for name in ("kvm-tls", "kvm-ssh"):
        async def reachable(name=name):
            status = await host_status(api_client, name)
            return status if status.get("reachable") else None
        status = await wait_until(f"{name} reachable", reachable, DEADLINE_S)
        assert status["libvirtVersion"].count(".") == 2 and status["cpus"] > 0 and status["memoryMiB"] > 0
        assert status["pool"]["name"] == POOL and status["pool"]["availableBytes"] > 0
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"


@pytest.mark.parametrize("case", ["ssh-wrong-host-key", "tls-wrong-ca"])
async def test_a_wrong_host_key_or_certificate_is_refused_with_a_clear_condition(
        api_client, inventory, tmp_path, case):
    tls, ssh = inventory["tls"], inventory["ssh"]
    if case == "ssh-wrong-host-key":
        ra.ssh_keygen(tmp_path / "rogue", "rogue host key")
        data = ssh_secret(ssh) | {"known_hosts": ra.known_hosts_line(ssh.address, tmp_path / "rogue.pub").encode()}
        uri, expected = f"qemu+ssh://root@{ssh.address}/system", "Host key verification failed"
    else:
        ra.make_ca(tmp_path / "ca.key", tmp_path / "ca.pem", "another CA")
        data = tls_secret(tls) | {"ca.crt": (tmp_path / "ca.pem").read_bytes()}
        uri, expected = f"qemu+tls://{tls.address}/system", "certificate"
    await make_secret(api_client, inventory["secrets_ns"], case, data)
    await make_host(api_client, case, uri, inventory["secrets_ns"], case, "rack-z")
    try:
        async def refused():
            status = await host_status(api_client, case)
            ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready")
            return (status, ready) if ready and ready["reason"] == "HostUnreachable" else None
        status, ready = await wait_until(f"{case} refused", refused, DEADLINE_S)
        assert status["reachable"] is False and expected in ready["message"]
        for key in ("ssh-privatekey", "tls.key"):  # no private key material in the status
            if key in data:
                assert data[key].decode().strip().splitlines()[1] not in str(status)
    finally:
        await client.CustomObjectsApi(api_client).delete_cluster_custom_object(
            meta.GROUP, meta.VERSION, "libvirthosts", case)


def machine_spec(**changes) -> dict:
    return {"image": {"volume": MISSING_BASE}, "storagePool": POOL, "domainType": "qemu", "cpus": 1,
            "memoryMiB": 512, "interfaces": [{"network": NETWORK}], **changes}


async def placed(api_client, namespace: str, names: list[str]) -> dict[str, dict]:
    objects = client.CustomObjectsApi(api_client)

    async def all_placed():
        statuses = {}
        for name in names:
            body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines",
                                                              name)
            if not body.get("status", {}).get("host"):
                return None
            statuses[name] = body["status"]
        return statuses
    return await wait_until("every machine placed", all_placed, DEADLINE_S)


async def delete_machines(api_client, namespace: str, names: list[str]) -> None:
    objects = client.CustomObjectsApi(api_client)
    for name in names:
        await objects.delete_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", name)

    async def gone():
        listed = await objects.list_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines")
        return not listed["items"]
    await wait_until("machines deleted", gone, DEADLINE_S)


async def test_a_burst_of_one_deployment_spreads_over_hosts_and_failure_domains(api_client, namespace, inventory):
    await test_hosts_over_tls_and_ssh_report_their_health(api_client, inventory)
    await capi_objects.create_cluster(api_client, namespace, "demo")
    names = [f"md-0-{i}" for i in range(4)]
    for name in names:
        await capi_objects.create_machine(api_client, namespace, "demo", name, "#cloud-config\n", machine_spec(),
                                          labels={"cluster.x-k8s.io/deployment-name": "md-0"})
    statuses = await placed(api_client, namespace, names)
    by_host = collections.Counter(s["host"] for s in statuses.values())
    by_domain = collections.Counter(s["failureDomain"] for s in statuses.values())
    print(f"\n[spread] burst of {len(names)}: hosts {dict(by_host)}, failure domains {dict(by_domain)}")
    assert by_host == {"kvm-tls": 2, "kvm-ssh": 2} and by_domain == {"rack-a": 2, "rack-b": 2}
    await delete_machines(api_client, namespace, names)


async def test_a_machine_that_fits_nowhere_says_so_and_is_placed_once_room_appears(api_client, namespace, inventory):
    """Room is made scarce by the hosts' memory overcommit, not by a machine larger than the host: placement never puts
    a machine with more memory than the host has free (core.placement.fits_free_memory), whatever the overcommit."""
    await test_hosts_over_tls_and_ssh_report_their_health(api_client, inventory)
    memory = (await host_status(api_client, "kvm-tls"))["memoryMiB"]
    objects = client.CustomObjectsApi(api_client)
    hosts = inventory["memo"].runtime.deps.inventory.hosts

    async def set_overcommit(ratios: dict[str, float]) -> None:
        for name, ratio in ratios.items():
            await objects.patch_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", name,
                                                      {"spec": {"overcommit": {"memory": ratio}}}, **MERGE)

        async def taken():
            return all(hosts[name].spec.overcommit.memory == ratio for name, ratio in ratios.items())
        await wait_until(f"the operator to take the overcommit {ratios}", taken, DEADLINE_S)

    await set_overcommit({"kvm-tls": 0.25, "kvm-ssh": 0.25})
    await capi_objects.create_cluster(api_client, namespace, "demo")
    await capi_objects.create_machine(api_client, namespace, "demo", "big", "#cloud-config\n",
                                      machine_spec(memoryMiB=int(memory * 0.375)))

    async def condition():
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtmachines", "big")
        found = {c["type"]: c for c in body.get("status", {}).get("conditions", [])}.get("Provisioned")
        return found if found and found["reason"] == "InsufficientCapacity" else None
    waiting = await wait_until("InsufficientCapacity", condition, DEADLINE_S)
    assert "kvm-tls:" in waiting["message"] and "kvm-ssh:" in waiting["message"] and "MiB free" in waiting["message"]

    await set_overcommit({"kvm-tls": 0.5})
    statuses = await placed(api_client, namespace, ["big"])
    assert statuses["big"]["host"] == "kvm-tls"
    await set_overcommit({"kvm-tls": 1.0, "kvm-ssh": 1.0})
    await delete_machines(api_client, namespace, ["big"])


async def test_the_cluster_reports_the_failure_domains_of_the_inventory(api_client, namespace, inventory):
    await test_hosts_over_tls_and_ssh_report_their_health(api_client, inventory)
    cluster = await capi_objects.create_cluster(api_client, namespace, "demo")
    objects = client.CustomObjectsApi(api_client)
    await objects.create_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtclusters", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtCluster",
        "metadata": {"name": "demo", "labels": {meta.CLUSTER_NAME_LABEL: "demo"},
                     "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "demo",
                                          "uid": cluster["metadata"]["uid"]}]},
        "spec": {"controlPlaneEndpoint": {"host": "192.0.2.1", "port": 6443}}})

    async def domains():
        body = await objects.get_namespaced_custom_object(meta.GROUP, meta.VERSION, namespace, "libvirtclusters", "demo")
        found = body.get("status", {}).get("failureDomains")
        return found if found and {d["name"] for d in found} >= {"rack-a", "rack-b"} else None
    found = await wait_until("failure domains", domains, DEADLINE_S)
    # Exactly the inventory's: the hosts of the refused-credentials tests (rack-z) were deleted, and left it.
    assert {d["name"]: d["controlPlane"] for d in found} == {"rack-a": True, "rack-b": True}


async def test_a_host_with_machines_on_it_is_not_removed_until_they_are_gone(api_client, namespace, inventory):
    await test_hosts_over_tls_and_ssh_report_their_health(api_client, inventory)
    await capi_objects.create_cluster(api_client, namespace, "demo")
    await capi_objects.create_machine(api_client, namespace, "demo", "pinned", "#cloud-config\n",
                                      machine_spec(host="kvm-ssh"))
    await placed(api_client, namespace, ["pinned"])
    objects = client.CustomObjectsApi(api_client)
    await objects.delete_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts", "kvm-ssh")

    async def in_use():
        ready = {c["type"]: c for c in (await host_status(api_client, "kvm-ssh")).get("conditions", [])}.get("Ready")
        return ready if ready and ready["reason"] == "HostInUse" else None
    assert f"{namespace}/pinned" in (await wait_until("HostInUse", in_use, DEADLINE_S))["message"]

    await delete_machines(api_client, namespace, ["pinned"])

    async def host_gone():
        try:
            await host_status(api_client, "kvm-ssh")
            return False
        except client.exceptions.ApiException as error:
            return error.status == 404
    await wait_until("the LibvirtHost to be removed", host_gone, DEADLINE_S)
    await make_host(api_client, "kvm-ssh", f"qemu+ssh://root@{inventory['ssh'].address}/system",
                    inventory["secrets_ns"], "kvm-ssh", "rack-b")  # back for the tests after this one


async def test_no_private_key_in_the_logs_events_or_statuses_of_the_whole_run(api_client, inventory, collected_logs):
    """Runs last in the module: everything the operator logged, every event, every status since the hosts came. (The
    test bed's own API client, which logs response bodies at DEBUG, is kept at INFO by tests/conftest.py.)"""
    tls, ssh = inventory["tls"], inventory["ssh"]
    secrets = [tls.client_dir / "clientkey.pem", ssh.ssh_key]
    key_lines = [line for path in secrets for line in path.read_text().strip().splitlines()[1:-1] if len(line) > 20]
    key_lines += [base64.b64encode(path.read_bytes()).decode()[:60] for path in secrets]  # as the API returns Secrets
    assert key_lines
    objects = client.CustomObjectsApi(api_client)
    events = await client.CoreV1Api(api_client).list_event_for_all_namespaces()
    seen = "\n".join(collected_logs.lines) + str([(e.reason, e.message) for e in events.items]) + \
        str(await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirthosts")) + \
        str(await objects.list_cluster_custom_object(meta.GROUP, meta.VERSION, "libvirtmachines"))
    assert len(collected_logs.lines) > 10  # the operator did log
    assert not [line for line in key_lines if line in seen]
