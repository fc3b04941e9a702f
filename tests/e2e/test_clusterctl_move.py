"""`clusterctl move` for real: a cluster with a running, joined libvirt worker goes from one management cluster to
another, both made by `clusterctl init` (devenv/management_cluster.py), each running our manager from the Deployment
clusterctl installed (devenv/pod_runner.py).

The workload cluster is the source's API server itself (its control plane a HostedControlPlane stand-in, as in
tests/e2e/test_autoscaler.py); its one worker joins through Cluster API's kubeadm bootstrap provider and a real
kubelet, so its Machine has the nodeRef move requires. The libvirt host is reached over qemu+ssh through a LibvirtHost
and its credentials Secret in the provider's namespace, which carries an ownerReference to the LibvirtHost (the
documented step that makes move copy it with the host). The cluster's namespace and the Secrets RoleBinding the cluster
templates carry are made on both (clusterctl moves no RoleBinding; docs/book/src/topics/move.md says so).

What is proved, with the source's manager running throughout and the target's started before the move (never
restarted); the target management cluster is made while the worker joins:
- the real `clusterctl move --to-kubeconfig` exits 0 and names the LibvirtHost and the credentials Secret among what it
  creates;
- libvirt reports no lifecycle event at all (define, undefine, start, stop, ...) from before the move until the
  Cluster is deleted on the target: the domain keeps its UUID, name, libvirt ID and state, the pool its volumes;
- before the move: the source's LibvirtMachine carries the identity annotation naming its own UID (placement wrote
  it), its domain's UUID is derived from that UID, and its overlay is in the pool;
- on the target: the same providerID, a new UID, the finalizer and the identity annotation naming the source's UID
  (copied); the LibvirtMachine's status rebuilt (host, domainUUID, addresses, ready, provisioned) by the running manager; the Machine Running with the
  same Node (the same object: its UID unchanged); the LibvirtHost Ready and the Secret owned by the target's host; the
  domain's owner metadata rewritten in place to name the target management cluster (for its orphan collector);
- on the source: no Cluster, Machine, LibvirtCluster or LibvirtMachine left; the LibvirtHost and its Secret stay (move
  never deletes global objects); no event of our manager says it placed, defined or deleted anything;
- deleting the Cluster on the target shuts the domain down and undefines it once (no other event) and removes every
  volume.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import re
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client, config

from capi_libvirt.api import meta, templates
from capi_libvirt.core import naming
from capi_libvirt.reconcile.machine import FINALIZER
from devenv import base_image, clusterctl_repository, management_cluster, node_joins, workload_cluster
from devenv import control_plane as cp
from devenv import remote_access as ra
from devenv.domain_events import DomainEvents
from devenv.libvirt_host import LibvirtHost
from guests import host_state, owner_of
from kubeadm_workers import create, worker_objects

from prereq import require
from waiting import Clock, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

SUBNET, LINK = "192.168.165.0/24", 165  # not 160-164: the bench and its smoke run may run beside
HOST = "move-kvm"
NAMESPACE = "move-demo"
CLUSTER = "moved"
SOURCE_ADDRESS, TARGET_ADDRESS = "198.19.255.2", "198.19.255.3"  # each management cluster's webhook address
JOIN_DEADLINE_S = 900.0  # a TCG guest boots, runs cloud-init, containerd and the kubelet on a busy 2-core machine
ADOPT_DEADLINE_S = 300.0  # the target's prober adds a copied LibvirtHost within 30 s; then its machines go at once
DELETE_DEADLINE_S = 300.0
CAPI = f"/apis/{meta.CAPI_GROUP}/{meta.CAPI_VERSION}"
INFRA = f"/apis/{meta.GROUP}/{meta.VERSION}"
SECRETS = f"/api/v1/namespaces/{meta.PROVIDER_NAMESPACE}/secrets"  # where host credentials must be
MOVED_KINDS = [f"{CAPI}/namespaces/{NAMESPACE}/{plural}" for plural in ("clusters", "machines", "machinedeployments")] + \
    [f"{INFRA}/namespaces/{NAMESPACE}/{plural}" for plural in ("libvirtclusters", "libvirtmachines")]


# -- fixtures --------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def move_host(node_image) -> Iterator[tuple[ra.RemoteAccess, str]]:
    """A libvirt host reached over qemu+ssh, the node image in its pool."""
    for program in ("/usr/sbin/sshd", "ssh", "openssl", "ssh-keygen", "libvirtd", "qemu-system-x86_64"):
        require(shutil.which(program) is not None, f"{program} (make test installs it)")
    with ra.RemoteAccess(LibvirtHost(HOST, SUBNET), link_index=LINK) as access:
        with access.host.connect() as conn:
            volume = base_image.upload_base_image(conn, access.host.pool_name, node_image)
        yield access, volume


@pytest.fixture(scope="module")
def source(move_host, init_repository: clusterctl_repository.Repository,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[management_cluster.ManagementCluster]:
    """The management cluster the cluster starts on; guests reach its API server through the host's gateway."""
    access, _ = move_host
    with management_cluster.ManagementCluster(tmp_path_factory.mktemp("source"), init_repository, SOURCE_ADDRESS,
                                              serving_addresses=[str(access.host.bridge_address)]) as source:
        workload_cluster.install(source.plane)
        yield source


@pytest.fixture(scope="module")
def target(source, init_repository: clusterctl_repository.Repository, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[concurrent.futures.Future[management_cluster.ManagementCluster]]:
    """The management cluster the cluster moves to, made in the background (while the worker joins): `result()`."""
    bed = management_cluster.ManagementCluster(tmp_path_factory.mktemp("target"), init_repository, TARGET_ADDRESS)

    def start() -> management_cluster.ManagementCluster:
        bed.start()
        workload_cluster.install(bed.plane)
        return bed

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(start)
        try:
            yield future
        finally:
            concurrent.futures.wait([future])
            bed.stop()


@contextlib.asynccontextmanager
async def api_for(plane: cp.LocalControlPlane) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(plane.kubeconfig_path), client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        yield api


@contextlib.contextmanager
def running(pod) -> Iterator[None]:
    try:
        pod.start()
        pod.wait_ready()
        yield
    finally:
        pod.stop()


# -- reading the planes ----------------------------------------------------------------------------------------------

def items(plane: cp.LocalControlPlane, path: str) -> list[dict]:
    return plane.request("GET", path)["items"]


def get(plane: cp.LocalControlPlane, path: str) -> dict | None:
    try:
        return plane.request("GET", path)
    except cp.ControlPlaneError as error:
        if error.status == 404:
            return None
        raise


def condition(document: dict, kind: str) -> str | None:
    return next((c["status"] for c in (document.get("status") or {}).get("conditions") or [] if c["type"] == kind),
                None)


def event_reasons(plane: cp.LocalControlPlane, uid: str) -> collections.Counter[str]:
    """How often each reason was recorded in events about the object `uid`."""
    counts: collections.Counter[str] = collections.Counter()
    for event in items(plane, f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.uid%3D{uid}"):
        counts[event["reason"]] += event.get("count") or 1
    return counts


def ready_to_move(plane: cp.LocalControlPlane) -> dict | None:
    """The one Machine Running with a nodeRef, and the Cluster as `clusterctl move` requires it (infrastructure
    provisioned, control plane initialized): the Machine, or None. Also its NoCloud ISO gone from the host (the
    provider removes it once the nodeRef is there), so the host's state before the move is the one that must stay."""
    infra = items(plane, f"{INFRA}/namespaces/{NAMESPACE}/libvirtmachines")
    if not infra or not (infra[0].get("status") or {}).get("noCloudISORemoved"):
        return None
    cluster = get(plane, f"{CAPI}/namespaces/{NAMESPACE}/clusters/{CLUSTER}") or {}
    status = cluster.get("status") or {}
    if not (status.get("initialization") or {}).get("infrastructureProvisioned") or \
            condition(cluster, "ControlPlaneInitialized") != "True":
        return None
    machines = items(plane, f"{CAPI}/namespaces/{NAMESPACE}/machines")
    running_ = [m for m in machines if (m.get("status") or {}).get("phase") == "Running"
                and (m["status"].get("nodeRef") or {}).get("name")]
    return running_[0] if len(machines) == 1 and running_ else None


# -- what a user makes -------------------------------------------------------------------------------------------------

def cluster_namespace(plane: cp.LocalControlPlane) -> None:
    """The cluster's namespace with the RoleBinding the cluster templates carry (the provider reads its Secrets there).
    clusterctl move copies no RoleBinding: the user makes it on the target too (docs/book/src/topics/move.md)."""
    plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NAMESPACE}})
    binding = templates.secrets_binding()
    binding["metadata"] = {"name": f"{CLUSTER}-{meta.SECRETS_CLUSTER_ROLE}", "namespace": NAMESPACE}
    binding["subjects"][0]["namespace"] = meta.PROVIDER_NAMESPACE
    plane.apply(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings", binding)


def create_host(plane: cp.LocalControlPlane, access: ra.RemoteAccess, volume: str) -> None:
    """The LibvirtHost (its access: the node image and the host's network), then its credentials Secret in the
    provider's namespace with an ownerReference to the host (so move copies it with the host)."""
    host = plane.request("POST", f"{INFRA}/libvirthosts", {
        "apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "metadata": {"name": HOST},
        "spec": {"uri": f"qemu+ssh://root@{access.address}/system", "storagePool": access.host.pool_name,
                 "access": {"images": [volume], "networks": [access.host.network_name]},
                 "credentialsSecretRef": {"name": HOST, "namespace": meta.PROVIDER_NAMESPACE}}})
    owner = {"apiVersion": meta.API_VERSION, "kind": "LibvirtHost", "name": HOST, "uid": host["metadata"]["uid"]}
    plane.request("POST", f"{SECRETS}", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": HOST, "ownerReferences": [owner]},
        "data": {"ssh-privatekey": base64.b64encode(access.ssh_key.read_bytes()).decode(),
                 "known_hosts": base64.b64encode(access.known_hosts.read_bytes()).decode()}})


def delete_host(plane: cp.LocalControlPlane) -> None:
    """The LibvirtHost (while the manager runs, which releases its finalizer); the Secret goes with it (GC)."""
    with contextlib.suppress(cp.ControlPlaneError):
        plane.request("DELETE", f"{INFRA}/libvirthosts/{HOST}")
    wait_for("the LibvirtHost released", lambda: get(plane, f"{INFRA}/libvirthosts/{HOST}") is None, 120)


# -- the test --------------------------------------------------------------------------------------------------------

async def test_clusterctl_move_hands_running_machines_to_another_management_cluster(
        source, target: concurrent.futures.Future, move_host, repository, operator_image, tmp_path) -> None:
    access, volume = move_host
    host = access.host
    clock = Clock()
    with running(source.operator(tmp_path / "source-pod")):
        cluster_namespace(source.plane)
        create_host(source.plane, access, volume)
        with node_joins.accepting_joins(source.plane, host) as gateway:
            endpoint = (str(gateway.address), gateway.port)
            async with api_for(source.plane) as api:
                await workload_cluster.create_worker_cluster(api, source.plane, NAMESPACE, CLUSTER, endpoint=endpoint)
                await create(api, worker_objects(tmp_path, repository, "", CLUSTER, NAMESPACE, endpoint, host, volume,
                                                 replicas=1))
            machine = await asyncio.to_thread(wait_for, "the worker joined (Machine Running, nodeRef) and the Cluster "
                                              "ready to move", lambda: ready_to_move(source.plane), JOIN_DEADLINE_S, 2.0)
            clock.mark("worker joined, Cluster ready to move")
            target_bed = await asyncio.to_thread(target.result)
            [infra] = items(source.plane, f"{INFRA}/namespaces/{NAMESPACE}/libvirtmachines")
            node = source.plane.request("GET", f"/api/v1/nodes/{machine['status']['nodeRef']['name']}")
            source_host = source.plane.request("GET", f"{INFRA}/libvirthosts/{HOST}")
            before = host_state(host)
            domain_uuid, source_uid = infra["status"]["domainUUID"], infra["metadata"]["uid"]
            source_reasons = event_reasons(source.plane, source_uid)
            assert list(before["domains"]) == [domain_uuid] and before["domains"][domain_uuid][2] == 1, before
            assert infra["metadata"]["annotations"][naming.IDENTITY_ANNOTATION] == source_uid  # written by placement
            assert domain_uuid == naming.domain_uuid(source_uid)
            assert naming.overlay_volume_name(NAMESPACE, infra["metadata"]["name"], source_uid) in before["volumes"], \
                before

            cluster_namespace(target_bed.plane)
            with running(target_bed.operator(tmp_path / "target-pod")), DomainEvents(host.uri) as events:
                clock.mark("target's manager ready")
                moved = await asyncio.to_thread(source.init.clusterctl, "move", "--to-kubeconfig",
                                                str(target_bed.plane.kubeconfig_path), "--namespace", NAMESPACE,
                                                "-v", "5", timeout=600)
                (tmp_path / "clusterctl-move.log").write_text(moved.stdout + moved.stderr)
                assert moved.returncode == 0, f"{moved.stdout}\n{moved.stderr}"
                clock.mark("clusterctl move exited 0")
                created = re.findall(r'Creating (\w+)="([^"]*)"', moved.stdout + moved.stderr)
                assert ("LibvirtHost", HOST) in created and ("Secret", HOST) in created, moved.stdout + moved.stderr

                # The source: nothing of the cluster left, the host and its Secret kept, no host change made.
                for path in MOVED_KINDS:
                    assert items(source.plane, path) == [], path
                assert get(source.plane, f"{INFRA}/libvirthosts/{HOST}")["metadata"]["uid"] == \
                    source_host["metadata"]["uid"]
                assert get(source.plane, f"{SECRETS}/{HOST}") is not None

                # No DeletedForMove event is awaited: clusterctl strips the finalizers right after its delete, so
                # whether our manager saw the deletion first is a race (the event is tests/unit/test_move.py's claim).
                since = event_reasons(source.plane, source_uid) - source_reasons
                assert not {"Placed", "DomainDefined", "Deleted"} & set(since), f"the source's manager: {since}"

                # The target: the same machine, adopted by the manager that was already running.
                path = f"{INFRA}/namespaces/{NAMESPACE}/libvirtmachines/{infra['metadata']['name']}"

                def adopted() -> dict | None:
                    body = get(target_bed.plane, path) or {}
                    status = body.get("status") or {}
                    return body if status.get("ready") and status.get("state") == "running" and \
                        (status.get("initialization") or {}).get("provisioned") else None
                copy = await asyncio.to_thread(wait_for, "the moved LibvirtMachine adopted", adopted, ADOPT_DEADLINE_S)
                clock.mark("LibvirtMachine adopted on the target (status rebuilt)")
                assert copy["metadata"]["uid"] != source_uid
                assert FINALIZER in copy["metadata"]["finalizers"]
                assert copy["spec"]["providerID"] == infra["spec"]["providerID"] == \
                    f"libvirt://{HOST}/{domain_uuid}"
                assert copy["metadata"]["annotations"][naming.IDENTITY_ANNOTATION] == source_uid
                assert copy["status"]["host"] == HOST and copy["status"]["domainUUID"] == domain_uuid
                assert copy["status"]["initialization"] == {"provisioned": True}
                assert copy["status"]["addresses"] == infra["status"]["addresses"]
                assert not {"Placed", "DomainDefined"} & set(event_reasons(target_bed.plane, copy["metadata"]["uid"]))

                def machine_running() -> dict | None:
                    found = items(target_bed.plane, f"{CAPI}/namespaces/{NAMESPACE}/machines")
                    return found[0] if len(found) == 1 and (found[0].get("status") or {}).get("phase") == "Running" \
                        and found[0]["status"].get("nodeRef") else None
                target_machine = await asyncio.to_thread(wait_for, "the moved Machine Running", machine_running,
                                                         ADOPT_DEADLINE_S)
                assert target_machine["status"]["nodeRef"]["name"] == node["metadata"]["name"]
                assert target_machine["spec"]["providerID"] == infra["spec"]["providerID"]
                node_now = source.plane.request("GET", f"/api/v1/nodes/{node['metadata']['name']}")
                assert node_now["metadata"]["uid"] == node["metadata"]["uid"]

                target_host = await asyncio.to_thread(
                    wait_for, "the moved LibvirtHost Ready on the target",
                    lambda: (lambda h: h if condition(h, "Ready") == "True" else None)(
                        target_bed.plane.request("GET", f"{INFRA}/libvirthosts/{HOST}")), ADOPT_DEADLINE_S)
                secret = target_bed.plane.request("GET", f"{SECRETS}/{HOST}")
                assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [target_host["metadata"]["uid"]]

                # The domain's owner metadata now names the target management cluster (kube-system's UID), rewritten
                # in place: only the target's orphan collector may ever take it for its own.
                target_id = target_bed.plane.request("GET", "/api/v1/namespaces/kube-system")["metadata"]["uid"]
                await asyncio.to_thread(wait_for, "the domain's owner metadata naming the target",
                                        lambda: owner_of(host, domain_uuid).management_cluster == target_id,
                                        ADOPT_DEADLINE_S)
                assert owner_of(host, domain_uuid).uid == source_uid
                assert host_state(host) == before, "same domain (UUID, name, libvirt ID, state) and volumes"
                assert events.events == [], "no define, undefine, start or stop during the move and the adoption"

                # Deleting the Cluster on the target cleans the host.
                target_bed.plane.request("DELETE", f"{CAPI}/namespaces/{NAMESPACE}/clusters/{CLUSTER}")

                def cluster_gone() -> bool:
                    left = [i for p in MOVED_KINDS for i in items(target_bed.plane, p)]
                    return not left and host_state(host) == {"domains": {}, "volumes": []}
                await asyncio.to_thread(wait_for, "the Cluster deleted on the target and the host clean",
                                        cluster_gone, DELETE_DEADLINE_S, 1.0)
                clock.mark("Cluster deleted on the target, host clean")
                lifecycle = [event for uuid_, event in events.events if uuid_ == domain_uuid]
                # Shut down (the guest's ACPI shutdown, then stopped), then undefined once; never started or defined.
                assert lifecycle[-1:] == ["UNDEFINED"] and lifecycle.count("UNDEFINED") == 1 and \
                    set(lifecycle) <= {"SHUTDOWN", "STOPPED", "UNDEFINED"}, lifecycle
                assert {uuid_ for uuid_, _ in events.events} == {domain_uuid}, events.events
                delete_host(target_bed.plane)
        delete_host(source.plane)
    print(f"\n[numbers] clusterctl move of a cluster with 1 joined libvirt worker:\n{clock.report()}")
