"""One LibvirtMachine placed on kvm1, for the fast tier's reconcile tests: the object as placement leaves it (or as
clusterctl move copies it), the domain it left on the host, a fake of the API that holds the one object and records
every write, and the reconcile's dependencies over it and the in-memory host (devenv.memory_host)."""

from __future__ import annotations

import dataclasses
import types

from capi_libvirt.core import domain_owner, naming, outage, provider_id
from capi_libvirt.hypervisor import host as host_api
from capi_libvirt.hypervisor import machines
from capi_libvirt.reconcile import machine as machine_reconcile
from capi_libvirt.reconcile.machine import FINALIZER, IDENTITY_ANNOTATION
from devenv.memory_host import MemoryHost, MemoryHosts
from devenv.memory_state import Domain

SOURCE_UID = "11111111-1111-4111-8111-111111111111"
COPY_UID = "22222222-2222-4222-8222-222222222222"
PROVIDER_ID = provider_id.format_provider_id("kvm1", naming.domain_uuid(SOURCE_UID))


def placed(uid: str = SOURCE_UID, *, annotation: str | None = SOURCE_UID, status: dict | None = None,
           extra_annotations: dict | None = None, deleting: bool = False) -> dict:
    """A LibvirtMachine as placement leaves it (or as clusterctl copies it: another uid, no status)."""
    annotations = dict(extra_annotations or {})
    if annotation is not None:
        annotations[IDENTITY_ANNOTATION] = annotation
    body = {"metadata": {"namespace": "ns", "name": "m0", "uid": uid, "resourceVersion": "7", "generation": 1,
                         "finalizers": [FINALIZER], "annotations": annotations,
                         "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
                         "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                                              "name": "m0"}]},
            "spec": {"providerID": PROVIDER_ID, "image": {"volume": "base.qcow2"}}}
    if status is not None:
        body["status"] = status
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return body


MAC = "52:54:00:00:00:01"


def domain_of(namespace: str = "ns", name: str = "m0", uid: str = SOURCE_UID) -> machines.DomainInfo:
    """The domain a machine placed on kvm1 left there (running, its NIC leased an address by the host's network)."""
    owner = domain_owner.Owner(namespace=namespace, name=name, uid=uid, cluster="c1")
    xml = (f'<domain><name>{naming.domain_name(namespace, name, uid)}</name><uuid>{naming.domain_uuid(uid)}</uuid>'
           f'<metadata><capi:machine xmlns:capi="{domain_owner.METADATA_NAMESPACE}">'
           + "".join(f"<capi:{field}>{getattr(owner, field)}</capi:{field}>" for field in domain_owner.OWNER_FIELDS)
           + f"</capi:machine></metadata><devices><interface type='network'><mac address='{MAC}'/>"
           "<source network='default'/></interface></devices></domain>")
    return machines.DomainInfo(uuid=naming.domain_uuid(uid), name=naming.domain_name(namespace, name, uid),
                               state="running", xml=xml)


@dataclasses.dataclass
class FakeKube:
    body: dict
    cluster: dict = dataclasses.field(default_factory=lambda: {
        "metadata": {"name": "c1", "namespace": "ns"}, "spec": {},
        "status": {"initialization": {"infrastructureProvisioned": True}}})
    patches: list = dataclasses.field(default_factory=list)
    status_patches: list = dataclasses.field(default_factory=list)

    async def get_libvirt_machine(self, namespace, name):
        return self.body

    async def get_cluster(self, namespace, name):
        return self.cluster

    async def get_machine(self, namespace, name):
        return {"metadata": {"name": name}, "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": "s"}},
                "status": {"nodeRef": {"name": "m0"}}}

    async def patch_libvirt_machine(self, namespace, name, patch):
        self.patches.append(patch)
        metadata = patch.get("metadata") or {}
        merged = {**self.body["metadata"], **{k: v for k, v in metadata.items() if k != "annotations"}}
        merged["annotations"] = {**(self.body["metadata"].get("annotations") or {}),
                                 **(metadata.get("annotations") or {})}
        self.body = {**self.body, "metadata": merged, "spec": {**self.body["spec"], **(patch.get("spec") or {})}}
        return self.body

    async def patch_libvirt_machine_status(self, namespace, name, status):
        self.status_patches.append(status)

    async def reread_libvirt_machine(self, namespace, name):
        return self.body

    async def list_libvirt_machines(self):
        raise AssertionError("a placed or moved machine is never placed again")

    def libvirt_machine_changes(self, since):
        return None  # no change log: whoever counts placements lists the machines


def deps_for(body: dict, domain: machines.DomainInfo | None) -> tuple[machine_reconcile.Dependencies, MemoryHost,
                                                                         list]:
    """The reconcile's dependencies: a fake API holding `body`, the in-memory host kvm1 holding `domain`."""
    host, events = MemoryHost("kvm1"), []
    if domain is not None:
        host.domains[domain.uuid] = Domain(domain.uuid, domain.name, domain.xml, domain.state)
        host.networks["default"].lease(MAC)
    registry = host_api.HostRegistry({"kvm1": "memory:///system"}, factory=MemoryHosts(host))
    inventory = types.SimpleNamespace(registry=registry, hosts={}, state=lambda name: outage.HostState())
    deps = machine_reconcile.Dependencies(kube=FakeKube(body), inventory=inventory,
                                          post_event=lambda body, kind, reason, message: events.append(reason),
                                          now=lambda: "2026-01-01T00:00:00Z")
    return deps, host, events
