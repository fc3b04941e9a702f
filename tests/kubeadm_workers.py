"""Worker MachineDeployments that join through Cluster API's kubeadm bootstrap provider, as users write them.

The objects are the release's own cluster template run through the real clusterctl (`generate cluster`): the workers'
KubeadmConfigTemplate (the kubelet's providerID and the node's name from the NoCloud meta-data, through cloud-init's
Jinja), LibvirtMachineTemplate and MachineDeployment. One thing is changed for this machine: its guests run under
TCG (`domainType: qemu`, machine type `pc`), as there is no hardware virtualization here. And one is added: these
clusters' control plane is the test API server, which runs no CNI add-on (the flavors' flannel needs a workload
cluster of its own: tests/e2e/test_whole_cluster.py), so the workers copy the node image's bridge stand-in into
/etc/cni/net.d before `kubeadm join`; their Nodes become Ready on it.

And what proves that a Node was registered by a real kubelet through `kubeadm join`: the kubelet's own version and
runtime in the Node's status, and the CSR of its client certificate, posted with the bootstrap token the kubeadm
bootstrap provider wrote into that Machine's join configuration, approved and signed.
"""

from __future__ import annotations

import pathlib

from kubernetes_asyncio import client

from capi_libvirt.api import meta
from clusterctl_cli import generate_cluster
from devenv import paths

WORKER_CPUS = 1
WORKER_MEMORY_MIB = 1024  # containerd, the kubelet and cloud-init side by side
DISK_GIB = 5  # at least the node image's own size
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
BOOTSTRAP_GROUP = "bootstrap.cluster.x-k8s.io"
# The node image's node-local bridge network, kept out of /etc/cni/net.d (hack/build-guest-image.sh).
BRIDGE_CNI = "/etc/capi-libvirt/bridge-cni.conflist"
USE_BRIDGE_CNI = f"cp {BRIDGE_CNI} /etc/cni/net.d/10-capi-libvirt-bridge.conflist"


def worker_objects(tmp: pathlib.Path, repository: pathlib.Path, flavor: str, cluster: str, namespace: str,
                   endpoint: tuple[str, int], host, base_volume: str, replicas: int = 0) -> list[dict]:
    """The flavor's worker objects (`<cluster>-md-0`: KubeadmConfigTemplate, LibvirtMachineTemplate,
    MachineDeployment) as `clusterctl generate cluster` makes them for this host, with the TCG change and the
    bridge stand-in."""
    variables = {
        "KUBERNETES_VERSION": paths.KUBERNETES_VERSION,
        "CONTROL_PLANE_MACHINE_COUNT": "1",
        "WORKER_MACHINE_COUNT": str(replicas),
        "CONTROL_PLANE_ENDPOINT_HOST": endpoint[0],
        "CONTROL_PLANE_ENDPOINT_PORT": str(endpoint[1]),
        "LIBVIRT_BASE_IMAGE": base_volume,
        "LIBVIRT_STORAGE_POOL": host.pool_name,
        "LIBVIRT_NETWORK": host.network_name,
        "LIBVIRT_WORKER_CPUS": str(WORKER_CPUS),
        "LIBVIRT_WORKER_MEMORY_MIB": str(WORKER_MEMORY_MIB),
        "LIBVIRT_DISK_GIB": str(DISK_GIB),
    }
    documents = generate_cluster(tmp, repository, flavor, cluster, namespace, variables)
    workers = [d for d in documents if d["metadata"]["name"] == f"{cluster}-md-0"]
    assert sorted(d["kind"] for d in workers) == ["KubeadmConfigTemplate", "LibvirtMachineTemplate",
                                                   "MachineDeployment"], workers
    for document in workers:
        if document["kind"] == "LibvirtMachineTemplate":
            document["spec"]["template"]["spec"].update(domainType="qemu")  # TCG; the flavor's q35 stays
        if document["kind"] == "KubeadmConfigTemplate":
            document["spec"]["template"]["spec"].setdefault("preKubeadmCommands", []).append(USE_BRIDGE_CNI)
    return workers


def by_kind(documents: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in documents}


async def create(api: client.ApiClient, documents: list[dict]) -> None:
    """Create each (namespaced) object, the MachineDeployment last so its templates exist when it is reconciled."""
    objects = client.CustomObjectsApi(api)
    for document in sorted(documents, key=lambda d: d["kind"] == "MachineDeployment"):
        group, version = document["apiVersion"].split("/")
        await objects.create_namespaced_custom_object(group, version, document["metadata"]["namespace"],
                                                      document["kind"].lower() + "s", document)


async def list_objects(api: client.ApiClient, namespace: str, group: str, version: str, plural: str) -> list[dict]:
    listing = await client.CustomObjectsApi(api).list_namespaced_custom_object(group, version, namespace, plural)
    return listing["items"]


async def machines(api: client.ApiClient, namespace: str) -> list[dict]:
    return await list_objects(api, namespace, meta.CAPI_GROUP, meta.CAPI_VERSION, "machines")


async def libvirt_machines(api: client.ApiClient, namespace: str) -> list[dict]:
    return await list_objects(api, namespace, meta.GROUP, meta.VERSION, "libvirtmachines")


async def join_token_id(api: client.ApiClient, namespace: str, machine: dict) -> str:
    """The ID of the bootstrap token in the Machine's KubeadmConfig (written there by the kubeadm bootstrap
    provider)."""
    config = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        BOOTSTRAP_GROUP, meta.CAPI_VERSION, namespace, "kubeadmconfigs",
        machine["spec"]["bootstrap"]["configRef"]["name"])
    return config["spec"]["joinConfiguration"]["discovery"]["bootstrapToken"]["token"].split(".")[0]


def is_ready(node: client.V1Node) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


async def kubelet_csr(api: client.ApiClient, token_id: str) -> client.V1CertificateSigningRequest | None:
    """The kubelet client-certificate CSR posted with bootstrap token `token_id`, if any."""
    csrs = (await client.CertificatesV1Api(api).list_certificate_signing_request(_request_timeout=30)).items
    posted = [c for c in csrs if c.spec.signer_name == KUBELET_SIGNER
              and c.spec.username == f"system:bootstrap:{token_id}"]
    return posted[0] if posted else None


GIB = 1024**3
BINARY_SUFFIXES = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
# What ext4 keeps for itself of a few GiB (inode tables, bitmaps, the journal): the file system's size is at least
# this share of its partition. The node image's own disk (4 GiB) is far below it for the sizes the tests ask.
FILE_SYSTEM_SHARE = 0.9


def assert_root_file_system_fills_the_disk(node: client.V1Node, disk_gib: int) -> None:
    """The kubelet's root file system (the Node's ephemeral-storage capacity) is the machine's diskGiB, less ext4's
    own share: the overlay was grown to diskGiB, and the guest's partition and file system with it (growpart and
    resizefs at first boot), not left at the node image's size."""
    quantity = node.status.capacity["ephemeral-storage"]
    number, suffix = quantity.rstrip("KMGTi"), quantity[len(quantity.rstrip("KMGTi")):]
    size = int(number) * BINARY_SUFFIXES[suffix]
    assert FILE_SYSTEM_SHARE * disk_gib * GIB <= size <= disk_gib * GIB, \
        f"root file system of {node.metadata.name}: {size / GIB:.2f} GiB for diskGiB {disk_gib} ({quantity})"


async def assert_joined_by_kubelet(api: client.ApiClient, namespace: str, machine: dict, infra: dict,
                                   workload_api: client.ApiClient | None = None) -> client.V1Node:
    """The Machine's Node was registered by a real kubelet of this Kubernetes version, on containerd, after a
    `kubeadm join` with the Machine's own bootstrap token, and carries its LibvirtMachine's providerID. The Node and
    the CSR are read from `workload_api` (a whole cluster's) if given, else from `api` (the test API server's
    clusters, where management and workload are one)."""
    workload_api = workload_api or api
    node = await client.CoreV1Api(workload_api).read_node(machine["status"]["nodeRef"]["name"], _request_timeout=30)
    assert node.spec.provider_id == infra["spec"]["providerID"] == machine["spec"]["providerID"]
    assert node.status.node_info.kubelet_version == paths.KUBERNETES_VERSION, node.status.node_info
    assert node.status.node_info.container_runtime_version.startswith("containerd://"), node.status.node_info
    assert is_ready(node), node.status.conditions
    assert_root_file_system_fills_the_disk(node, infra["spec"]["diskGiB"])
    csr = await kubelet_csr(workload_api, await join_token_id(api, namespace, machine))
    assert csr is not None, f"no kubelet CSR posted with the bootstrap token of {machine['metadata']['name']}"
    assert csr.status.certificate, f"the CSR of {node.metadata.name} was not signed"
    assert any(c.type == "Approved" and c.status == "True" for c in csr.status.conditions), csr.status.conditions
    return node
